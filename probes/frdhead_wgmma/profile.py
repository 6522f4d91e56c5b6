"""Issue 32: FrdHead's launches at B = 65536, once each, for Nsight Compute (the GPU round's
`profile` step with PROFILE_PY set to this file, or ncu_rows.sh): the forward with the loss and
both backward stages at the WGMMA points last tuned (the forward with the loss on the FP16
engine, WGMMA 2) (fixed here: a kernel edit stales the
table, whose defaults are mma.sync), grad_w1 on each engine, and the backward role on its FP16
engine (its row launch, then the two weight gradients). ncu replays every kernel with its
caches flushed, so each launch's time and throughput stand alone: which of a WGMMA stage's
launches (row product, weight gradient, reduce) sets its time."""
import sys

import numpy as np
import pycuda.gpuarray as ga

import pycuda_heads as ph
from pycuda_heads.core import device

B, D, F, H, A = 65536, 128, 128, 5, 21
_G = {"BM": 32, "CHUNK": 256, "WGMMA": 1, "WG": 2}
POINTS = {"forward_loss": {"BM": 32, "CHUNK": 256, "WGMMA": 2, "WG": 2, "CS": 16, "SWZ": 1},
          "grad_w2": {**_G, "CS": 4, "BK": 32, "OCC": 1, "STAGES": 3},
          "grad_w1": {**_G, "CS": 4, "BK": 16, "OCC": 2, "STAGES": 2},
          "backward": {**_G, "WGMMA": 2, "CS": 4, "BK": 32, "OCC": 1, "STAGES": 3}}
GRAD_W1 = {"wgmma": {"BM": 32, "CHUNK": 256, "WGMMA": 1, "WG": 2, "CS": 4, "BK": 16, "OCC": 2,
                     "STAGES": 2},
           "mma_sync": {"BM": 32, "CHUNK": 512, "WGMMA": 0}}


def main() -> int:
    device.cuda()
    rng = np.random.default_rng(0)
    h_t = ga.to_gpu(rng.standard_normal((B, D), dtype=np.float32))
    w1 = ga.to_gpu((rng.standard_normal((F, D)) / np.sqrt(D)).astype(np.float32))
    b1 = ga.to_gpu(rng.standard_normal(F, dtype=np.float32))
    w2 = ga.to_gpu((rng.standard_normal((H, A, F)) / np.sqrt(F)).astype(np.float32))
    b2 = ga.to_gpu(rng.standard_normal((H, A), dtype=np.float32))
    labels = ga.to_gpu(rng.integers(-1, A, size=(B, H)).astype(np.int32))
    head = ph.FrdHead(D, F, H, A, launch=POINTS)
    hidden, _, grad_logits, _ = head.forward_loss(h_t, w1, b1, w2, b2, labels)
    _, _, dhidden = head.grad_w2(hidden, w2, grad_logits)
    print("points", {r: c["params"] for r, c in head.chosen.items()}, flush=True)
    for name, p in GRAD_W1.items():
        ph.FrdHead(D, F, H, A, launch={"grad_w1": p}).grad_w1(h_t, w1, hidden, dhidden)
        print("grad_w1", name, p, flush=True)
    head.backward(h_t, w1, w2, hidden, grad_logits)
    print("backward", POINTS["backward"], flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
