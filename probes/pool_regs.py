"""Registers, spills and stack frame of the pool's shipped launches at a shape (no GPU): the
static check (nvcc + ptxas -v) of each role's point, with changes given as ROLE=JSON on the
command line. For a kernel-source edit before any GPU round.

    python probes/pool_regs.py 8,512,1024,128 [ROLE='{"BLOCK": 512, ...}' ...]
"""
from __future__ import annotations

import json
import sys

from pool_shipped import shipped  # probes/ is this script's folder
from pycuda_heads.catalog import catalog
from pycuda_heads.verify.static_check import check_kernel


def main(shape: str, overrides: list[str]) -> None:
    h, d, b, k = (int(x) for x in shape.split(","))
    points = shipped(h, d, b, k)
    for o in overrides:
        role, _, js = o.partition("=")
        points[role] = {**points[role], **json.loads(js)}
    for role, params in sorted(points.items()):
        spec = catalog()[f"pool.{role}"]
        report = check_kernel(spec, params, template={"N_HORIZONS": h, "HIDDEN_DIM": d})
        for entry, r in report.entries.items():
            print(f"{role} {entry}: {r.registers} registers, {r.spill_store_bytes} B spill "
                  f"stores, {r.spill_load_bytes} B spill loads, stack {r.stack_bytes}; {params}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
