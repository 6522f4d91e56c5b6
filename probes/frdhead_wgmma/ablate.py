"""Issue 32 probe: where FrdHead's WGMMA time goes, by leaving one thing out (no counters
needed). Each variant rewrites the rendered kernel source, then times the roles at B = 65536 at
the shipped points through the op itself (its grids, shared memory and launches):
  base      the source as it is
  pass1     one product a k-step (big.big) instead of 3xTF32's three: a third of the tensor work
  noload    the row products copy no tile after their first (they multiply stale rows)
  nostore   the row products' epilogues compute but store nothing (logits, grad_logits, ce,
            hidden, dhidden, grad_h_t)
  noweight  the weight-gradient launches return at once (the reduce still runs): a stage's
            row product and reduce alone
Outputs are wrong in every variant but base; only times are kept.

    source .gpu/env.sh && python probes/frdhead_wgmma/ablate.py $OUT/frd_ablate.json
"""
from __future__ import annotations

import json
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pycuda.gpuarray as ga

import pycuda_heads as ph
from pycuda_heads.core import compile as compiling
from pycuda_heads.core import device
from pycuda_heads.core.runtime import RUNTIME
from pycuda_heads.perf.timing import gpu_time_us

D = F = 128
H, A = 5, 21
B = 65536
_G = {"BM": 32, "CHUNK": 256, "WGMMA": 1, "WG": 2}
POINTS = {"forward": {**_G, "CS": 4, "SWZ": 1}, "forward_loss": {**_G, "CS": 4, "SWZ": 1},
          "grad_w2": {**_G, "CS": 4, "BK": 32, "OCC": 1, "STAGES": 3},
          "grad_w1": {**_G, "CS": 2, "BK": 16, "OCC": 2, "STAGES": 3}}
_NEVER = "== 1234.5f"  # a value no epilogue holds: the store stays in the code, never runs
VARIANTS = {
    "base": (),
    "pass1": (("    wgmma_rs(d, small, wg_desc(wb, rows * 16, 128));\n", ""),
              ("    wgmma_rs(d, big, wg_desc(ws, rows * 16, 128));\n", "")),
    "noload": (("if (tile + stride < tiles) wg_load_tile(buf, x, (tile + stride) * WG_ROWS, M, "
                "tid);", "commit_copies();"),
               ("        load(tile + stride);\n", "        commit_copies();\n")),
    "nostore": (("*reinterpret_cast<float2*>(hidden + (size_t)r * FRD_HIDDEN + c) = v;",
                 f"if (v.x {_NEVER}) *reinterpret_cast<float2*>(hidden + (size_t)r * FRD_HIDDEN"
                 " + c) = v;"),
                ("wg_store_rows(logits, stage, r0, B, lane);", ""),
                ("wg_store_rows(grad_logits, stage, r0, B, lane);", ""),
                ("if (in) ce[(size_t)r0 * N_HORIZONS + p] = loss;",
                 f"if (in && loss {_NEVER}) ce[(size_t)r0 * N_HORIZONS + p] = loss;"),
                ("*reinterpret_cast<float2*>(y + (size_t)(r0 + 8 * h) * WB_N + 8 * j + 2 * t) =",
                 f"if (d[4 * j + 2 * h] {_NEVER}) *reinterpret_cast<float2*>(y + (size_t)(r0 + 8 "
                 "* h) * WB_N + 8 * j + 2 * t) =")),
    "noweight": (("    wb_weight_grad<HA, false>(", "    if (B < 0) wb_weight_grad<HA, false>("),
                 ("    wb_weight_grad<FRD_HIDDEN, true>(",
                  "    if (B < 0) wb_weight_grad<FRD_HIDDEN, true>(")),
}
_render = compiling.render
_current: list = [()]


def rewritten(family: str, constants: dict, source_dir=None) -> str:
    text = _render(family, constants, source_dir)
    if family != "frdhead" or not constants.get("WGMMA"):
        return text
    for old, new in _current[0]:
        assert old in text, f"not in the source: {old!r}"
        text = text.replace(old, new)
    return text


def precompile(template: dict) -> None:
    """Every variant's modules through nvcc at once (PyCUDA's disk cache then loads them)."""
    from pycuda.compiler import compile as nvcc
    jobs = []
    for subs in VARIANTS.values():
        _current[0] = subs
        for role, p in POINTS.items():
            point = ph.FrdHead.SPACES[role].complete(p, template)
            jobs.append(rewritten("frdhead", {**template, **point}))
    with ThreadPoolExecutor(len(jobs)) as pool:
        list(pool.map(lambda s: nvcc(s, options=list(compiling.NVCC_OPTIONS), no_extern_c=True,
                                     arch=compiling.WGMMA_ARCH), set(jobs)))


def main(path: str) -> None:
    device.cuda()
    compiling.render = rewritten
    template = {"D_IN": D, "FRD_HIDDEN": F, "N_HORIZONS": H, "N_ATOMS": A}
    precompile(template)
    rng = np.random.default_rng(0)
    x = {"h_t": ga.to_gpu(rng.standard_normal((B, D), dtype=np.float32)),
         "w1": ga.to_gpu((rng.standard_normal((F, D)) / np.sqrt(D)).astype(np.float32)),
         "b1": ga.to_gpu(rng.standard_normal(F, dtype=np.float32) * np.float32(0.1)),
         "w2": ga.to_gpu((rng.standard_normal((H, A, F)) / np.sqrt(F)).astype(np.float32)),
         "b2": ga.to_gpu(rng.standard_normal((H, A), dtype=np.float32)),
         "labels": ga.to_gpu(rng.integers(-1, A, size=(B, H)).astype(np.int32)),
         "dhidden": ga.to_gpu(rng.standard_normal((B, F), dtype=np.float32) / np.float32(B))}
    args = [x[n] for n in ("h_t", "w1", "b1", "w2", "b2")]
    hidden, _, grad_logits, _ = ph.FrdHead(D, F, H, A, launch=POINTS).forward_loss(
        *args, x["labels"])
    calls = {"forward": lambda h: h.forward(*args),
             "forward_loss": lambda h: h.forward_loss(*args, x["labels"]),
             "grad_w2": lambda h: h.grad_w2(hidden, x["w2"], grad_logits),
             "grad_w1": lambda h: h.grad_w1(x["h_t"], x["w1"], hidden, x["dhidden"])}
    out: dict = {"B": B, "points": POINTS}
    for name, subs in VARIANTS.items():
        _current[0] = subs
        RUNTIME.kernels.clear()
        head = ph.FrdHead(D, F, H, A, launch=POINTS)
        out[name] = {role: gpu_time_us(lambda: call(head))["median_us"]
                     for role, call in calls.items()}
        print(name, {k: round(v, 1) for k, v in out[name].items()}, flush=True)
        Path(path).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main(sys.argv[1])
