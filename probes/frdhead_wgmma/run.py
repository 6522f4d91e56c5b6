"""Issue 32 probe: the FRD head's first layer on wgmma (wgmma.cu) against float64, cuBLAS (TF32
and FP32, through torch) and the library's whole FrdHead forward, at B = 65536, 16384, 1024 and
333 (a short last tile, checked only). Each variant (DESC_SWAP 0/1: the two readings of the
descriptor's offsets; PASSES 3/1: 3xTF32 or plain TF32) is checked first: outputs poisoned with
NaN, every element written, error within the library's validation tolerance
(``verify.checks.compare``) for 3xTF32, bitwise reruns; a variant that fails is not timed.
Prints a table; writes everything to the JSON path.

    source .gpu/env.sh && python probes/frdhead_wgmma/run.py $OUT/frd_wgmma.json
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pycuda.gpuarray as ga

import pycuda_heads as ph
from pycuda_heads.core import device
from pycuda_heads.perf.bench import CudaHarness
from pycuda_heads.perf.timing import gpu_time_us
from pycuda_heads.records import git_state
from pycuda_heads.verify.checks import compare

HERE = Path(__file__).resolve().parent
N, K, BM = 128, 128, 64
SHARED = 4 * (2 * N * K + 2 * BM * K)
BATCHES = (65536, 16384, 1024, 333)
VARIANTS = {f"swap{s}_pass{p}": {"DESC_SWAP": s, "PASSES": p} for s in (0, 1) for p in (3, 1)}


def build(defines: dict) -> object:
    from pycuda.compiler import SourceModule
    options = ["-O3", f"-DN={N}", f"-DK={K}", *(f"-D{k}={v}" for k, v in defines.items())]
    with device.thread_context():
        fn = SourceModule((HERE / "wgmma.cu").read_text(), no_extern_c=True, arch="sm_90a",
                          options=options).get_function("wg_layer")
    fn.set_attribute(device.cuda().function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, SHARED)
    return fn


def torch_times(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> dict:
    try:
        import torch
    except ImportError:
        return {}
    tx, tw, tb = (torch.from_numpy(a).cuda() for a in (x, w, b))
    out = {}
    for name, tf32 in (("cublas_tf32_us", True), ("cublas_fp32_us", False)):
        torch.backends.cuda.matmul.allow_tf32 = tf32
        fn = lambda: torch.relu(torch.addmm(tb, tx, tw.T))  # noqa: E731
        fn()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(30):
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e3)
        out[name] = float(np.median(times))
    torch.backends.cuda.matmul.allow_tf32 = False
    return out


def main(path: str) -> None:
    rng = np.random.default_rng(0)
    bandwidth = CudaHarness().copy_bandwidth_gbps()
    record = {"what": __doc__.split("\n")[0], "commit": git_state()["describe"],
              "gpu": device.gpu_name(), "copy_bandwidth_GBps": round(bandwidth, 1),
              "variants": {}, "batches": []}
    fns = {}
    for name, defines in VARIANTS.items():
        try:
            fns[name] = build(defines)
            record["variants"][name] = {"registers": fns[name].num_regs}
        except Exception as exc:  # a variant that does not build is reported, not fatal
            record["variants"][name] = {"build_error": str(exc)[-2000:]}
            print(name, "does not build:", str(exc)[-300:], flush=True)
    w = (rng.standard_normal((N, K)) / np.sqrt(K)).astype(np.float32)
    b = rng.standard_normal(N).astype(np.float32)
    d_w, d_b = ga.to_gpu(w), ga.to_gpu(b)
    head = ph.FrdHead(K, N, 5, 21)
    w2 = (rng.standard_normal((5, 21, N)) / np.sqrt(N)).astype(np.float32)
    d_w2, d_b2 = ga.to_gpu(w2), ga.to_gpu(np.zeros((5, 21), np.float32))
    for m in BATCHES:
        x = rng.standard_normal((m, K)).astype(np.float32)
        want = np.maximum(x.astype(np.float64) @ w.astype(np.float64).T + b, 0)
        f32 = np.maximum(x @ w.T + b, 0)
        d_x, d_y = ga.to_gpu(x), ga.empty((m, N), np.float32)
        grid = (min(device.sm_count(), -(-m // BM)), 1, 1)
        entry = {"B": m, "floor_us": 4 * m * (K + N) / bandwidth / 1e3,
                 "gflop_3xtf32": 3 * 2 * m * N * K / 1e9, "points": {}}
        timed = m != 333
        if timed:
            entry["library_frdhead_forward_us"] = gpu_time_us(
                lambda: head.forward(d_x, d_w, d_b, d_w2, d_b2))["median_us"]
            entry.update(torch_times(x, w, b))
        for name, fn in fns.items():
            def run(fn=fn):
                fn(d_x.gpudata, d_w.gpudata, d_b.gpudata, d_y.gpudata, np.int32(m), grid=grid,
                   block=(128, 1, 1), shared=SHARED)
            d_y.fill(np.float32(np.nan))
            run()
            first = d_y.get()
            run()
            check = compare(first, want, f32)
            point = {"check": check, "all_written": bool(np.isfinite(first).all()),
                     "rerun_bitwise": first.tobytes() == d_y.get().tobytes(),
                     "rel_err_vs_f64": float(np.abs(first - want).max() / np.abs(want).max())}
            good = point["all_written"] and point["rerun_bitwise"] and (
                check["passed"] or VARIANTS[name]["PASSES"] == 1)
            if timed and good:
                point["us"] = gpu_time_us(run)["median_us"]
                point["tflops_3x"] = entry["gflop_3xtf32"] / point["us"] * 1e3 / (
                    3 if VARIANTS[name]["PASSES"] == 1 else 1)
            entry["points"][name] = point
            print(m, name, "passes" if good else "FAILS",
                  "rel err %.2e" % point["rel_err_vs_f64"],
                  "%.1f us" % point["us"] if "us" in point else "", flush=True)
        if timed:
            print(m, "floor %.1f us, library FrdHead forward (both layers) %.1f us" % (
                entry["floor_us"], entry["library_frdhead_forward_us"]),
                {k: round(v, 1) for k, v in entry.items() if k.startswith("cublas")}, flush=True)
        record["batches"].append(entry)
        Path(path).write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main(sys.argv[1])
