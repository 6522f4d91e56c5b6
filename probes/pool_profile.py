"""The pool's tuned launches at the suite shapes still short of the issue's bars, once each, for
Nsight Compute (GPU): forward and backward (given ctx) per shape, every kernel they launch
(joins and reduce included), the launches given explicitly, so that a patched tree runs them
too. ncu replays each kernel with its caches flushed, so no warm-up is needed. Run it as the
GPU round's `profile` step does:

    ncu --clock-control none --section SpeedOfLight --section Occupancy --section LaunchStats \
        --section WarpStateStats --section MemoryWorkloadAnalysis --csv \
        python probes/pool_profile.py > pool_profile.csv

What it answers: each kernel's share of memory and SM throughput, its occupancy and registers,
and where its warps stall. The printed lines name the launch parameters per shape. Arguments
H,D,B,K profile those shapes instead of the list below."""
import sys

import numpy as np
import pycuda.gpuarray as ga

import pycuda_heads as ph
from pool_shipped import shipped  # probes/ is this script's folder

# (N_HORIZONS, HIDDEN_DIM, B, K) of the pool suite below 75% of the floor (H=32: 3x compile)
SHAPES = [(32, 128, 512, 64), (8, 512, 1024, 128), (2, 1024, 256, 64), (5, 128, 1024, 128),
          (5, 128, 64, 4096)]


def main() -> int:
    rng = np.random.default_rng(0)
    shapes = [tuple(int(v) for v in a.split(",")) for a in sys.argv[1:]] or SHAPES
    for h, d, b, k in shapes:
        pool = ph.PerHorizonAttentionPool(h, d, launch=shipped(h, d, b, k))
        q, ln, gc = (ga.to_gpu(rng.standard_normal(shape, dtype=np.float32))
                     for shape in ((h, d), (b, k, d), (b, h, d)))
        ctx, attn = pool.forward(q, ln)
        pool.backward(q, ln, attn, gc, ctx)
        print("shape", h, d, b, k, {r: c["params"] for r, c in pool.chosen.items()}, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
