"""Issue 32 probe: where FrdHead.backward's time goes under its FP16 engine (WGMMA 2) at
B = 65536 and 16384: GPU time of the whole call and of each launch alone (the FP16 row products,
each weight gradient with and without its reduce_axis0, a reduce alone), at the shipped point and
at other weight-gradient points (BK, OCC, STAGES). Inputs come from the library's forward_loss.

    source .gpu/env.sh && python probes/frdhead_wgmma/bwd_parts.py $OUT/frd_bwd_parts.json
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import engine  # beside this file
import pycuda_heads as ph
from pycuda_heads.core import device
from pycuda_heads.core.arrays import empty
from pycuda_heads.ops.frdhead import (_wg_batch_split, wb_grad_shared_bytes,
                                      wr_grad_w1_shared_bytes, wr_rows_shared_bytes)
from pycuda_heads.ops.reduce import reducer
from pycuda_heads.perf.timing import gpu_time_us

D = F = 128
H, A = 5, 21
BATCHES = (65536, 16384)
_G = {"BM": 32, "CHUNK": 256, "WGMMA": 2, "CS": 4}
POINTS = {"shipped": None,
          "wg2_bk32_occ1_st3": {**_G, "WG": 2, "BK": 32, "OCC": 1, "STAGES": 3},
          "wg2_bk16_occ2_st4": {**_G, "WG": 2, "BK": 16, "OCC": 2, "STAGES": 4},
          "wg2_bk16_occ2_st3": {**_G, "WG": 2, "BK": 16, "OCC": 2, "STAGES": 3},
          "wg2_bk32_occ1_st4": {**_G, "WG": 2, "BK": 32, "OCC": 1, "STAGES": 4},
          "wg1_bk32_occ1_st3": {**_G, "WG": 1, "BK": 32, "OCC": 1, "STAGES": 3}}


def parts(head: ph.FrdHead, x: dict, b: int) -> dict:
    """GPU us of the whole backward and of each of its launches at the head's point."""
    hidden, _, g, _ = head.forward_loss(*(x[n] for n in ("h_t", "w1", "b1", "w2", "b2",
                                                         "labels")))
    args = (x["h_t"], x["w1"], x["w2"], hidden, g)
    out = {"backward": gpu_time_us(lambda: head.backward(*args))["median_us"]}
    p = head.launch_params("backward", {"B": b})
    out["point"] = p
    rows, w2_grad, w1_grad = head.entries("backward", p)
    dpre, gh = empty((b, F)), empty((b, D))
    call, grid, block, shared = head._launch(
        "backward", rows, b, p, lambda: (head._wg_row_geometry("grad_w2", b, p)[:2]
                                         + (wr_rows_shared_bytes(p, head.template),)))
    out["rows"] = gpu_time_us(lambda: call(
        grid, block, grad_logits=g.gpudata, hidden=hidden.gpudata, w1=x["w1"].gpudata,
        w2=x["w2"].gpudata, dpre=dpre.gpudata, grad_h_t=gh.gpudata, B=b, shared=shared))[
        "median_us"]
    blocks, per_block = _wg_batch_split(b, p)
    for name, entry, width, nbytes, sums in (
            ("grad_w2", w2_grad, H * A * F + H * A, wb_grad_shared_bytes("grad_w2", p, head.template),
             dict(grad_logits=g.gpudata, hidden=hidden.gpudata)),
            ("grad_w1", w1_grad, F * D + F, wr_grad_w1_shared_bytes(p, head.template),
             dict(dpre=dpre.gpudata, h_t=x["h_t"].gpudata))):
        out[f"{name}_with_reduce"] = gpu_time_us(lambda: head._weight_grad(
            entry, "backward", b, p, width, nbytes, sums, None))["median_us"]
        c, gr, bl, sh = head._launch("backward", entry, b, p, lambda: None)
        scratch = empty((blocks, width))
        out[f"{name}_alone"] = gpu_time_us(lambda: c(
            gr, bl, **sums, scratch=scratch.gpudata, B=b, rows_per_block=per_block,
            shared=sh))["median_us"]
        out[f"{name}_reduce"] = gpu_time_us(
            lambda: reducer().sum_rows(scratch, blocks, width))["median_us"]
    out["grid_weight_grads"] = blocks
    return out


def main(path: str) -> None:
    device.cuda()
    record: dict = {"what": __doc__.split("\n")[0], "batches": {}}
    for b in BATCHES:
        x = engine.inputs(b)
        record["batches"][b] = got = {}
        for name, point in POINTS.items():
            head = ph.FrdHead(D, F, H, A, launch=None if point is None else {"backward": point})
            try:
                got[name] = parts(head, x, b)
            except Exception as exc:  # a point that cannot run here: say so, go on
                got[name] = {"error": f"{type(exc).__name__}: {exc}"}
            print(b, name, {k: (round(v, 1) if isinstance(v, float) else v)
                            for k, v in got[name].items() if k != "point"}, flush=True)
            Path(path).write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main(sys.argv[1])
