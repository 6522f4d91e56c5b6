"""Issue 34 probe: the pool's backward at H=2, D=1024 (B=256, K=64: 53% of its floor, the
tuned backward on LAYOUT 1 at 65 us against a 33 us floor) on LAYOUT 2, which reads ln once
through its ring. The space keeps LAYOUT 2's backward to per-lane rows of at most 168
registers (ops/pool.py: the budget of MIN_BLOCKS 3), which H=2, D=1024 outgrows; with no
minimum of blocks ptxas may take 255, and the rows of GROUP 32, GROUP_KEYS 1 (226 by the
space's count) compile at 254 registers with no spill (nvcc 13, sm_90). This probe lifts the
budget to 226 where MIN_BLOCKS is 0 and times such points through the op against the tuned
launch, each checked against float64 by the validation's tolerance first. If one wins, the
budget goes into the space and the shape is tuned again.

    source .gpu/env.sh && python probes/pool_wide_backward.py $OUT/pool_wide_backward.json
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pycuda.gpuarray as ga

from pycuda_heads import reference as ref
from pycuda_heads.core import device
from pycuda_heads.ops import pool as pool_module
from pycuda_heads.perf.bench import CudaHarness
from pycuda_heads.perf.timing import gpu_time_us
from pycuda_heads.records import git_state
from pycuda_heads.verify.checks import compare

H, D, B, K = 2, 1024, 256, 64
BUDGET = "<= 168"
WIDER = "<= (226 if MIN_BLOCKS == 0 else 168)"
# LAYOUT 2 points (the rest from the space's nearest valid point): warps a row (BLOCK / 32 /
# TEAMS), ring depth, grid
POINTS = [{"LAYOUT": 2, "GROUP": 32, "GROUP_KEYS": 1, "MIN_BLOCKS": 0, "BLOCK": block,
           "TEAMS": teams, "STAGES": stages, "GRID": 0}
          for block, teams in ((128, 1), (128, 2), (128, 4), (256, 1), (256, 2))
          for stages in (3, 4, 6)]


def widen() -> None:
    """The backward space's LAYOUT 2 register rule with the 255-register budget of MIN_BLOCKS 0."""
    space = pool_module.BACKWARD_SPACE
    rules = tuple(r.replace(BUDGET, WIDER) if r.startswith("LAYOUT != 2 or (2 * N_HORIZONS")
                  else r for r in space.restrictions)
    assert rules != space.restrictions, "the LAYOUT 2 register rule was not found"
    object.__setattr__(space, "restrictions", rules)


def main(out: str) -> None:
    device.cuda()
    widen()
    bandwidth = CudaHarness().copy_bandwidth_gbps()
    rng = np.random.default_rng(0)
    q = rng.standard_normal((H, D), dtype=np.float32)
    ln = rng.standard_normal((B, K, D), dtype=np.float32)
    gc = rng.standard_normal((B, H, D), dtype=np.float32)
    ctx64, attn64 = ref.pool_forward(q, ln)
    attn = attn64.astype(np.float32)
    ctx = ctx64.astype(np.float32)
    want = ref.pool_backward(q, ln, attn, gc)
    want32 = ref.pool_backward(q, ln, attn, gc, dtype=np.float32)
    d_q, d_ln, d_attn, d_gc, d_ctx = map(ga.to_gpu, (q, ln, attn, gc, ctx))
    floor = 4 * (2 * B * K * D + B * H * K + 2 * B * H * D) / bandwidth / 1e3
    record = {"what": __doc__.split("\n")[0], "commit": git_state()["describe"],
              "gpu": device.gpu_name(), "copy_bandwidth_GBps": round(bandwidth, 1),
              "shape": {"N_HORIZONS": H, "HIDDEN_DIM": D, "B": B, "K": K},
              "floor_us": round(floor, 2), "points": []}
    for launch in [None, *POINTS]:
        point = {"launch": launch}
        try:
            op = pool_module.PerHorizonAttentionPool(
                H, D, launch=None if launch is None else {"backward": launch})
            gq, gln = op.backward(d_q, d_ln, d_attn, d_gc, d_ctx)
            again = op.backward(d_q, d_ln, d_attn, d_gc, d_ctx)
            checks = {n: compare(g.get(), w, w32) for n, g, w, w32 in
                      zip(("grad_q_h", "grad_ln"), (gq, gln), want, want32)}
            point.update(params=op.chosen["backward"]["params"], checks=checks,
                         passed=all(c["passed"] for c in checks.values()),
                         rerun_bitwise=again[1].get().tobytes() == gln.get().tobytes())
            if point["passed"]:
                point["backward_us"] = round(gpu_time_us(
                    lambda: op.backward(d_q, d_ln, d_attn, d_gc, d_ctx))["median_us"], 2)
        except Exception as exc:  # a point that cannot run is data too
            point["error"] = f"{type(exc).__name__}: {exc}"
        record["points"].append(point)
        print(json.dumps({k: v for k, v in point.items() if k != "checks"}), flush=True)
        Path(out).write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main(sys.argv[1])
