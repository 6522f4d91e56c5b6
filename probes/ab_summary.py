"""Summary of ``ab_host_cost.sh``'s output: each case's host cost (the bench's python_call_us
and bare_launch_us of the tuned provider) in this tree against the base commit, per round,
and the ratio head / base of python_call_us over bare_launch_us (which takes out the machine's
own speed). Writes JSON.

    python probes/ab_summary.py AB_DIR BASE_COMMIT HEAD_COMMIT OUT.json
"""
from __future__ import annotations

import csv
import json
import statistics
import sys
from pathlib import Path


def rows(folder: Path) -> dict[tuple[str, str, str], dict[str, float]]:
    out = {}
    for path in folder.glob("*/bench.csv"):
        for r in csv.DictReader(path.open()):
            if r["provider"] == "tuned" and r["python_call_us"]:
                out[(r["op"], r["shape"], r["pass"])] = {
                    "python_call_us": float(r["python_call_us"]),
                    "bare_launch_us": float(r["bare_launch_us"] or "nan")}
    return out


def main(ab: str, base: str, head: str, out: str) -> None:
    root = Path(ab)
    rounds = sorted(p.name[4:] for p in root.glob("base*"))
    cases = []
    for rnd in rounds:
        b, h = rows(root / f"base{rnd}"), rows(root / f"head{rnd}")
        for key in sorted(b.keys() & h.keys()):
            hb, bb = h[key], b[key]
            cases.append({"round": rnd, "op": key[0], "shape": key[1], "pass": key[2],
                          "base_python_call_us": bb["python_call_us"],
                          "head_python_call_us": hb["python_call_us"],
                          "base_bare_launch_us": bb["bare_launch_us"],
                          "head_bare_launch_us": hb["bare_launch_us"],
                          "head_over_base": round(hb["python_call_us"] / bb["python_call_us"], 3),
                          "head_over_base_per_bare": round(
                              (hb["python_call_us"] / hb["bare_launch_us"])
                              / (bb["python_call_us"] / bb["bare_launch_us"]), 3)})
    ratios = [c["head_over_base"] for c in cases]
    record = {"what": __doc__.split("\n")[0], "base": base, "head": head, "rounds": rounds,
              "median_head_over_base": statistics.median(ratios) if ratios else None,
              "max_head_over_base": max(ratios) if ratios else None, "cases": cases}
    Path(out).write_text(json.dumps(record, indent=1) + "\n")
    print(json.dumps({k: v for k, v in record.items() if k != "cases"}, indent=1))


if __name__ == "__main__":
    main(*sys.argv[1:5])
