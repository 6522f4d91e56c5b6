"""Where LAYOUT 4's H=32 launches spend their warps' time, by phase (no GPU): reads the SASS
source view that probes/pool_l4_source_profile.sh brought back (source.csv.gz) and splits each
kernel at its barriers (BAR.SYNC), so a phase is the code between two of them. Per phase:
instructions executed (warp level), stall samples, and the reasons with most samples.

    python probes/pool_l4_srcprof.py reports/nvidia-h200/probes/pool_l4_srcprof/source.csv.gz
"""
from __future__ import annotations

import collections
import csv
import gzip
import sys

REASONS = ("stall_barrier", "stall_long_sb", "stall_short_sb", "stall_math", "stall_mio",
           "stall_wait", "stall_lg", "stall_not_selected", "stall_selected", "stall_dispatch",
           "stall_branch_resolving", "stall_no_inst", "stall_drain", "stall_membar")


def kernels(path: str) -> dict[str, list[dict[str, str]]]:
    """Rows of each kernel's source view (a kernel's block starts with "Kernel Name")."""
    out: dict[str, list[dict[str, str]]] = {}
    with gzip.open(path, "rt") as f:
        lines = f.read().splitlines()
    i = 0
    while i < len(lines):
        if lines[i].startswith('"Kernel Name"'):
            name = lines[i].split(",")[1].strip('"')
            header = next(csv.reader([lines[i + 1]]))
            rows, i = [], i + 2
            while i < len(lines) and not lines[i].startswith('"Kernel Name"'):
                rows.append(dict(zip(header, next(csv.reader([lines[i]])))))
                i += 1
            out[name] = rows
        else:
            i += 1
    return out


def phases(rows: list[dict[str, str]]) -> list[dict]:
    """The rows split after each barrier: totals and the stall reasons of each part."""
    parts, cur = [], None
    for r in rows:
        if cur is None:
            cur = {"first": r["Source"].strip(), "n": 0, "executed": 0, "samples": 0,
                   "hmma": 0, "reasons": collections.Counter()}
        op = r["Source"].strip()
        cur["n"] += 1
        cur["executed"] += int(r["Instructions Executed"] or 0)
        cur["samples"] += int(r["Warp Stall Sampling (All Samples)"] or 0)
        cur["hmma"] += int(r["Instructions Executed"] or 0) if "HMMA" in op else 0
        for reason in REASONS:
            cur["reasons"][reason] += int(r.get(reason) or 0)
        if "BAR.SYNC" in op:
            parts.append(cur)
            cur = None
    if cur is not None:
        parts.append(cur)
    return parts


def main(path: str) -> int:
    for name, rows in kernels(path).items():
        parts = phases(rows)
        total = sum(p["samples"] for p in parts) or 1
        executed = sum(p["executed"] for p in parts)
        print(f"{name}: {executed} warp instructions, {total} stall samples")
        for k, p in enumerate(parts):
            top = ", ".join(f"{r[6:]} {100 * v / total:.1f}%"
                            for r, v in p["reasons"].most_common(4) if v)
            print(f"  phase {k}: {p['n']} instructions in the code, {p['executed']} executed "
                  f"({p['hmma']} HMMA), {100 * p['samples'] / total:.1f}% of samples: {top}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
