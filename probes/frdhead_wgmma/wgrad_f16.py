"""Issue 32 probe: wgrad_f16.cu (the backward's weight gradients on FP16 pieces: A's fragments by
ldmatrix.trans, X read transposed by wgmma, a column scale a block from a first pass over the
block's slice, or, "given", from the whole batch's column maxima as a producer would leave them)
against the library's
frdhead_wg_grad_w2 and frdhead_wg_grad_w1_dpre at B = 65536, 16384 and 333: the summed scratch
rows of each against float64 (the library's rule, verify.checks.compare), bitwise reruns, then
GPU time of each, at two batch steps and rings.

    source .gpu/env.sh && python probes/frdhead_wgmma/wgrad_f16.py $OUT/frd_wgrad_f16.json
    python probes/frdhead_wgmma/wgrad_f16.py --nvcc      (CPU: compile, ptxas's report)
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from pycuda_heads.core.source import render

HERE = Path(__file__).resolve().parent
D = F = 128
H, A = 5, 21
BATCHES = (65536, 16384, 333)
KNOBS = {"D_IN": D, "FRD_HIDDEN": F, "N_HORIZONS": H, "N_ATOMS": A, "BM": 32, "CHUNK": 256,
         "WGMMA": 2, "WG": 2, "CS": 4, "OCC": 1}
POINTS = ({"BK": 32, "STAGES": 3}, {"BK": 32, "STAGES": 4}, {"BK": 16, "STAGES": 4})
#: (library entry, the probe's entries: first pass, both maxima given, [A's given,] running
#: scales; A's columns)
PAIRS = (("frdhead_wg_grad_w2", ("wgrad_f16_w2", "wgrad_f16_w2_given", "wgrad_f16_w2_running"),
          H * A),
         ("frdhead_wg_grad_w1_dpre", ("wgrad_f16_w1", "wgrad_f16_w1_given", "wgrad_f16_w1_given_a",
                                      "wgrad_f16_w1_running"), F))
ENTRIES = [e for lib, mine, _ in PAIRS for e in (lib, *mine)]


def source(point: dict) -> str:
    return render("frdhead", {**KNOBS, **point}) + "\n" + (HERE / "wgrad_f16.cu").read_text()


def probe_shared(point: dict, ma: int) -> int:
    """wgrad_f16.cu's layout: two steps' X pieces, A's pieces, the scales, the maxima, the ring."""
    bk, lda = point["BK"], ma if ma % 4 else 136
    return (2 * (4 * bk * 128 + 2 * bk * 136)
            + 4 * (4 * 128 + 8 * 256 + point["STAGES"] * bk * (lda + 136)))


def nvcc_report() -> None:
    from entries import report  # beside this file
    for point in POINTS:
        print(point, *report(source(point), ENTRIES),
              sep="\n  ")


def main(path: str) -> None:
    import numpy as np
    import pycuda.gpuarray as ga

    import engine  # beside this file
    from entries import functions  # beside this file
    import pycuda_heads as ph
    from pycuda_heads.core import device
    from pycuda_heads.ops.frdhead import _wg_batch_split, backward_shared_bytes
    from pycuda_heads.perf.timing import gpu_time_us
    from pycuda_heads.verify.checks import compare

    device.cuda()
    head = ph.FrdHead(D, F, H, A)
    record: dict = {"what": __doc__.split("\n")[0], "points": []}
    for point in POINTS:
        p = {**KNOBS, **point}
        shared = max(backward_shared_bytes(p, KNOBS),
                     *(probe_shared(point, ma) for *_, ma in PAIRS))
        fns = functions(source(point), ENTRIES, shared)
        got = {"point": point, "registers": {e: f.num_regs for e, f in fns.items()},
               "batches": {}}
        record["points"].append(got)
        for b in BATCHES:
            operands = engine.weight_grad_operands(head, b)
            blocks, per_block = _wg_batch_split(b, p)
            got["batches"][b] = points = {}
            for lib, mine, ma in PAIRS:
                a_dev, x_dev = operands[lib]
                a64 = a_dev.get().reshape(b, ma).astype(np.float64)
                x64 = x_dev.get().astype(np.float64)
                ref64 = np.concatenate([(a64.T @ x64).ravel(), a64.sum(axis=0)])
                a32, x32 = a64.astype(np.float32), x64.astype(np.float32)
                ref32 = np.concatenate([(a32.T @ x32).ravel(), a32.sum(axis=0)])
                colmax = np.zeros(2 * F, np.float32)
                colmax[:ma], colmax[F:] = np.abs(a32).max(axis=0), np.abs(x32).max(axis=0)
                colmax_dev = ga.to_gpu(colmax)
                outs = {e: ga.empty((blocks, ma * F + ma), np.float32)
                        for e in (lib, *mine)}

                def run(e: str, a_dev=a_dev, x_dev=x_dev, outs=outs, cm=colmax_dev) -> None:
                    args = [a_dev.gpudata, x_dev.gpudata, outs[e].gpudata, np.int32(b),
                            np.int32(per_block)] + ([cm.gpudata] if e != lib else [])
                    fns[e](*args, grid=(blocks, 1, 1), block=(256, 1, 1), shared=shared)
                entry = {}
                for e in outs:
                    outs[e].fill(np.float32(np.nan))
                    run(e)
                    first = outs[e].get()
                    run(e)
                    summed = first.astype(np.float64).sum(axis=0)
                    entry[e] = {"rerun_bitwise": first.tobytes() == outs[e].get().tobytes(),
                                "check": compare(summed.astype(np.float32), ref64, ref32)}
                    entry[e]["good"] = entry[e]["rerun_bitwise"] and entry[e]["check"]["passed"]
                    if entry[e]["good"] and b != BATCHES[-1]:
                        entry[e]["us"] = gpu_time_us(lambda e=e: run(e))["median_us"]
                points[lib] = entry
                print(point, b, lib, {e: (v["good"], "%.1e" % v["check"]["max_rel_err"],
                                          round(v.get("us", 0), 1)) for e, v in entry.items()},
                      flush=True)
            Path(path).write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    if sys.argv[1:] == ["--nvcc"]:
        nvcc_report()
    else:
        main(sys.argv[1])
