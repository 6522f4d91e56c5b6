"""Split-K pool prototype (splitk.cu) against the float64 reference and the library's tuned pool
at long-sequence shapes: max relative error (forward ctx, attn; backward grad_q_h, grad_ln, with
and without grad_attn), bitwise reruns, and GPU time per pass beside the library's and the
memory floor (bytes that must move / device copy bandwidth, measured here). Not shipped: the
numbers say whether the layout is worth building into cu/pool.cu (issue: long sequences).

    source .gpu/env.sh && python probes/pool_splitk/run.py OUT.json
"""
from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path

import numpy as np

from pycuda_heads import reference as ref
from pycuda_heads.core import device
from pycuda_heads.core.arrays import empty
from pycuda_heads.ops.pool import PerHorizonAttentionPool
from pycuda_heads.ops.reduce import reducer
from pycuda_heads.perf.bench import CudaHarness
from pycuda_heads.perf.timing import gpu_time_us
from pycuda_heads.records import git_state

HERE = Path(__file__).resolve().parent
CU = HERE.parents[1] / "cu"
H, D = 5, 128
#: (B, K): the suite's long shape, longer ones, and uneven splits for correctness
SHAPES = ((64, 4096), (16, 16384), (2, 65536), (3, 1000))
#: launch points tried at each shape: BLOCK, UNROLL, SPLIT
POINTS = tuple(itertools.product((128, 256), (2, 4), (4, 8, 16, 32)))


def reference(q_h, ln, grad_ctx, grad_attn):
    """The pool's math in float64 (the package's reference): ctx, attn, grad_q_h, grad_ln."""
    ctx, attn = ref.pool_forward(q_h, ln)
    return (ctx, attn, *ref.pool_backward(q_h, ln, attn, grad_ctx, grad_attn=grad_attn))


def rel_err(got, want) -> float:
    return float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))


class SplitK:
    """The prototype's four kernels at one (BLOCK, UNROLL), run as the forward and backward."""

    def __init__(self, block: int, unroll: int):
        from pycuda.compiler import SourceModule
        defines = {"N_HORIZONS": H, "HIDDEN_DIM": D, "BLOCK": block, "VEC": 4, "UNROLL": unroll}
        with device.thread_context():
            mod = SourceModule((HERE / "splitk.cu").read_text(), no_extern_c=True,
                               include_dirs=[str(CU)], arch="sm_90",
                               options=[f"-D{k}={v}" for k, v in defines.items()])
        self.fns = {n: mod.get_function(n) for n in (
            "pool_forward_split", "pool_forward_combine", "pool_backward_c",
            "pool_backward_split")}
        self.block = block

    def forward(self, q_h, ln, split):
        b, k, _ = ln.shape  # buffers from the library's pool: no cuMemFree syncs in timing
        attn, ctx = empty((b, H, k)), empty((b, H, D))
        acc, ml = empty((b * split, H, D)), empty((b * split, H, 2))
        grid, block = (split, b, 1), (self.block, 1, 1)
        self.fns["pool_forward_split"](q_h.gpudata, ln.gpudata, attn.gpudata, acc.gpudata,
                                       ml.gpudata, np.int32(k), np.float32(1 / np.sqrt(D)),
                                       grid=grid, block=block)
        self.fns["pool_forward_combine"](acc.gpudata, ml.gpudata, ctx.gpudata, attn.gpudata,
                                         np.int32(k), grid=grid, block=block)
        return ctx, attn

    def backward(self, q_h, ln, attn, grad_ctx, ctx, grad_attn, split):
        b, k, _ = ln.shape
        c, grad_ln, scratch = empty((b, H)), empty(tuple(ln.shape)), empty((b * split, H, D))
        ga_ptr = np.intp(0) if grad_attn is None else grad_attn.gpudata
        self.fns["pool_backward_c"](grad_ctx.gpudata, ctx.gpudata, attn.gpudata, ga_ptr,
                                    c.gpudata, np.int32(k), grid=(b, 1, 1), block=(32 * H, 1, 1))
        self.fns["pool_backward_split"](q_h.gpudata, ln.gpudata, attn.gpudata, grad_ctx.gpudata,
                                        ga_ptr, c.gpudata, grad_ln.gpudata, scratch.gpudata,
                                        np.int32(k), np.float32(1 / np.sqrt(D)),
                                        grid=(split, b, 1), block=(self.block, 1, 1))
        grad_q = reducer().sum_rows(scratch, b * split, H * D, shape=(H, D))
        return grad_q, grad_ln


