"""Issue 32 probe: the FRD head's first layer on wgmma against float64, cuBLAS (TF32 and FP32,
through torch) and the library's whole FrdHead forward, at B = 65536, 16384, 1024 and 333 (a
short last tile, checked only). Variants: ``smem`` is wgmma.cu (x split into shared memory),
PASSES 3/1: 3xTF32 or plain TF32 (held to ``TF32_BOUND``); ``fp16`` is wgmma_fp16.cu (two FP16
pieces a value at the 16-bit tensor rate, PASSES 3/1 likewise; its TFLOP/s count 3xTF32's
FLOPs, so the two compare as the head's work done per second). Each variant is checked first:
outputs poisoned with NaN, every element written,
error within the library's validation tolerance (``verify.checks.compare``) for 3xTF32, bitwise
reruns; a variant that fails is not timed. Each variant runs in a process of its own, so one that
faults (a wrong fragment order can) does not take the others with it. Prints a table; writes
everything to the JSON path.

    source .gpu/env.sh && python probes/frdhead_wgmma/run.py $OUT/frd_wgmma.json [VARIANT ...]
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pycuda.gpuarray as ga

import pycuda_heads as ph
from pycuda_heads.core import device
from pycuda_heads.core.source import cu_dir
from pycuda_heads.perf.bench import CudaHarness
from pycuda_heads.perf.timing import gpu_time_us
from pycuda_heads.records import git_state
from pycuda_heads.verify.checks import compare

HERE = Path(__file__).resolve().parent
N, K, BM = 128, 128, 64
BATCHES = (65536, 16384, 1024, 333)
# name: (source, entry, -D defines, warpgroups a block, shared bytes[, blocks an SM])
# Steps 2-5 (A from registers, the second layer with the loss) are in the library since
# c993664 (cu/frdhead_wgmma.cuh, knob WGMMA; engine.py times it); their probe sources are in git
# history, their records in reports/nvidia-h200/probes/frd_wgmma_step*.
VARIANTS = {"smem_pass3": ("wgmma.cu", "wg_layer", {"PASSES": 3}, 1,
                           4 * (2 * N * K + 2 * BM * K)),
            "smem_pass1": ("wgmma.cu", "wg_layer", {"PASSES": 1}, 1,
                           4 * (2 * N * K + 2 * BM * K)),
            # FP16 pieces scaled by powers of two (precision.py's fp16x2_one): w's halves 64 KB,
            # x's fragments straight from global memory; not yet run on a GPU
            **{f"fp16_pass{p}_wg{wg}_x{per_sm}": ("wgmma_fp16.cu", "wg_layer_f16",
                                                  {"PASSES": p, "WG": wg}, wg,
                                                  2 * 2 * N * K + 4 * N, per_sm)
               for p in (3, 1) for wg, per_sm in ((2, 1), (1, 3))}}
# plain TF32 is held to this bound instead of the library tolerance (it catches a wrong layout)
TF32_BOUND = 2e-3


def build(name: str) -> object:
    from pycuda.compiler import SourceModule
    source, entry, defines, _, shared, *_ = VARIANTS[name]
    options = ["-O3", f"-DN={N}", f"-DK={K}", *(f"-D{k}={v}" for k, v in defines.items())]
    with device.thread_context():
        fn = SourceModule((HERE / source).read_text(), no_extern_c=True, arch="sm_90a",
                          include_dirs=[str(HERE), str(cu_dir())], options=options).get_function(entry)
    fn.set_attribute(device.cuda().function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, shared)
    return fn


def cublas_us(call: Callable[..., Any], *arrays: np.ndarray) -> dict:
    """Median CUDA-event time of ``call(torch, *tensors)`` with TF32 allowed and not (cuBLAS's
    two FP32 paths), or nothing where torch is missing."""
    try:
        import torch
    except ImportError:
        return {}
    tensors = [torch.from_numpy(a).cuda() for a in arrays]
    out = {}
    for name, tf32 in (("cublas_tf32_us", True), ("cublas_fp32_us", False)):
        torch.backends.cuda.matmul.allow_tf32 = tf32
        call(torch, *tensors)
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(30):
            start.record()
            call(torch, *tensors)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e3)
        out[name] = float(np.median(times))
    torch.backends.cuda.matmul.allow_tf32 = False
    return out


def inputs(m: int) -> tuple:
    """x, w, b and the float64 / float32 answers at batch m (the same in every process)."""
    rng = np.random.default_rng(m)
    w = (rng.standard_normal((N, K)) / np.sqrt(K)).astype(np.float32)
    b = rng.standard_normal(N).astype(np.float32)
    x = rng.standard_normal((m, K)).astype(np.float32)
    want = np.maximum(x.astype(np.float64) @ w.astype(np.float64).T + b, 0)
    return x, w, b, want, np.maximum(x @ w.T + b, 0)


def peers(bandwidth: float) -> list:
    """Per timed batch: the floor, cuBLAS TF32 / FP32 and the library's FrdHead forward."""
    head = ph.FrdHead(K, N, 5, 21)
    rng = np.random.default_rng(1)
    d_w2 = ga.to_gpu((rng.standard_normal((5, 21, N)) / np.sqrt(N)).astype(np.float32))
    d_b2 = ga.to_gpu(np.zeros((5, 21), np.float32))
    out = []
    for m in BATCHES[:-1]:
        x, w, b, _, _ = inputs(m)
        d_x, d_w, d_b = ga.to_gpu(x), ga.to_gpu(w), ga.to_gpu(b)
        entry = {"B": m, "floor_us": 4 * m * (K + N) / bandwidth / 1e3,
                 "gflop_3xtf32": 3 * 2 * m * N * K / 1e9,
                 "library_frdhead_forward_us": gpu_time_us(
                     lambda: head.forward(d_x, d_w, d_b, d_w2, d_b2))["median_us"]}
        entry.update(cublas_us(lambda torch, x, w, b: torch.relu(torch.addmm(b, x, w.T)),
                               x, w, b))
        out.append(entry)
    return out


