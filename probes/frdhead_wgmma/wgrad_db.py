"""Issue 32 probe: wgrad_db.cu (the weight gradients with A's pieces in two register sets, a step
waiting for the step two back) against the library's frdhead_wg_grad_w2 and
frdhead_wg_grad_w1_dpre at B = 65536, 16384 and 333: scratch rows bitwise equal to the library's
(same sums in the same order), then GPU time of each, at two rings.

    source .gpu/env.sh && python probes/frdhead_wgmma/wgrad_db.py $OUT/frd_wgrad_db.json
    python probes/frdhead_wgmma/wgrad_db.py --nvcc      (CPU: compile, ptxas's report)
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
         "WGMMA": 2, "WG": 2, "CS": 4, "BK": 32, "OCC": 1}
RINGS = (3, 4)
#: (library entry, probe entry, A's columns)
PAIRS = (("frdhead_wg_grad_w2", "wgrad_db_w2", H * A),
         ("frdhead_wg_grad_w1_dpre", "wgrad_db_w1", F))


def source(stages: int) -> str:
    return (render("frdhead", {**KNOBS, "STAGES": stages}) + "\n"
            + (HERE / "wgrad_db.cu").read_text())


def nvcc_report() -> None:
    from entries import report  # beside this file
    print(*report(source(RINGS[0]), [e for pair in PAIRS for e in pair[:2]]), sep="\n")


def main(path: str) -> None:
    import numpy as np
    import pycuda.gpuarray as ga
    import engine  # beside this file
    from entries import functions  # beside this file
    import pycuda_heads as ph
    from pycuda_heads.core import device
    from pycuda_heads.ops.frdhead import _wg_batch_split, backward_shared_bytes
    from pycuda_heads.perf.timing import gpu_time_us

    device.cuda()
    head = ph.FrdHead(D, F, H, A)
    record: dict = {"what": __doc__.split("\n")[0], "rings": {}}
    for stages in RINGS:
        p = {**KNOBS, "STAGES": stages}
        shared = backward_shared_bytes(p, KNOBS)
        fns = functions(source(stages), [e for pair in PAIRS for e in pair[:2]], shared)
        record["rings"][stages] = got = {"registers": {e: f.num_regs for e, f in fns.items()}}
        for b in BATCHES:
            args = engine.weight_grad_operands(head, b)
            blocks, per_block = _wg_batch_split(b, p)
            got[b] = points = {}
            for lib, mine, ma in PAIRS:
                outs = {e: ga.empty((blocks, ma * F + ma), np.float32) for e in (lib, mine)}

                def run(e: str, lib: str = lib) -> None:
                    fns[e](*(v.gpudata for v in args[lib]), outs[e].gpudata, np.int32(b),
                           np.int32(per_block), grid=(blocks, 1, 1), block=(256, 1, 1),
                           shared=shared)
                for e in outs:
                    outs[e].fill(np.float32(np.nan))
                    run(e)
                same = outs[lib].get().tobytes() == outs[mine].get().tobytes()
                point = {"bitwise_equal": same}
                if same and b != BATCHES[-1]:
                    point.update({f"{e}_us": gpu_time_us(lambda e=e: run(e))["median_us"]
                                  for e in outs})
                points[lib] = point
                print("STAGES", stages, b, lib, point, flush=True)
            Path(path).write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    if sys.argv[1:] == ["--nvcc"]:
        nvcc_report()
    else:
        main(sys.argv[1])
