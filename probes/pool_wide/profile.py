"""The fifth version (wide.cu's wide_forward_whole, wide_backward_whole) at H=32, D=128,
B=512, K=64, once per launch, for Nsight Compute: where a row's time goes (the B=3 rows of
run.py take about 10 us each, far above their products' issue time). Run as the GPU round's
`profile` step with PROFILE_PY=probes/pool_wide/profile.py."""
import sys

import numpy as np
import pycuda.gpuarray as ga

from pycuda_heads.core import device
from run import SIZES, Variants

H, D, B, K = 32, 128, 512, 64
# (WARPS, SNS, GN, QG): run.py's best point at 0a0d290, then with q and G through L1
POINTS = ((8, 1, 4, 0), (8, 1, 4, 1))


def main() -> int:
    drv = device.cuda()  # the primary context current, before any allocation
    rng = np.random.default_rng(0)
    q, ln, attn, g, ctx = (ga.to_gpu(rng.standard_normal(shape, dtype=np.float32))
                           for shape in ((H, D), (B, K, D), (B, H, K), (B, H, D), (B, H, D)))
    o_ctx, o_attn = ga.empty((B, H, D), np.float32), ga.empty((B, H, K), np.float32)
    o_gln, scratch = ga.empty((B, K, D), np.float32), ga.empty((B, H * D), np.float32)
    scale = np.float32(1 / np.sqrt(D))
    variants = Variants()
    for warps, sns, gn, qg in POINTS:
        sizes = {"N_HORIZONS": H, "HIDDEN_DIM": D, "WARPS": warps, "KMAX": K, "SNS": sns,
                 "GN": gn, "QG": qg}
        for entry, floats, args in (
                ("wide_forward_whole", "WHOLE_FLOATS", (q, ln, o_ctx, o_attn)),
                ("wide_backward_whole", "WHOLE_BWD_FLOATS", (q, ln, attn, g, ctx, o_gln, scratch))):
            fn = variants.get(entry, WHOLE=1, **sizes)
            shared = 4 * SIZES.value(floats, sizes)
            fn.set_attribute(drv.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, shared)
            fn(*(a.gpudata for a in args), np.int32(B), np.int32(K), scale, grid=(B, 1, 1),
               block=(32 * warps, 1, 1), shared=shared)
            print(entry, sizes, "registers", fn.num_regs, "shared", shared, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
