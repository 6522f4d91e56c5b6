"""Issue 32 probe: the library's FrdHead with its roles on WGMMA=1 against the shipped launches
at the suite batches: GPU time of forward, forward_loss and forward_loss + both backward stages
for the forward's points (cu/frdhead_wgmma.cuh), and of each backward stage alone for the
backward's (cu/frdhead_wgmma_bwd.cuh). Each WGMMA point is checked against the shipped launch's
outputs first (the float64 checks are the tests'; this only guards the timing of a broken
point).

    source .gpu/env.sh && python probes/frdhead_wgmma/engine.py $OUT/frd_engine.json
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pycuda.gpuarray as ga

import pycuda_heads as ph
from pycuda_heads.core import device
from pycuda_heads.perf.timing import gpu_time_us

D = F = 128
H, A = 5, 21
POINTS = {"shipped": None,
          "wg2_cs16_swz": {"WGMMA": 1, "WG": 2, "CS": 16, "SWZ": 1},
          "wg2_cs16_pad": {"WGMMA": 1, "WG": 2, "CS": 16, "SWZ": 0},
          "wg2_cs4_swz": {"WGMMA": 1, "WG": 2, "CS": 4, "SWZ": 1},
          "wg1_cs4_swz": {"WGMMA": 1, "WG": 1, "CS": 4, "SWZ": 1}}
#: stage: name -> point (None: the shipped launch); grad_w1's row product fits one warpgroup
BACKWARD = {"grad_w2": {"shipped": None,
                        "wg2_cs8_bk64_occ1": {"WGMMA": 1, "WG": 2, "CS": 8, "BK": 64, "OCC": 1},
                        "wg2_cs4_bk32_occ2": {"WGMMA": 1, "WG": 2, "CS": 4, "BK": 32, "OCC": 2},
                        "wg2_cs2_bk16_occ2": {"WGMMA": 1, "WG": 2, "CS": 2, "BK": 16, "OCC": 2}},
            "grad_w1": {"shipped": None,
                        "wg1_cs8_bk16_occ2": {"WGMMA": 1, "WG": 1, "CS": 8, "BK": 16, "OCC": 2},
                        "wg1_cs8_bk32_occ1": {"WGMMA": 1, "WG": 1, "CS": 8, "BK": 32, "OCC": 1}}}


def inputs(b: int, dhidden: bool = False) -> dict:
    """The head's inputs at batch b (the same in every process); with ``dhidden``, a dhidden for
    grad_w1 drawn last from the same generator (the other draws unchanged)."""
    rng = np.random.default_rng(b)
    labels = rng.integers(0, A, size=(b, H)).astype(np.int32)
    labels[rng.random((b, H)) < 0.1] = -1
    x = {"h_t": ga.to_gpu(rng.standard_normal((b, D), dtype=np.float32)),
         "w1": ga.to_gpu((rng.standard_normal((F, D)) / np.sqrt(D)).astype(np.float32)),
         "b1": ga.to_gpu(rng.standard_normal(F, dtype=np.float32) * np.float32(0.1)),
         "w2": ga.to_gpu((rng.standard_normal((H, A, F)) / np.sqrt(F)).astype(np.float32)),
         "b2": ga.to_gpu(rng.standard_normal((H, A), dtype=np.float32)),
         "labels": ga.to_gpu(labels)}
    if dhidden:
        x["dhidden"] = ga.to_gpu(rng.standard_normal((b, F), dtype=np.float32) / np.float32(b))
    return x


def weight_grad_operands(head: ph.FrdHead, b: int) -> dict:
    """The (A, X) of each of the FP16 backward's weight gradients at batch b, by library entry:
    G and hidden from the library's forward_loss, and a dpre (normal / B where hidden > 0)."""
    x = inputs(b)
    hidden, _, g, _ = head.forward_loss(*(x[n] for n in ("h_t", "w1", "b1", "w2", "b2",
                                                         "labels")))
    rng = np.random.default_rng(b)
    dpre = ga.to_gpu(np.where(hidden.get() > 0, rng.standard_normal((b, F), dtype=np.float32)
                              / np.float32(b), np.float32(0)))
    return {"frdhead_wg_grad_w2": (g, hidden), "frdhead_wg_grad_w1_dpre": (dpre, x["h_t"])}


def rel_diff(got: list, ref: list) -> float:
    """The largest difference of a point's outputs from the shipped launch's, relative."""
    return max(float(np.abs(g - r).max() / max(np.abs(r).max(), 1e-30)) for g, r in zip(got, ref))


def keep(out: dict, path: str, b: int, key: str, row: dict) -> None:
    """``row`` into the record under batch ``b`` (written at once: a cut run keeps it)."""
    out.setdefault(str(b), {})[key] = row
    print(b, key, {k: round(v, 2) if k.endswith("us") else "%.1e" % v for k, v in row.items()},
          flush=True)
    Path(path).write_text(json.dumps(out, indent=1))


def main(path: str) -> None:
    device.cuda()  # the context, before the first allocation (the ops make it on construction)
    out: dict = {}
    for b in (65536, 16384, 1024):
        x = inputs(b)
        args = [x[n] for n in ("h_t", "w1", "b1", "w2", "b2")]
        ref = None
        for name, p in POINTS.items():
            head = ph.FrdHead(D, F, H, A, launch=None if p is None else
                              {"forward": p, "forward_loss": p})
            got = [o.get() for o in head.forward_loss(*args, x["labels"])]
            ref = ref or got

            def step() -> None:
                hidden, _, grad_logits, _ = head.forward_loss(*args, x["labels"])
                head.backward(x["h_t"], x["w1"], x["w2"], hidden, grad_logits)
            keep(out, path, b, name, {
                "rel_diff_vs_shipped": rel_diff(got, ref),
                "forward_us": gpu_time_us(lambda: head.forward(*args))["median_us"],
                "forward_loss_us": gpu_time_us(
                    lambda: head.forward_loss(*args, x["labels"]))["median_us"],
                "fwd_loss_bwd_us": gpu_time_us(step)["median_us"]})
        hidden, _, grad_logits, _ = ph.FrdHead(D, F, H, A).forward_loss(*args, x["labels"])
        dhidden = ga.to_gpu(np.random.default_rng(b + 1).standard_normal((b, F), dtype=np.float32)
                            / np.float32(b))
        stage_args = {"grad_w2": (hidden, x["w2"], grad_logits),
                      "grad_w1": (x["h_t"], x["w1"], hidden, dhidden)}
        for stage, points in BACKWARD.items():
            ref = None
            for name, p in points.items():
                head = ph.FrdHead(D, F, H, A, launch=None if p is None else {stage: p})
                run = getattr(head, stage)
                got = [o.get() for o in run(*stage_args[stage])]
                ref = ref or got
                keep(out, path, b, f"{stage}:{name}", {
                    "rel_diff_vs_shipped": rel_diff(got, ref),
                    f"{stage}_us": gpu_time_us(lambda: run(*stage_args[stage]))["median_us"]})


if __name__ == "__main__":
    main(sys.argv[1])
