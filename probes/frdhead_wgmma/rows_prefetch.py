"""Issue 32 probe: rows_prefetch.cu (the FP16 backward's row launch with the mask loaded a tile
ahead) against the library's frdhead_f16_rows at B = 65536, 16384 and 333: outputs bitwise equal
to the library's (same sums in the same order), then GPU time of each, both warpgroup counts.
Inputs from the library's forward_loss.

    source .gpu/env.sh && python probes/frdhead_wgmma/rows_prefetch.py $OUT/frd_rows_prefetch.json
    python probes/frdhead_wgmma/rows_prefetch.py --nvcc      (CPU: compile, ptxas's report)
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
         "WGMMA": 2, "CS": 4, "BK": 32, "OCC": 1, "STAGES": 3}
ENTRIES = ("frdhead_f16_rows", "rows_prefetch")


def source(wg: int) -> str:
    return render("frdhead", {**KNOBS, "WG": wg}) + "\n" + (HERE / "rows_prefetch.cu").read_text()


def nvcc_report() -> None:
    from entries import report  # beside this file
    for wg in (2, 1):
        print(f"WG {wg}", *report(source(wg), ENTRIES), sep="\n  ")


def main(path: str) -> None:
    import engine  # beside this file
    from entries import functions  # beside this file
    import pycuda.gpuarray as ga
    import numpy as np
    import pycuda_heads as ph
    from pycuda_heads.core import device
    from pycuda_heads.ops.frdhead import wr_rows_shared_bytes
    from pycuda_heads.perf.timing import gpu_time_us

    device.cuda()
    head = ph.FrdHead(D, F, H, A)
    record: dict = {"what": __doc__.split("\n")[0], "points": {}}
    for wg in (2, 1):
        shared = wr_rows_shared_bytes({**KNOBS, "WG": wg}, KNOBS)
        fns = functions(source(wg), ENTRIES, shared)
        record["points"][wg] = got = {"registers": {e: f.num_regs for e, f in fns.items()}}
        for b in BATCHES:
            x = engine.inputs(b)
            hidden, _, g, _ = head.forward_loss(*(x[n] for n in ("h_t", "w1", "b1", "w2", "b2",
                                                                 "labels")))
            grid = (min(device.sm_count(), -(-b // (64 * wg))), 1, 1)
            outs = {e: (ga.empty((b, F), np.float32), ga.empty((b, D), np.float32))
                    for e in ENTRIES}

            def run(e: str) -> None:
                fns[e](g.gpudata, hidden.gpudata, x["w1"].gpudata, x["w2"].gpudata,
                       outs[e][0].gpudata, outs[e][1].gpudata, np.int32(b), grid=grid,
                       block=(128 * wg, 1, 1), shared=shared)
            for e in ENTRIES:
                for o in outs[e]:
                    o.fill(np.float32(np.nan))
                run(e)
            same = all(p.get().tobytes() == q.get().tobytes()
                       for p, q in zip(outs[ENTRIES[0]], outs[ENTRIES[1]]))
            point = {"bitwise_equal": same}
            if same and b != BATCHES[-1]:
                point.update({f"{e}_us": gpu_time_us(lambda e=e: run(e))["median_us"]
                              for e in ENTRIES})
            got[b] = point
            print("WG", wg, b, point, flush=True)
            Path(path).write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    if sys.argv[1:] == ["--nvcc"]:
        nvcc_report()
    else:
        main(sys.argv[1])
