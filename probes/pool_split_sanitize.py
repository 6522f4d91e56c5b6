"""The pool's split-K path under compute-sanitizer (GPU): forward and backward (with and without
grad_attn) at split shapes, through each layout the shape admits and the tuned launch. The
validation sanitizes each variant at its smallest shape, where no row splits; this covers the
joins (pool_split.cuh) and the layouts on virtual rows. Run it as

    compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 86 \
        python probes/pool_split_sanitize.py

(and --tool racecheck, initcheck, synccheck); it exits 0 when every output is finite."""
import sys

import numpy as np

import pycuda_heads as ph
from pycuda_heads.ops.pool import split_count

# (N_HORIZONS, HIDDEN_DIM, B, K, launch): 16 splits of 256 keys, and of 375 (not a multiple
# of 4); LAYOUT 3 needs N_HORIZONS % 4 == 0
CASES = [(5, 128, 2, 4096, None), (5, 128, 2, 4096, {"LAYOUT": 0}),
         (5, 128, 2, 4096, {"LAYOUT": 1}), (5, 128, 2, 4096, {"LAYOUT": 2, "TEAMS": 2}),
         (4, 128, 2, 4096, {"LAYOUT": 3}), (3, 96, 1, 6000, None)]


def main() -> int:
    rng = np.random.default_rng(0)
    ok = True
    for h, d, b, k, launch in CASES:
        assert split_count(b, k) > 1
        pool = ph.PerHorizonAttentionPool(h, d, launch=launch and {"forward": launch,
                                                                   "backward": launch})
        q = rng.standard_normal((h, d), dtype=np.float32)
        ln = rng.standard_normal((b, k, d), dtype=np.float32)
        gc = rng.standard_normal((b, h, d), dtype=np.float32)
        ga = rng.standard_normal((b, h, k), dtype=np.float32)
        ctx, attn = pool.forward(q, ln)
        outs = [ctx, attn, *pool.backward(q, ln, attn, gc, ctx),
                *pool.backward(q, ln, attn, gc, ctx, grad_attn=ga)]
        finite = all(np.isfinite(o.get()).all() for o in outs)
        ok &= finite
        print(h, d, b, k, launch, pool.chosen["forward"]["params"]["LAYOUT"],
              pool.chosen["backward"]["params"]["LAYOUT"], "finite" if finite else "NOT FINITE")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
