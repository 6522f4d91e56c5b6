"""Issue 34: would LAYOUT 4 gain from splitting a row over a cluster of blocks? (GPU)

A row split P ways by columns (each block D / P columns of ln, the scores' partial sums
exchanged through distributed shared memory) or by horizons (each block H / P horizons) does
per block what the unsplit LAYOUT 4 does at HIDDEN_DIM D / P (or N_HORIZONS H / P) with P times
the rows. So the layout as it ships, timed at those stand-in shapes over its launches, bounds
what a split can reach before its exchange is written:

    stand-in                          for
    H=32, D=64,  B=1024, K=64         H=32, D=128, B=512 split 2 ways by columns
    H=16, D=128, B=1024, K=64         the same split 2 ways by horizons
    H=8,  D=128, B=4096, K=128        H=8, D=512, B=1024 split 4 ways by columns

(the stand-ins read P times the ln bytes from DRAM where a split reads them from L2, so they
overstate a split's memory time). Every LAYOUT 4 launch with GRID 0, 2 or 3 is timed, forward
and backward (given ctx, as the bench's backward), beside the tuned launch at the shipped shape.

    python probes/pool_l4_parts.py OUT.json
"""
from __future__ import annotations

import json
import os
import sys

import numpy as np

SHAPES = [  # (H, D, B, K, what it stands for)
    (32, 128, 512, 64, "shipped"),
    (32, 64, 1024, 64, "H=32,D=128 split 2 by columns"),
    (16, 128, 1024, 64, "H=32,D=128 split 2 by horizons"),
    (8, 128, 4096, 128, "H=8,D=512 split 4 by columns"),
]
GRIDS = (0, 2, 3)


def main(out: str) -> int:
    import pycuda.gpuarray as ga

    import pycuda_heads as ph
    from pycuda_heads.catalog import catalog
    from pycuda_heads.core.compile import variant_arch
    from pycuda_heads.core.source import render
    from pycuda_heads.ops.pool import BACKWARD_SPACE, FORWARD_SPACE
    from pycuda_heads.perf.timing import gpu_time_us
    from pycuda_heads.tuning.objective import GpuContext, compile_all

    arch = GpuContext.current().arch
    plan = []
    for h, d, b, k, what in SHAPES:
        template, shape = {"N_HORIZONS": h, "HIDDEN_DIM": d}, {"B": b, "K": k}
        for role, space in (("forward", FORWARD_SPACE), ("backward", BACKWARD_SPACE)):
            for p in space.points(template, shape):
                if p["LAYOUT"] == 4 and p["GRID"] in GRIDS:
                    plan.append((h, d, b, k, what, role, p))
    spec = catalog()["pool.forward"]  # one module holds both passes' entries
    failed = compile_all([(render(spec.family, {**{"N_HORIZONS": h, "HIDDEN_DIM": d}, **p},
                                  spec.source_dir),
                           variant_arch(p) or arch) for h, d, _, _, _, _, p in plan],
                         os.cpu_count() or 8)
    print(f"{len(plan)} points, {failed} failed to compile", flush=True)

    rng = np.random.default_rng(0)
    rows = []
    for h, d, b, k, what in SHAPES:
        q, ln, gc = (ga.to_gpu(rng.standard_normal(s, dtype=np.float32))
                     for s in ((h, d), (b, k, d), (b, h, d)))
        shipped = ph.PerHorizonAttentionPool(h, d)
        ctx, attn = shipped.forward(q, ln)
        tuned = {"forward": gpu_time_us(lambda: shipped.forward(q, ln)),
                 "backward": gpu_time_us(lambda: shipped.backward(q, ln, attn, gc, ctx))}
        tuned = {role: t["median_us"] for role, t in tuned.items()}
        chosen = {r: c["params"] for r, c in shipped.chosen.items()}
        for role in ("forward", "backward"):
            best = None
            for hh, dd, bb, kk, _, rr, p in plan:
                if (hh, dd, bb, kk, rr) != (h, d, b, k, role):
                    continue
                pool = ph.PerHorizonAttentionPool(h, d, launch={role: p})
                call = ((lambda: pool.forward(q, ln)) if role == "forward"
                        else (lambda: pool.backward(q, ln, attn, gc, ctx)))
                try:
                    us = gpu_time_us(call)["median_us"]
                except Exception as exc:  # recorded, the sweep goes on
                    rows.append({"H": h, "D": d, "B": b, "K": k, "role": role, "params": p,
                                 "error": f"{type(exc).__name__}: {exc}"[:300]})
                    continue
                rows.append({"H": h, "D": d, "B": b, "K": k, "role": role, "params": p, "us": us})
                if best is None or us < best[0]:
                    best = (us, p)
            print(f"H={h} D={d} B={b} K={k} ({what}) {role}: tuned {tuned[role]:.2f} us "
                  f"({chosen.get(role)}), best LAYOUT 4 "
                  + (f"{best[0]:.2f} us {best[1]}" if best else "none"), flush=True)
            rows.append({"H": h, "D": d, "B": b, "K": k, "role": role, "what": what,
                         "tuned_us": tuned[role], "tuned_params": chosen.get(role),
                         "best_us": best and best[0], "best_params": best and best[1]})
    with open(out, "w") as f:
        json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
