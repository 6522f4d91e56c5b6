"""Issue 32 probe: the FRD head's second layer fused with the loss on wgmma (wgmma_loss.cu):
logits, grad_logits and ce from hidden, against float64 (the library's tolerance,
``verify.checks.compare``), at B = 65536, 16384, 1024 and 333 (a short last tile, checked only).
Peers in the same run: cuBLAS TF32 / FP32 of the layer-2 product, the library's FrdHead
forward_loss (both layers and the loss) and forward, FrdSoftmaxCE alone. Each variant runs in a
process of its own and is checked first (outputs poisoned with NaN, every element written,
bitwise reruns); a variant that fails is not timed.

    source .gpu/env.sh && python probes/frdhead_wgmma/loss.py $OUT/frd_wgmma_loss.json [VARIANT ...]
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pycuda.gpuarray as ga

import pycuda_heads as ph
from pycuda_heads import reference as ref
from pycuda_heads.core import device
from pycuda_heads.perf.timing import gpu_time_us
from pycuda_heads.verify.checks import compare
from run import TF32_BOUND, cublas_us, isolated, new_record  # the first-layer probe's

HERE = Path(__file__).resolve().parent
F, H, A, N2, BM = 128, 5, 21, 112, 64
BATCHES = (65536, 16384, 1024, 333)
#: name: -D defines (WG warpgroups a block, CS, SWZ, PASSES, EPI, LOSS; see wgmma_loss.cu)
VARIANTS = {"wg2_cs4_swz": {"WG": 2, "CS": 4, "SWZ": 1, "PASSES": 3, "EPI": 2, "LOSS": 1},
            "wg2_cs4_swz_epi1": {"WG": 2, "CS": 4, "SWZ": 1, "PASSES": 3, "EPI": 1, "LOSS": 1},
            "wg2_cs16_pad": {"WG": 2, "CS": 16, "SWZ": 0, "PASSES": 3, "EPI": 2, "LOSS": 1},
            "wg1_cs4_swz": {"WG": 1, "CS": 4, "SWZ": 1, "PASSES": 3, "EPI": 2, "LOSS": 1},
            "wg2_cs4_swz_logits": {"WG": 2, "CS": 4, "SWZ": 1, "PASSES": 3, "EPI": 2, "LOSS": 0},
            "wg2_cs4_swz_pass1": {"WG": 2, "CS": 4, "SWZ": 1, "PASSES": 1, "EPI": 2, "LOSS": 1}}


def shared_bytes(d: dict) -> int:
    return 4 * (2 * N2 * F + d["WG"] * (BM * (F + (0 if d["SWZ"] else 16)) + 4 * 8 * H * A))


def inputs(m: int) -> dict:
    """hidden, w2, b2, labels at batch m (the same in every process) and the answers: logits,
    grad_logits, ce in float64 and float32."""
    rng = np.random.default_rng(m)
    x = {"hidden": np.maximum(rng.standard_normal((m, F)), 0).astype(np.float32),
         "w2": (rng.standard_normal((H * A, F)) / np.sqrt(F)).astype(np.float32),
         "b2": rng.standard_normal(H * A).astype(np.float32),
         "labels": rng.integers(0, A, size=(m, H)).astype(np.int32)}
    x["labels"][rng.random((m, H)) < 0.1] = -1
    for dtype in (np.float64, np.float32):
        z = (x["hidden"].astype(dtype) @ x["w2"].T.astype(dtype) + x["b2"]).reshape(m, H, A)
        grad, ce = ref.frd_softmax_ce_grad(z, x["labels"], dtype=dtype)
        x[dtype.__name__] = (z, grad, ce)
    return x


def variant(name: str) -> dict:
    from pycuda.compiler import SourceModule
    d = VARIANTS[name]
    shared = shared_bytes(d)
    try:
        with device.thread_context():
            fn = SourceModule((HERE / "wgmma_loss.cu").read_text(), no_extern_c=True,
                              arch="sm_90a", include_dirs=[str(HERE)],
                              options=["-O3", f"-DNH={H}", f"-DNA={A}",
                                       *(f"-D{k}={v}" for k, v in d.items())]
                              ).get_function("wg_layer2_loss")
    except Exception as exc:  # a variant that does not build is reported, not fatal
        return {"build_error": str(exc)[-2000:]}
    fn.set_attribute(device.cuda().function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, shared)
    out = {"registers": fn.num_regs, "shared_bytes": shared, "batches": {}}
    for m in BATCHES:
        x = inputs(m)
        dev = {n: ga.to_gpu(x[n]) for n in ("hidden", "w2", "b2", "labels")}
        outs = [ga.empty((m, H, A), np.float32), ga.empty((m, H, A), np.float32),
                ga.empty((m, H), np.float32)]
        grid = (min(device.sm_count(), -(-m // (BM * d["WG"]))), 1, 1)

        def run():
            fn(dev["hidden"].gpudata, dev["w2"].gpudata, dev["b2"].gpudata,
               dev["labels"].gpudata, *(o.gpudata for o in outs), np.int32(m),
               np.float32(1.0 / m), grid=grid, block=(128 * d["WG"], 1, 1), shared=shared)
        for o in outs:
            o.fill(np.float32(np.nan))
        run()
        first = [o.get() for o in outs]
        run()
        kept = ("logits", "grad_logits", "ce")[:3 if d["LOSS"] else 1]  # LOSS 0: logits only
        first = first[:len(kept)]
        point = {"all_written": all(bool(np.isfinite(f).all()) for f in first),
                 "rerun_bitwise": all(f.tobytes() == o.get().tobytes()
                                      for f, o in zip(first, outs)),
                 "checks": {}, "rel_err_vs_f64": {}}
        for i, what in enumerate(kept):
            want = x["float64"][i]
            point["checks"][what] = compare(first[i], want, x["float32"][i])
            point["rel_err_vs_f64"][what] = float(np.abs(first[i] - want).max()
                                                  / np.abs(want).max())
        point["good"] = point["all_written"] and point["rerun_bitwise"] and (
            all(c["passed"] for c in point["checks"].values()) if d["PASSES"] == 3
            else max(point["rel_err_vs_f64"].values()) < TF32_BOUND)
        if m != BATCHES[-1] and point["good"]:
            point["us"] = gpu_time_us(run)["median_us"]
        out["batches"][m] = point
    return out


def peers(bandwidth: float) -> dict:
    """Per timed batch: the floor (hidden, labels in; logits, grad_logits, ce out), cuBLAS of the
    layer-2 product, the library's forward_loss and forward (both layers) and FrdSoftmaxCE."""
    head, frd = ph.FrdHead(F, F, H, A), ph.FrdSoftmaxCE(H, A)
    out = {}
    for m in BATCHES[:-1]:
        x = inputs(m)
        rng = np.random.default_rng(2)
        h_t = ga.to_gpu(rng.standard_normal((m, F)).astype(np.float32))
        w1 = ga.to_gpu((rng.standard_normal((F, F)) / np.sqrt(F)).astype(np.float32))
        b1 = ga.to_gpu(np.zeros(F, np.float32))
        w2 = ga.to_gpu(x["w2"].reshape(H, A, F))
        b2 = ga.to_gpu(x["b2"].reshape(H, A))
        labels = ga.to_gpu(x["labels"])
        logits = head.forward(h_t, w1, b1, w2, b2)[1]
        moved = 4 * m * (F + H + 2 * H * A + H)
        out[m] = {"floor_us": moved / bandwidth / 1e3,
                  "library_forward_loss_us": gpu_time_us(
                      lambda: head.forward_loss(h_t, w1, b1, w2, b2, labels))["median_us"],
                  "library_forward_us": gpu_time_us(
                      lambda: head.forward(h_t, w1, b1, w2, b2))["median_us"],
                  "library_softmax_ce_us": gpu_time_us(
                      lambda: frd.softmax_ce_grad(logits, labels, check_labels=False))["median_us"],
                  **cublas_us(lambda torch, h, w, b: torch.addmm(b, h, w.T),
                              x["hidden"], x["w2"], x["b2"])}
    return out


def main(path: str, names: list[str]) -> None:
    record = new_record(__doc__, peers)
    for m, e in record["peers"].items():
        print(m, {k: round(v, 1) for k, v in e.items()}, flush=True)
    for name in names or VARIANTS:
        record["variants"][name] = isolated(__file__, path, name)
        for m, p in record["variants"][name].get("batches", {}).items():
            print(m, name, "passes" if p["good"] else "FAILS",
                  {k: "%.1e" % v for k, v in p["rel_err_vs_f64"].items()},
                  "%.1f us" % p["us"] if "us" in p else "", flush=True)
        Path(path).write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[2] == "--variant":
        Path(sys.argv[1]).write_text(json.dumps(variant(sys.argv[3])))
    else:  # loss.py OUT.json [VARIANT ...]: the named variants, else all
        main(sys.argv[1], sys.argv[2:])
