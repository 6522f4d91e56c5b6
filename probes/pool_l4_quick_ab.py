"""Issue 34: LAYOUT 4's H=32 passes at their shipped launches, timed once with the tree as it
is (GPU), for a quick look at pending patch sets before their tuned A/B (`QUICK=1 bash
probes/pool_l4_ab.sh OUT SET...` applies each set and runs this). The launches are the
table's entries, given explicitly: a patched tree's entries are for other sources, which the
op would not apply. Prints one line. Another shape's tuned launches (LAYOUT 5's at H=8, D=512)
as H,D,B,K after the label.

    python probes/pool_l4_quick_ab.py LABEL [H,D,B,K]
"""
import sys

import numpy as np
import pycuda.gpuarray as ga
from pool_shipped import shipped  # probes/ is this script's folder

import pycuda_heads as ph
from pycuda_heads.core import device
from pycuda_heads.perf.timing import gpu_time_us

H, D, B, K = map(int, sys.argv[2].split(",")) if len(sys.argv) > 2 else (32, 128, 512, 64)
LAUNCH = shipped(H, D, B, K)

device.cuda()  # the context, before the first allocation (the op makes it on construction)
rng = np.random.default_rng(0)
q, ln, gc = (ga.to_gpu(rng.standard_normal(s, dtype=np.float32))
             for s in ((H, D), (B, K, D), (B, H, D)))
pool = ph.PerHorizonAttentionPool(H, D, launch=LAUNCH)
ctx, attn = pool.forward(q, ln)
fwd = gpu_time_us(lambda: pool.forward(q, ln), reps=15)["median_us"]
bwd = gpu_time_us(lambda: pool.backward(q, ln, attn, gc, ctx), reps=15)["median_us"]
print(f"{sys.argv[1] or 'main'}: forward {fwd:.2f} us, backward {bwd:.2f} us, "
      f"sum {fwd + bwd:.2f}", flush=True)
