"""Issue 32 probe: the FRD head backward's two row products in one launch on FP16 pieces
(cu/frdhead_f16_bwd.cuh's frdhead_f16_rows, first written here: dpre = (G w2) . [hidden > 0],
grad_h_t = dpre w1) against float64, and the
library's backward stages (grad_w2, grad_w1 at their shipped launches) in the same run, at
B = 65536, 16384, 1024 and 333 (a short last tile, checked only). hidden and G come from the
library's forward_loss. Outputs are poisoned with NaN, checked by the library's rule
(``verify.checks.compare``) and rerun bitwise; a variant that fails is not timed. Each variant
runs in a process of its own (run.py's ``isolated``).

    source .gpu/env.sh && python probes/frdhead_wgmma/bwd_rows_f16.py $OUT/frd_bwd_rows_f16.json
    python probes/frdhead_wgmma/bwd_rows_f16.py --nvcc      (CPU: compile, ptxas's report)
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from pycuda_heads.core.source import render

D = F = 128
H, A = 5, 21
HA, KG = H * A, 112
BATCHES = (65536, 16384, 1024, 333)
# the family's constants and the backward's knobs at WGMMA 2 (the mma.sync and weight-gradient
# knobs only compile beside it)
FAMILY = {"D_IN": D, "FRD_HIDDEN": F, "N_HORIZONS": H, "N_ATOMS": A, "BM": 32, "CHUNK": 256,
          "WGMMA": 2, "CS": 4, "BK": 32, "OCC": 1, "STAGES": 3}
VARIANTS = {"wg2": 2, "wg1": 1}


def shared(wg: int) -> int:
    """Both weights' FP16 pieces, their rows' inverse scales, a G tile a warpgroup."""
    return 2 * 2 * (KG * F + F * D) + 4 * (KG + F) + 4 * wg * 64 * HA


def source(wg: int) -> str:
    return render("frdhead", {**FAMILY, "WG": wg})


def nvcc_report() -> None:
    from entries import report  # beside this file
    for name, wg in VARIANTS.items():
        print(f"{name}: shared {shared(wg)} B", *report(source(wg), ["frdhead_f16_rows"]),
              sep="\n  ")


def reference(host: dict, dtype: type) -> tuple[np.ndarray, np.ndarray]:
    """dpre and grad_h_t in ``dtype``."""
    g = host["grad_logits"].reshape(-1, HA).astype(dtype)
    dhidden = g @ host["w2"].reshape(HA, F).astype(dtype)
    dpre = np.where(host["hidden"] > 0, dhidden, 0).astype(dtype)
    return dpre, dpre @ host["w1"].astype(dtype)


def variant(name: str) -> dict:
    import pycuda.gpuarray as ga
    import engine  # beside this file
    from entries import functions  # beside this file
    import pycuda_heads as ph
    from pycuda_heads.core import device
    from pycuda_heads.perf.timing import gpu_time_us
    from pycuda_heads.verify.checks import compare

    wg = VARIANTS[name]
    fn = functions(source(wg), ["frdhead_f16_rows"], shared(wg))["frdhead_f16_rows"]
    out = {"registers": fn.num_regs, "shared_bytes": shared(wg), "batches": {}}
    head = ph.FrdHead(D, F, H, A)
    for b in BATCHES:
        x = engine.inputs(b)
        hidden, _, grad_logits, _ = head.forward_loss(
            *(x[n] for n in ("h_t", "w1", "b1", "w2", "b2", "labels")))
        host = {"hidden": hidden.get(), "grad_logits": grad_logits.get(), "w1": x["w1"].get(),
                "w2": x["w2"].get()}
        r64, r32 = reference(host, np.float64), reference(host, np.float32)
        outs = {"dpre": ga.empty((b, F), np.float32), "grad_h_t": ga.empty((b, D), np.float32)}
        grid = (min(device.sm_count(), -(-b // (64 * wg))), 1, 1)

        def run() -> None:
            fn(grad_logits.gpudata, hidden.gpudata, x["w1"].gpudata, x["w2"].gpudata,
               outs["dpre"].gpudata, outs["grad_h_t"].gpudata, np.int32(b), grid=grid,
               block=(128 * wg, 1, 1), shared=shared(wg))
        for o in outs.values():
            o.fill(np.float32(np.nan))
        run()
        first = {k: o.get() for k, o in outs.items()}
        run()
        checks = {k: compare(first[k], r64[i], r32[i]) for i, k in enumerate(outs)}
        point = {"checks": checks,
                 "rerun_bitwise": all(first[k].tobytes() == outs[k].get().tobytes()
                                      for k in outs)}
        point["good"] = point["rerun_bitwise"] and all(c["passed"] for c in checks.values())
        if b != BATCHES[-1] and point["good"]:
            point["us"] = gpu_time_us(run)["median_us"]
            point["library_grad_w2_us"] = gpu_time_us(
                lambda: head.grad_w2(hidden, x["w2"], grad_logits))["median_us"]
            dh = head.grad_w2(hidden, x["w2"], grad_logits)[2]
            point["library_grad_w1_us"] = gpu_time_us(
                lambda: head.grad_w1(x["h_t"], x["w1"], hidden, dh))["median_us"]
        out["batches"][b] = point
    return out


def main(path: str) -> None:
    from pycuda_heads.core import device
    from run import isolated  # beside this file

    device.cuda()
    record = {"what": __doc__.split("\n")[0], "variants": {}}
    for name in VARIANTS:
        record["variants"][name] = got = isolated(__file__, path, name)
        for b, point in got.get("batches", {}).items():
            print(b, name, "passes" if point["good"] else "FAILS",
                  {k: "%.1e" % c["max_rel_err"] for k, c in point["checks"].items()},
                  {k: round(v, 1) for k, v in point.items() if k.endswith("us")}, flush=True)
        Path(path).write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    if sys.argv[1:] == ["--nvcc"]:
        nvcc_report()
    elif len(sys.argv) == 4 and sys.argv[2] == "--variant":
        Path(sys.argv[1]).write_text(json.dumps(variant(sys.argv[3])))
    else:
        main(sys.argv[1])
