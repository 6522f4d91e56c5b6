"""Issue 32 probe: FrdHead's WGMMA roles at B = 65536 and 16384, timed at fixed launch points,
with a digest of every output, so that two runs (one at the checkout's cu/, one with a kernel
edit reverted) compare time and bitwise results. Run it once per source tree, each with its own
label:

    source .gpu/env.sh && python probes/frdhead_wgmma/ab_rows.py $OUT/ab.json new
"""
from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import engine  # beside this file: the inputs of the stored runs
import pycuda_heads as ph
from pycuda_heads.core import device
from pycuda_heads.perf.timing import gpu_time_us

D = F = 128
H, A = 5, 21
_G = {"BM": 32, "CHUNK": 256, "WGMMA": 1, "WG": 2}
FORWARD = {"cs4_swz": {**_G, "CS": 4, "SWZ": 1}, "cs4_pad": {**_G, "CS": 4, "SWZ": 0}}
BACKWARD = {"grad_w2": {"cs4_bk32": {**_G, "CS": 4, "BK": 32, "OCC": 1, "STAGES": 3},
                        "cs2_bk32": {**_G, "CS": 2, "BK": 32, "OCC": 1, "STAGES": 3}},
            "grad_w1": {"cs4_bk16": {**_G, "CS": 4, "BK": 16, "OCC": 2, "STAGES": 2},
                        "cs2_bk16": {**_G, "CS": 2, "BK": 16, "OCC": 2, "STAGES": 2}}}


def digest(outputs: tuple) -> str:
    h = hashlib.sha256()
    for o in outputs:
        h.update(o.get().tobytes())
    return h.hexdigest()[:16]


def main(path: str, label: str) -> None:
    device.cuda()
    record = json.loads(Path(path).read_text()) if Path(path).exists() else {}
    out = record.setdefault(label, {})
    for b in (65536, 16384):
        x = engine.inputs(b, dhidden=True)
        args = [x[n] for n in ("h_t", "w1", "b1", "w2", "b2")]
        for name, p in FORWARD.items():
            head = ph.FrdHead(D, F, H, A, launch={"forward": p, "forward_loss": p})
            hidden, _, grad_logits, _ = head.forward_loss(*args, x["labels"])
            out[f"{b}:forward:{name}"] = {
                "digest": digest(head.forward(*args)),
                "us": gpu_time_us(lambda: head.forward(*args))["median_us"]}
            out[f"{b}:forward_loss:{name}"] = {
                "digest": digest(head.forward_loss(*args, x["labels"])),
                "us": gpu_time_us(lambda: head.forward_loss(*args, x["labels"]))["median_us"]}
        stage_args = {"grad_w2": (hidden, x["w2"], grad_logits),
                      "grad_w1": (x["h_t"], x["w1"], hidden, x["dhidden"])}
        for stage, points in BACKWARD.items():
            for name, p in points.items():
                run = getattr(ph.FrdHead(D, F, H, A, launch={stage: p}), stage)
                out[f"{b}:{stage}:{name}"] = {
                    "digest": digest(run(*stage_args[stage])),
                    "us": gpu_time_us(lambda: run(*stage_args[stage]))["median_us"]}
        for k, v in out.items():
            if k.startswith(f"{b}:"):
                print(label, k, v, flush=True)
        Path(path).write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
