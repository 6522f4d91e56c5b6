"""Split-K pool by virtual rows (virtual.cu): the library's tuned pool on ln viewed as
[B*S, K/S, D] (each split its own row and softmax), then a combine that rescales each split by
its log-sum-exp; the backward runs the library's backward on the same virtual rows with the
combined attn and ctx. Against the float64 reference, the library as it is and the memory
floor, at long-sequence shapes. Without grad_attn only (with it, each split would need the
sum of attn * grad_attn over all splits in its correction). Not shipped: it says whether the
ring layouts' body, split this way, reaches the floor that the prototype in splitk.cu did not.

    source .gpu/env.sh && python probes/pool_splitk/virtual.py OUT.json
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from pycuda_heads.core import device
from pycuda_heads.core.arrays import empty
from pycuda_heads.ops.pool import PerHorizonAttentionPool
from pycuda_heads.perf.bench import CudaHarness
from pycuda_heads.perf.timing import gpu_time_us
from pycuda_heads.records import git_state
from run import D, H, reference, rel_err

HERE = Path(__file__).resolve().parent
#: (B, K) and the splits tried there (K/S keys a virtual row)
CASES = (((64, 4096), (8, 16, 32, 64)), ((16, 16384), (32, 64, 128)),
         ((2, 65536), (64, 128, 256)))


class Virtual:
    """The library's pool on virtual rows plus virtual.cu's combine and replicate."""

    def __init__(self):
        from pycuda.compiler import SourceModule
        with device.thread_context():
            mod = SourceModule((HERE / "virtual.cu").read_text(), no_extern_c=True,
                               arch="sm_90", options=[f"-DN_HORIZONS={H}", f"-DHIDDEN_DIM={D}"])
        self.combine = mod.get_function("virtual_combine")
        self.replicate = mod.get_function("virtual_replicate")
        self.pool = PerHorizonAttentionPool(H, D)

    def forward(self, q_h, ln, split):
        b, k, _ = ln.shape
        ctx_v, attn_v = self.pool.forward(q_h, ln.reshape(b * split, k // split, D))
        ctx, attn = empty((b, H, D)), empty((b, H, k))
        attn_gv, ctx_rep = empty((b * split, H, k // split)), empty((b * split, H, D))
        self.combine(q_h.gpudata, ln.gpudata, ctx_v.gpudata, attn_v.gpudata, ctx.gpudata,
                     attn.gpudata, attn_gv.gpudata, ctx_rep.gpudata, np.int32(split),
                     np.int32(k // split), np.float32(1 / np.sqrt(D)),
                     grid=(H, b, 1), block=(256, 1, 1))
        return ctx, attn, attn_gv, ctx_rep

    def backward(self, q_h, ln, attn_gv, grad_ctx, ctx_rep, split):
        b, k, _ = ln.shape
        grad_rep = empty((b * split, H, D))
        self.replicate(grad_ctx.gpudata, grad_rep.gpudata, np.int32(split),
                       grid=(split, b, 1), block=(256, 1, 1))
        grad_q, grad_ln = self.pool.backward(q_h, ln.reshape(b * split, k // split, D),
                                             attn_gv, grad_rep, ctx_rep)
        return grad_q, grad_ln.reshape(b, k, D)


def main(out: str) -> None:
    import pycuda.gpuarray as ga
    bandwidth = CudaHarness().copy_bandwidth_gbps()
    virtual = Virtual()
    rng = np.random.default_rng(0)
    record = {"what": __doc__.split("\n")[0], "commit": git_state()["describe"],
              "gpu": device.gpu_name(), "copy_bandwidth_GBps": round(bandwidth, 1), "shapes": []}
    for (b, k), splits in CASES:
        q_h = rng.standard_normal((H, D)).astype(np.float32)
        ln = rng.standard_normal((b, k, D)).astype(np.float32)
        grad_ctx = rng.standard_normal((b, H, D)).astype(np.float32)
        want = reference(q_h, ln, grad_ctx, None)
        d_q, d_ln, d_g = map(ga.to_gpu, (q_h, ln, grad_ctx))
        fwd_bytes = 4 * (b * k * D + b * H * k + b * H * D)
        bwd_bytes = 4 * (2 * b * k * D + b * H * k + 2 * b * H * D)
        lctx, lattn = virtual.pool.forward(d_q, d_ln)
        entry = {"B": b, "K": k, "floor_us": {"forward": fwd_bytes / bandwidth / 1e3,
                                              "backward": bwd_bytes / bandwidth / 1e3},
                 "library_us": {
                     "forward": gpu_time_us(lambda: virtual.pool.forward(d_q, d_ln))["median_us"],
                     "backward": gpu_time_us(lambda: virtual.pool.backward(
                         d_q, d_ln, lattn, d_g, lctx))["median_us"]},
                 "library_errors": {"ctx": rel_err(lctx.get(), want[0]),
                                    "attn": rel_err(lattn.get(), want[1])},
                 "points": []}
        for split in splits:
            ctx, attn, attn_gv, ctx_rep = virtual.forward(d_q, d_ln, split)
            gq, gln = virtual.backward(d_q, d_ln, attn_gv, d_g, ctx_rep, split)
            again = virtual.forward(d_q, d_ln, split)
            point = {"SPLIT": split, "errors": {
                "ctx": rel_err(ctx.get(), want[0]), "attn": rel_err(attn.get(), want[1]),
                "grad_q_h": rel_err(gq.get(), want[2]), "grad_ln": rel_err(gln.get(), want[3])},
                "rerun_bitwise": bool((again[0].get() == ctx.get()).all()
                                      and (again[1].get() == attn.get()).all()),
                "forward_us": gpu_time_us(lambda: virtual.forward(d_q, d_ln, split))["median_us"],
                "backward_us": gpu_time_us(lambda: virtual.backward(
                    d_q, d_ln, attn_gv, d_g, ctx_rep, split))["median_us"]}
            entry["points"].append(point)
            print(b, k, split, round(point["forward_us"], 1), round(point["backward_us"], 1),
                  "floor", round(sum(entry["floor_us"].values()), 1),
                  "err %.2e" % max(point["errors"].values()), flush=True)
        record["shapes"].append(entry)
        Path(out).write_text(json.dumps(record, indent=1))  # after each shape: a cut run keeps it


if __name__ == "__main__":
    main(sys.argv[1])