def main(out: str) -> None:
    import pycuda.gpuarray as ga
    harness = CudaHarness()
    bandwidth = harness.copy_bandwidth_gbps()
    library = PerHorizonAttentionPool(H, D)
    kernels = {(blk, unr): SplitK(blk, unr) for blk, unr, _ in POINTS}
    rng = np.random.default_rng(0)
    record = {"what": __doc__.split("\n")[0], "commit": git_state()["describe"],
              "gpu": device.gpu_name(), "copy_bandwidth_GBps": round(bandwidth, 1), "shapes": []}
    for b, k in SHAPES:
        q_h = rng.standard_normal((H, D)).astype(np.float32)
        ln = rng.standard_normal((b, k, D)).astype(np.float32)
        grad_ctx = rng.standard_normal((b, H, D)).astype(np.float32)
        grad_attn = rng.standard_normal((b, H, k)).astype(np.float32)
        want = reference(q_h, ln, grad_ctx, None)
        want_ga = reference(q_h, ln, grad_ctx, grad_attn)
        d_q, d_ln, d_g, d_ga = map(ga.to_gpu, (q_h, ln, grad_ctx, grad_attn))
        fwd_bytes = 4 * (b * k * D + b * H * k + b * H * D)
        bwd_bytes = 4 * (2 * b * k * D + b * H * k + 2 * b * H * D)  # ln in, grad_ln out, attn in
        entry = {"B": b, "K": k,
                 "floor_us": {"forward": fwd_bytes / bandwidth / 1e3,
                              "backward": bwd_bytes / bandwidth / 1e3}, "points": []}
        lctx, lattn = library.forward(d_q, d_ln)
        entry["library_us"] = {
            "forward": gpu_time_us(lambda: library.forward(d_q, d_ln))["median_us"],
            "backward": gpu_time_us(lambda: library.backward(
                d_q, d_ln, lattn, d_g, lctx))["median_us"]}
        for blk, unr, split in POINTS:
            if split > k:
                continue
            sk = kernels[(blk, unr)]
            ctx, attn = sk.forward(d_q, d_ln, split)
            gq, gln = sk.backward(d_q, d_ln, attn, d_g, ctx, None, split)
            gq2, gln2 = sk.backward(d_q, d_ln, attn, d_g, ctx, d_ga, split)
            again = sk.forward(d_q, d_ln, split)
            point = {"BLOCK": blk, "UNROLL": unr, "SPLIT": split, "errors": {
                "ctx": rel_err(ctx.get(), want[0]), "attn": rel_err(attn.get(), want[1]),
                "grad_q_h": rel_err(gq.get(), want[2]), "grad_ln": rel_err(gln.get(), want[3]),
                "grad_q_h, grad_attn": rel_err(gq2.get(), want_ga[2]),
                "grad_ln, grad_attn": rel_err(gln2.get(), want_ga[3])},
                "rerun_bitwise": bool((again[0].get() == ctx.get()).all()
                                      and (again[1].get() == attn.get()).all()),
                "forward_us": gpu_time_us(lambda: sk.forward(d_q, d_ln, split))["median_us"],
                "backward_us": gpu_time_us(lambda: sk.backward(
                    d_q, d_ln, attn, d_g, ctx, None, split))["median_us"]}
            entry["points"].append(point)
            print(b, k, blk, unr, split, point["forward_us"], point["backward_us"],
                  max(point["errors"].values()), flush=True)
        record["shapes"].append(entry)
        Path(out).write_text(json.dumps(record, indent=1))  # after each shape: a cut run keeps it


if __name__ == "__main__":
    main(sys.argv[1])