def variant(name: str) -> dict:
    """Checks and times of one variant at every batch."""
    try:
        fn = build(name)
    except Exception as exc:  # a variant that does not build is reported, not fatal
        return {"build_error": str(exc)[-2000:]}
    _, _, defines, wg, shared, *more = VARIANTS[name]
    out = {"registers": fn.num_regs, "batches": {}}
    for m in BATCHES:
        x, w, b, want, f32 = inputs(m)
        d_x, d_w, d_b = ga.to_gpu(x), ga.to_gpu(w), ga.to_gpu(b)
        d_y = ga.empty((m, N), np.float32)
        grid = (min(device.sm_count() * (more[0] if more else 1), -(-m // (BM * wg))), 1, 1)

        def run():
            fn(d_x.gpudata, d_w.gpudata, d_b.gpudata, d_y.gpudata, np.int32(m), grid=grid,
               block=(128 * wg, 1, 1), shared=shared)
        d_y.fill(np.float32(np.nan))
        run()
        first = d_y.get()
        run()
        check = compare(first, want, f32)
        point = {"check": check, "all_written": bool(np.isfinite(first).all()),
                 "rerun_bitwise": first.tobytes() == d_y.get().tobytes(),
                 "rel_err_vs_f64": float(np.abs(first - want).max() / np.abs(want).max())}
        point["good"] = point["all_written"] and point["rerun_bitwise"] and (
            check["passed"] if defines["PASSES"] == 3 else point["rel_err_vs_f64"] < TF32_BOUND)
        if m != BATCHES[-1] and point["good"]:
            point["us"] = gpu_time_us(run)["median_us"]
        out["batches"][m] = point
    return out


def isolated(script: str, path: str, name: str) -> dict:
    """What ``script PART --variant NAME`` wrote, run in a process of its own (a variant that
    faults kills its CUDA context), or how it crashed."""
    part = Path(path).with_suffix(f".{name}.json")
    proc = subprocess.run([sys.executable, script, str(part), "--variant", name],
                          capture_output=True, text=True, timeout=120)
    if proc.returncode or not part.is_file():
        print(name, "CRASHED", proc.stderr.strip().splitlines()[-1:], flush=True)
        return {"crashed": proc.returncode, "stderr": proc.stderr[-1500:]}
    out = json.loads(part.read_text())
    part.unlink()
    return out


def new_record(doc: str, peers: Callable[[float], Any]) -> dict:
    """A probe's record: what it is, where it ran, and its peers at this GPU's copy bandwidth."""
    bandwidth = CudaHarness().copy_bandwidth_gbps()
    return {"what": doc.split("\n")[0], "commit": git_state()["describe"],
            "gpu": device.gpu_name(), "copy_bandwidth_GBps": round(bandwidth, 1),
            "peers": peers(bandwidth), "variants": {}}


def main(path: str, names: list[str]) -> None:
    record = new_record(__doc__, peers)
    floors = {e["B"]: e for e in record["peers"]}
    for e in record["peers"]:
        print(e["B"], "floor %.1f us, library FrdHead forward (both layers) %.1f us" % (
            e["floor_us"], e["library_frdhead_forward_us"]),
            {k: round(v, 1) for k, v in e.items() if k.startswith("cublas")}, flush=True)
    for name in names or VARIANTS:
        record["variants"][name] = isolated(__file__, path, name)
        if "crashed" not in record["variants"][name]:
            for m, point in record["variants"][name].get("batches", {}).items():
                extra = ""
                if "us" in point:
                    gflop = floors[int(m)]["gflop_3xtf32"] / (
                        3 if VARIANTS[name][2]["PASSES"] == 1 else 1)
                    extra = "%.1f us (%.0f TFLOP/s, floor %.1f)" % (
                        point["us"], gflop / point["us"] * 1e3, floors[int(m)]["floor_us"])
                print(m, name, "passes" if point["good"] else "FAILS",
                      "rel err %.2e" % point["rel_err_vs_f64"], extra, flush=True)
        Path(path).write_text(json.dumps(record, indent=1))


def profile(name: str, m: int = BATCHES[0]) -> None:
    """One launch of a variant at batch m, for Nsight Compute."""
    fn = build(name)
    _, _, _, wg, shared, *more = VARIANTS[name]
    x, w, b, _, _ = inputs(m)
    d_x, d_w, d_b = ga.to_gpu(x), ga.to_gpu(w), ga.to_gpu(b)
    d_y = ga.empty((m, N), np.float32)
    fn(d_x.gpudata, d_w.gpudata, d_b.gpudata, d_y.gpudata, np.int32(m),
       grid=(min(device.sm_count() * (more[0] if more else 1), -(-m // (BM * wg))), 1, 1),
       block=(128 * wg, 1, 1),
       shared=shared)
    device.cuda().Context.synchronize()


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[2] == "--variant":
        Path(sys.argv[1]).write_text(json.dumps(variant(sys.argv[3])))
    elif len(sys.argv) == 3 and sys.argv[1] == "--profile":  # ncu ... run.py --profile NAME
        profile(sys.argv[2])
    else:  # run.py OUT.json [VARIANT ...]: the named variants, else all
        main(sys.argv[1], sys.argv[2:])
