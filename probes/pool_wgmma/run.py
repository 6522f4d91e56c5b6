"""Issue 34 probe: the pool's passes at H=32, D=128 on wgmma (fwd.cu, bwd.cu) against float64
and the library's shipped launches (LAYOUT 4), at B = 512, K = 64 (the suite's shape) and
B = 333, K = 50 (a short row, checked only). Each variant is checked before it is timed: outputs
poisoned with NaN, every element written, each output within the library's validation
tolerance (``verify.checks.compare``), bitwise reruns. The backward's time includes the
library's reduce_axis0 of its scratch rows, as the library's own backward does. Each variant
runs in a process of its own, so one that faults does not take the others with it. Prints a
line a variant; the record into $1. Variants: fwd:WG:NBUF:CS, bwd:WG:CS.

    source .gpu/env.sh && python probes/pool_wgmma/run.py $OUT/pool_wgmma.json fwd:2:2:4 bwd:2:4
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pycuda.gpuarray as ga

import pycuda_heads as ph
from pycuda_heads.core import device
from pycuda_heads.core.source import cu_dir
from pycuda_heads.perf.timing import gpu_time_us
from pycuda_heads.records import git_state
from pycuda_heads.verify.checks import compare

HERE = Path(__file__).resolve().parent
H, D, KP = 32, 128, 64
SHAPES = ((512, 64), (333, 50))  # (B, K): the first is timed


def inputs(b: int, k: int) -> tuple:
    rng = np.random.default_rng(b * 1000 + k)
    q = rng.standard_normal((H, D)).astype(np.float32)
    ln = rng.standard_normal((b, k, D)).astype(np.float32)
    return q, ln


def reference(q: np.ndarray, ln: np.ndarray, dtype: type) -> tuple[np.ndarray, np.ndarray]:
    q, ln = q.astype(dtype), ln.astype(dtype)
    s = np.einsum("hd,bkd->bhk", q, ln) / dtype(np.sqrt(D))
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    p /= p.sum(axis=-1, keepdims=True)
    return np.einsum("bhk,bkd->bhd", p, ln), p


def reference_backward(q: np.ndarray, ln: np.ndarray, attn: np.ndarray, gc: np.ndarray,
                       dtype: type) -> tuple[np.ndarray, np.ndarray]:
    """grad_q_h and grad_ln, as ops.pool.torch_backward."""
    q, ln, attn, gc = (x.astype(dtype) for x in (q, ln, attn, gc))
    scale = dtype(1 / np.sqrt(D))
    dw = np.einsum("bhd,bkd->bhk", gc, ln)
    ds = attn * (dw - (attn * dw).sum(axis=-1, keepdims=True))
    return (scale * np.einsum("bhk,bkd->hd", ds, ln),
            np.einsum("bhk,bhd->bkd", attn, gc) + scale * np.einsum("bhk,hd->bkd", ds, q))


def build(source: str, entry: str, defines: dict, shared: int):
    from pycuda.compiler import SourceModule
    with device.thread_context():
        mod = SourceModule((HERE / source).read_text(), no_extern_c=True, arch="sm_90a",
                           include_dirs=[str(cu_dir()), str(HERE)],
                           options=["-O3", *(f"-D{k}={v}" for k, v in defines.items())])
    fn = mod.get_function(entry)
    fn.set_attribute(device.cuda().function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, shared)
    return fn


def variant(spec: str) -> dict:
    role, *knobs = spec.split(":")
    return (forward if role == "fwd" else backward)(spec, *(int(x) for x in knobs))


def backward(spec: str, wg: int, cs: int) -> dict:
    from pycuda_heads.ops.reduce import reducer
    ldw = D + 16
    shared = 4 * (2 * H * D + wg * (KP * ldw + 2 * H * D + 2 * H * KP + 4 * H))
    fn = build("bwd.cu", "pool_wg_backward", {"WG": wg, "CS": cs}, shared)
    out = {"variant": spec, "registers": fn.num_regs, "shared_bytes": shared, "shapes": []}
    scale = np.float32(1 / np.sqrt(D))
    for b, k in SHAPES:
        q, ln = inputs(b, k)
        attn = reference(q, ln, np.float64)[1].astype(np.float32)
        gc = np.random.default_rng(7).standard_normal((b, H, D)).astype(np.float32)
        d_q, d_ln, d_attn, d_gc = (ga.to_gpu(x) for x in (q, ln, attn, gc))
        grid = (min(device.sm_count(), -(-b // wg)), 1, 1)
        parts = grid[0] * wg
        grad_ln, scratch = ga.empty((b, k, D), np.float32), ga.empty((parts, H, D), np.float32)

        def run():
            fn(d_q.gpudata, d_ln.gpudata, d_attn.gpudata, d_gc.gpudata, grad_ln.gpudata,
               scratch.gpudata, np.int32(k), scale, np.int32(b), grid=grid,
               block=(128 * wg, 1, 1), shared=shared)
            return reducer().sum_rows(scratch, parts, H * D, None, (H, D))
        grad_ln.fill(np.float32(np.nan))
        scratch.fill(np.float32(np.nan))
        first = (run().get(), grad_ln.get())
        second = (run().get(), grad_ln.get())
        r64 = reference_backward(q, ln, attn, gc, np.float64)
        r32 = reference_backward(q, ln, attn, gc, np.float32)
        point = {"B": b, "K": k,
                 "grad_q_h": compare(first[0], r64[0], r32[0]),
                 "grad_ln": compare(first[1], r64[1], r32[1]),
                 "rerun_bitwise": all(x.tobytes() == y.tobytes() for x, y in zip(first, second))}
        point["good"] = (point["grad_q_h"]["passed"] and point["grad_ln"]["passed"]
                         and point["rerun_bitwise"])
        if point["good"] and (b, k) == SHAPES[0]:
            point["us"] = gpu_time_us(run)["median_us"]
            pool = ph.PerHorizonAttentionPool(H, D)
            point["library_us"] = gpu_time_us(
                lambda: pool.backward(d_q, d_ln, d_attn, d_gc))["median_us"]
        out["shapes"].append(point)
    return out


def forward(spec: str, wg: int, nbuf: int, cs: int) -> dict:
    ldw = D + 16
    shared = 4 * (2 * H * D + wg * (nbuf * ldw * KP + 2 * H * KP + 2 * 4 * H))
    fn = build("fwd.cu", "pool_wg_forward", {"WG": wg, "NBUF": nbuf, "CS": cs}, shared)
    out = {"variant": spec, "registers": fn.num_regs, "shared_bytes": shared, "shapes": []}
    scale = np.float32(1 / np.sqrt(D))
    for b, k in SHAPES:
        q, ln = inputs(b, k)
        d_q, d_ln = ga.to_gpu(q), ga.to_gpu(ln)
        ctx, attn = ga.empty((b, H, D), np.float32), ga.empty((b, H, k), np.float32)
        grid = (min(device.sm_count(), -(-b // wg)), 1, 1)

        def run():
            fn(d_q.gpudata, d_ln.gpudata, ctx.gpudata, attn.gpudata, np.int32(k), scale,
               np.int32(b), grid=grid, block=(128 * wg, 1, 1), shared=shared)
        ctx.fill(np.float32(np.nan))
        attn.fill(np.float32(np.nan))
        run()
        first = (ctx.get(), attn.get())
        run()
        r64, r32 = reference(q, ln, np.float64), reference(q, ln, np.float32)
        point = {"B": b, "K": k,
                 "ctx": compare(first[0], r64[0], r32[0]),
                 "attn": compare(first[1], r64[1], r32[1]),
                 "rerun_bitwise": first[0].tobytes() == ctx.get().tobytes()
                 and first[1].tobytes() == attn.get().tobytes()}
        point["good"] = (point["ctx"]["passed"] and point["attn"]["passed"]
                         and point["rerun_bitwise"])
        if point["good"] and (b, k) == SHAPES[0]:
            point["us"] = gpu_time_us(run)["median_us"]
            pool = ph.PerHorizonAttentionPool(H, D)
            point["library_us"] = gpu_time_us(lambda: pool.forward(d_q, d_ln))["median_us"]
        out["shapes"].append(point)
    return out


def main(path: str, specs: list[str]) -> None:
    device.cuda()
    record = {"what": __doc__.split("\n")[0], "commit": git_state()["describe"], "variants": []}
    for spec in specs:
        run = subprocess.run([sys.executable, __file__, "--one", spec], capture_output=True,
                             text=True, timeout=240)
        try:
            result = json.loads(run.stdout.strip().splitlines()[-1])
        except (IndexError, json.JSONDecodeError):
            result = {"variant": spec, "failed": (run.stdout + run.stderr)[-3000:]}
        record["variants"].append(result)
        print(json.dumps(result), flush=True)
    Path(path).write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    if sys.argv[1] == "--one":
        device.cuda()
        print(json.dumps(variant(sys.argv[2])))
    else:
        main(sys.argv[1], sys.argv[2:] or ["fwd:2:2:4", "bwd:2:4"])
