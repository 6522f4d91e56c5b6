"""Issue 32 (no GPU): the stall samples ncu_rows.sh brought back, per kernel: its samples by
reason and the instructions with most samples, and from details.csv each launch's time, DRAM
throughput and tensor-pipe activity.

    python probes/frdhead_wgmma/ncu_top.py DIR > reports/nvidia-h200/probes/NAME.txt
"""
from __future__ import annotations

import csv
import sys
from collections import Counter
from pathlib import Path

DETAILS = ("Duration", "DRAM Throughput", "Compute (SM) Throughput", "Registers Per Thread",
           "Achieved Active Warps Per SM", "Issue Slots Busy",
           "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed")


def top(path: Path, n: int = 12) -> list[str]:
    rows = list(csv.reader(path.open()))
    if len(rows) < 3:
        return [f"{path.name}: empty"]
    hdr = rows[1]
    col = {h: i for i, h in enumerate(hdr)}
    reasons = [h for h in hdr if h.startswith("stall_") and "(" not in h]
    # every launch of the kernel (a header line starts each), merged by instruction row
    body = [r for r in rows[2:] if len(r) == len(hdr)
            and r[col["Warp Stall Sampling (All Samples)"]].isdigit()]

    def samples(r: list[str]) -> int:
        return int(r[col["Warp Stall Sampling (All Samples)"]])
    total = sum(samples(r) for r in body) or 1
    by_reason = Counter()
    for r in body:
        for h in reasons:
            by_reason[h[6:]] += int(r[col[h]] or 0)
    out = [f"== {rows[0][1]} samples {total} "
           + str([(round(v / total, 2), k) for k, v in by_reason.most_common(8)])]
    for r in sorted(body, key=samples, reverse=True)[:n]:
        why = Counter({h[6:]: int(r[col[h]] or 0) for h in reasons}).most_common(2)
        out.append(f"  {samples(r) / total:.3f} {r[col['Source']][:70]} {why}")
    return out


def details(path: Path) -> list[str]:
    rows = list(csv.DictReader(path.open()))
    seen: dict[tuple, dict] = {}
    for r in rows:
        key = (r["ID"], r["Kernel Name"])
        if r["Metric Name"] in DETAILS:
            seen.setdefault(key, {})[r["Metric Name"]] = f"{r['Metric Value']} {r['Metric Unit']}"
    return [f"{name}: " + "; ".join(f"{k.split('.')[0]} {v}" for k, v in m.items())
            for (_, name), m in seen.items()]


def main(folder: str) -> None:
    root = Path(folder)
    print(*details(root / "details.csv"), sep="\n")
    for path in sorted(root.glob("source_*.csv")):
        print(*top(path), sep="\n")


if __name__ == "__main__":
    main(sys.argv[1])
