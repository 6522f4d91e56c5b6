"""Issue 34 probe: does an early trigger of the next launch pay in the pool's fwd+bwd chain?
At B=1024, K=128 the chain is 1.4 us short of 75% of its floor (69.5 us against 68.1). Every
pool kernel waits for the previous one (programmatic dependent launch) but none triggers the
next, so the next grid launches only as the last block exits. An early trigger at entry was
measured worse (the next grid's blocks took SM slots: reports/nvidia-h200/probes/pool_pdl.json);
this one comes late, once a warp has left its key loop, when only the epilogue is left:

    plain  the shipped sources
    fwd    layout 2's forward triggers after its warps' last row leaves the key loop
    bwd    layout 2's backward triggers after its key loop, before the merge into its scratch
           row (the reduce, which waits first, launches during that merge)
    both

Sources patched into a temporary copy of cu/; the shipped tuned launches passed explicitly
(a patched op's source hash has no tuned entries). Per shape and variant: fwd+bwd GPU time and
whether every output is bitwise the plain one.

    source .gpu/env.sh && python probes/pool_trigger.py $OUT/pool_trigger.json
"""
from __future__ import annotations

import functools
import json
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

import pycuda_heads as ph
from pycuda_heads.core import device
from pycuda_heads.core.source import cu_dir
from pycuda_heads.perf.timing import gpu_time_us
from pycuda_heads.records import git_state
from pool_chain import chain, shipped  # probes/: the script's folder

# (N_HORIZONS, HIDDEN_DIM, B, K): the shape short of the bar, the two layout-2 shapes that meet it
SHAPES = ((5, 128, 1024, 128), (5, 128, 4096, 64), (2, 1024, 256, 64))
TRIGGER = """
// The next launch may begin: this grid's blocks are in their epilogues.
__device__ __forceinline__ void pool_trigger()
{
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}
"""
FORWARD_AT = """            cslot = cslot + 1 == STAGES ? 0 : cslot + 1;
        }
#if LANE_ACC
        float* ctxb"""
BACKWARD_AT = """    // Every copy has landed (the last groups committed are empty)"""


def patched(fwd: bool, bwd: bool) -> Path:
    """A copy of cu/ whose layout 2 triggers where asked."""
    folder = Path(tempfile.mkdtemp(prefix="pool-trigger-"))
    for f in cu_dir().iterdir():
        if f.suffix in (".cu", ".cuh"):
            shutil.copy(f, folder / f.name)
    path = folder / "pool_layout2.cuh"
    text = path.read_text()
    assert text.count(FORWARD_AT) == 1 and text.count(BACKWARD_AT) == 1
    head = '#include "pool_ring.cuh"\n'
    text = text.replace(head, head + TRIGGER, 1)
    if fwd:
        text = text.replace(FORWARD_AT, FORWARD_AT.replace(
            "        }\n#if", "        }\n        if (r == w.rows - 1) pool_trigger();\n#if"))
    if bwd:
        text = text.replace(BACKWARD_AT, "    pool_trigger();\n" + BACKWARD_AT)
    path.write_text(text)
    return folder


def main(out: str) -> None:
    device.cuda()
    variants = {"plain": None, "fwd": patched(True, False), "bwd": patched(False, True),
                "both": patched(True, True)}
    record = {"what": __doc__.split("\n")[0], "commit": git_state()["describe"],
              "gpu": device.gpu_name(), "shapes": []}
    rng = np.random.default_rng(0)
    for h, d, b, k in SHAPES:
        base, (q, ln, gc) = shipped(rng, h, d, b, k)
        launch = {role: base.chosen[role]["params"] for role in ("forward", "backward")}
        entry = {"N_HORIZONS": h, "HIDDEN_DIM": d, "B": b, "K": k, "launch": launch,
                 "fwd+bwd_us": {}, "bitwise_plain": {}}
        plain_bits = None
        for name, folder in variants.items():
            cls = ph.PerHorizonAttentionPool if folder is None else type(
                f"Pool_{name}", (ph.PerHorizonAttentionPool,), {"SOURCE_DIR": folder})
            pool = cls(h, d, launch=launch)
            run = functools.partial(chain, pool, q, ln, gc)
            bits = [o.get().tobytes() for o in run()]
            plain_bits = plain_bits or bits
            entry["bitwise_plain"][name] = bits == plain_bits
            entry["fwd+bwd_us"][name] = round(gpu_time_us(run)["median_us"], 2)
        record["shapes"].append(entry)
        print(json.dumps(entry), flush=True)
        Path(out).write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main(sys.argv[1])
