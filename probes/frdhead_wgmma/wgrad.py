"""Issue 32 probe: the backward's weight-gradient product g = a^T x (a [B, 128], x [B, 128]:
grad_w1 = dhidden^T h_t) on wgmma in 3xTF32 (wgrad.cu), split over blocks and summed in block
order by a second kernel, against float64 and cuBLAS (TF32 and FP32, through torch), at
B = 65536, 16384, 1024 and 333 (a short last step, checked only). Each variant (BK batch rows a
step, G blocks) runs in a process of its own and is checked first: output poisoned with NaN,
every element written, error within the library's validation tolerance
(``verify.checks.compare``), bitwise reruns; a variant that fails is not timed.

    source .gpu/env.sh && python probes/frdhead_wgmma/wgrad.py $OUT/frd_wgrad.json
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pycuda.gpuarray as ga

from pycuda_heads.core import device
from pycuda_heads.core.source import cu_dir
from pycuda_heads.perf.bench import CudaHarness
from pycuda_heads.perf.timing import gpu_time_us
from pycuda_heads.records import git_state
from pycuda_heads.verify.checks import compare
from run import cublas_us, isolated  # this folder's forward probe

HERE = Path(__file__).resolve().parent
M = N = 128
BATCHES = (65536, 16384, 1024, 333)
#: name: (BK, blocks an SM)
VARIANTS = {"bk32_g2": (32, 2), "bk32_g1": (32, 1), "bk64_g1": (64, 1)}


def inputs(m: int) -> tuple:
    rng = np.random.default_rng(m)
    a = rng.standard_normal((m, M)).astype(np.float32)
    x = rng.standard_normal((m, N)).astype(np.float32)
    return a, x, a.astype(np.float64).T @ x.astype(np.float64), a.T @ x


def variant(name: str) -> dict:
    from pycuda.compiler import SourceModule
    bk, per_sm = VARIANTS[name]
    shared = bk * 3200
    with device.thread_context():
        mod = SourceModule((HERE / "wgrad.cu").read_text(), no_extern_c=True, arch="sm_90a",
                           include_dirs=[str(HERE), str(cu_dir())], options=["-O3", f"-DM={M}", f"-DN={N}", f"-DBK={bk}"])
    fn, red = mod.get_function("wg_wgrad"), mod.get_function("wg_reduce")
    fn.set_attribute(device.cuda().function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, shared)
    out = {"registers": fn.num_regs, "shared_bytes": shared, "batches": {}}
    for m in BATCHES:
        a, x, want, f32 = inputs(m)
        d_a, d_x = ga.to_gpu(a), ga.to_gpu(x)
        steps = -(-m // bk)
        blocks = min(device.sm_count() * per_sm, steps)
        rows = -(-steps // blocks) * bk
        blocks = -(-m // rows)
        d_part, d_g = ga.empty((blocks, M, N), np.float32), ga.empty((M, N), np.float32)

        def products():
            fn(d_a.gpudata, d_x.gpudata, d_part.gpudata, np.int32(m), np.int32(rows),
               grid=(blocks, 1, 1), block=(256, 1, 1), shared=shared)

        def reduce():
            red(d_part.gpudata, d_g.gpudata, np.int32(blocks), grid=(M * N // 256, 1, 1),
                block=(256, 1, 1))

        def run():
            products()
            reduce()
        d_part.fill(np.float32(np.nan))
        d_g.fill(np.float32(np.nan))
        run()
        first = d_g.get()
        run()
        check = compare(first, want, f32)
        point = {"blocks": blocks, "rows_per_block": rows, "check": check,
                 "all_written": bool(np.isfinite(first).all()),
                 "rerun_bitwise": first.tobytes() == d_g.get().tobytes(),
                 "rel_err_vs_f64": float(np.abs(first - want).max() / np.abs(want).max())}
        point["good"] = point["all_written"] and point["rerun_bitwise"] and check["passed"]
        if m != BATCHES[-1] and point["good"]:
            point["us"] = gpu_time_us(run)["median_us"]
            point["products_us"] = gpu_time_us(products)["median_us"]
            point["reduce_us"] = gpu_time_us(reduce)["median_us"]
        out["batches"][m] = point
    return out


def main(path: str) -> None:
    bandwidth = CudaHarness().copy_bandwidth_gbps()
    record = {"what": __doc__.split("\n")[0], "commit": git_state()["describe"],
              "gpu": device.gpu_name(), "copy_bandwidth_GBps": round(bandwidth, 1),
              "peers": {}, "variants": {}}
    for m in BATCHES[:-1]:
        a, x, _, _ = inputs(m)
        record["peers"][m] = {"floor_us": 4 * m * (M + N) / bandwidth / 1e3,
                              "gflop_3xtf32": 3 * 2 * m * M * N / 1e9,
                              **cublas_us(lambda torch, a, x: a.T @ x, a, x)}
        print(m, {k: round(v, 1) for k, v in record["peers"][m].items()}, flush=True)
    for name in VARIANTS:
        record["variants"][name] = isolated(__file__, path, name)
        if "crashed" not in record["variants"][name]:
            for m, p in record["variants"][name]["batches"].items():
                times = ("%.1f us (products %.1f, reduce %.1f, %.0f TFLOP/s 3x-counted)" % (
                    p["us"], p["products_us"], p["reduce_us"],
                    record["peers"][int(m)]["gflop_3xtf32"] / p["us"] * 1e3)
                    if "us" in p else "")
                print(m, name, p["blocks"], "blocks", "passes" if p["good"] else "FAILS",
                      "rel err %.2e" % p["rel_err_vs_f64"], times, flush=True)
        Path(path).write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[2] == "--variant":
        Path(sys.argv[1]).write_text(json.dumps(variant(sys.argv[3])))
    else:
        main(sys.argv[1])
