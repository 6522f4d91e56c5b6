"""Issue 32 probe: the backward's row products on wgmma (rowprod.cu), dhidden = G w2 (grad_w2's)
and dh_t = (dhidden . [hidden > 0]) w1 (grad_w1's), against float64 (the library's tolerance,
``verify.checks.compare``), at B = 65536, 16384, 1024 and 333 (a short last tile, checked only).
Peers in the same run: cuBLAS TF32 / FP32 of the same product, and the library's whole grad_w2 and
grad_w1 stages (which also make the weight and bias gradients: wgrad.py probes those products).
Each variant runs in a process of its own and is checked first (output poisoned with NaN, every
element written, bitwise reruns); a variant that fails is not timed.

    source .gpu/env.sh && python probes/frdhead_wgmma/rowprod.py $OUT/frd_rowprod.json [VARIANT ...]
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pycuda.gpuarray as ga

import pycuda_heads as ph
from pycuda_heads.core import device
from pycuda_heads.core.source import cu_dir
from pycuda_heads.perf.timing import gpu_time_us
from pycuda_heads.verify.checks import compare
from run import cublas_us, isolated, new_record  # this folder's forward probe

HERE = Path(__file__).resolve().parent
F, H, A, N, ROWS = 128, 5, 21, 128, 64
BATCHES = (65536, 16384, 1024, 333)
#: name: -D defines (KA: the product's depth, 105 = H * A or 128 = F; MASK: A . [hidden > 0];
#: WG warpgroups a block; CS k-steps a chunk). The mask tile leaves shared memory for one
#: warpgroup only.
VARIANTS = {"g_w2_wg2_cs2": {"KA": H * A, "MASK": 0, "WG": 2, "CS": 2},
            "g_w2_wg3_cs2": {"KA": H * A, "MASK": 0, "WG": 3, "CS": 2},
            "g_w2_wg2_cs7": {"KA": H * A, "MASK": 0, "WG": 2, "CS": 7},
            "dpre_w1_wg1_cs2": {"KA": F, "MASK": 1, "WG": 1, "CS": 2},
            "dpre_w1_wg1_cs4": {"KA": F, "MASK": 1, "WG": 1, "CS": 4},
            "dpre_w1_wg1_cs8": {"KA": F, "MASK": 1, "WG": 1, "CS": 8}}


def shared_bytes(d: dict) -> int:
    kp = -(-d["KA"] // 8) * 8
    return 4 * (2 * N * kp + d["WG"] * ROWS * (kp + 4) * (2 if d["MASK"] else 1))


def inputs(m: int, ka: int) -> dict:
    """A, the mask (hidden) and W at batch m (the same in every process), and the answers in
    float64 and float32."""
    rng = np.random.default_rng(m + ka)
    x = {"a": (rng.standard_normal((m, ka)) / m).astype(np.float32),
         "mask": np.maximum(rng.standard_normal((m, ka)), 0).astype(np.float32),
         "w": (rng.standard_normal((ka, N)) / np.sqrt(ka)).astype(np.float32)}
    for dtype in (np.float64, np.float32):
        a = x["a"].astype(dtype) * (x["mask"] > 0) if ka == F else x["a"].astype(dtype)
        x[dtype.__name__] = a @ x["w"].astype(dtype)
    return x


def variant(name: str) -> dict:
    from pycuda.compiler import SourceModule
    d = VARIANTS[name]
    shared = shared_bytes(d)
    try:
        with device.thread_context():
            fn = SourceModule((HERE / "rowprod.cu").read_text(), no_extern_c=True,
                              arch="sm_90a", include_dirs=[str(HERE), str(cu_dir())],
                              options=["-O3", *(f"-D{k}={v}" for k, v in d.items())]
                              ).get_function("wg_rowprod")
    except Exception as exc:  # a variant that does not build is reported, not fatal
        return {"build_error": str(exc)[-2000:]}
    fn.set_attribute(device.cuda().function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, shared)
    out = {"registers": fn.num_regs, "shared_bytes": shared, "batches": {}}
    for m in BATCHES:
        x = inputs(m, d["KA"])
        dev = {n: ga.to_gpu(x[n]) for n in ("a", "mask", "w")}
        y = ga.empty((m, N), np.float32)
        grid = (min(device.sm_count(), -(-m // (ROWS * d["WG"]))), 1, 1)

        def run():
            fn(dev["a"].gpudata, dev["mask"].gpudata, dev["w"].gpudata, y.gpudata, np.int32(m),
               grid=grid, block=(128 * d["WG"], 1, 1), shared=shared)
        y.fill(np.float32(np.nan))
        run()
        first = y.get()
        run()
        want = x["float64"]
        point = {"all_written": bool(np.isfinite(first).all()),
                 "rerun_bitwise": first.tobytes() == y.get().tobytes(),
                 "check": compare(first, want, x["float32"]),
                 "rel_err_vs_f64": float(np.abs(first - want).max() / np.abs(want).max())}
        point["good"] = point["all_written"] and point["rerun_bitwise"] and point["check"]["passed"]
        if m != BATCHES[-1] and point["good"]:
            point["us"] = gpu_time_us(run)["median_us"]
        out["batches"][m] = point
    return out


def peers(bandwidth: float) -> dict:
    """Per timed batch and product: the floor (A, the mask, y), cuBLAS of the same product, and
    the library's stage it belongs to (FrdHead's tuned launch at that batch)."""
    head = ph.FrdHead(F, F, H, A)
    out = {}
    for m in BATCHES[:-1]:
        rng = np.random.default_rng(5)
        hidden = ga.to_gpu(np.maximum(rng.standard_normal((m, F)), 0).astype(np.float32))
        w2 = ga.to_gpu((rng.standard_normal((H, A, F)) / np.sqrt(F)).astype(np.float32))
        w1 = ga.to_gpu((rng.standard_normal((F, F)) / np.sqrt(F)).astype(np.float32))
        g = ga.to_gpu((rng.standard_normal((m, H, A)) / m).astype(np.float32))
        h_t = ga.to_gpu(rng.standard_normal((m, F)).astype(np.float32))
        dhidden = head.grad_w2(hidden, w2, g)[2]
        stages = {"library_grad_w2_us": gpu_time_us(lambda: head.grad_w2(hidden, w2, g)),
                  "library_grad_w1_us": gpu_time_us(
                      lambda: head.grad_w1(h_t, w1, hidden, dhidden))}
        out[m] = {k: v["median_us"] for k, v in stages.items()}
        for ka in (H * A, F):
            x = inputs(m, ka)
            moved = 4 * m * (ka * (2 if ka == F else 1) + N)
            out[m][f"ka{ka}"] = {"floor_us": moved / bandwidth / 1e3,
                                 **cublas_us(lambda torch, a, w: a @ w, x["a"], x["w"])}
    return out


def main(path: str, names: list[str]) -> None:
    record = new_record(__doc__, peers)
    for m, e in record["peers"].items():
        print(m, json.dumps(e), flush=True)
    for name in names or VARIANTS:
        record["variants"][name] = isolated(__file__, path, name)
        for m, p in record["variants"][name].get("batches", {}).items():
            print(m, name, "passes" if p["good"] else "FAILS",
                  "rel err %.1e" % p["rel_err_vs_f64"],
                  "%.1f us" % p["us"] if "us" in p else "", flush=True)
        Path(path).write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[2] == "--variant":
        Path(sys.argv[1]).write_text(json.dumps(variant(sys.argv[3])))
    else:  # rowprod.py OUT.json [VARIANT ...]: the named variants, else all
        main(sys.argv[1], sys.argv[2:])
