"""Issue 34 probe: does the pool's backward gain from reading ln in the reverse of the
forward's key order? The forward streams each row's keys in ascending order, so when it ends
the L2 holds the rows' last keys; a backward that walks the keys from the end reads those
first. Layout 2 only (its Walk); grad_ln is the same bits either way, grad_q_h's sum runs in
the other order.

Times, at the tuned launches, fwd+bwd chained (the bench's row) with the shipped backward and
with the reversed one (a patched copy of cu/, same launch parameters), and each backward
alone; checks grad_ln bitwise and grad_q_h against the shipped one.

    source .gpu/env.sh && python probes/pool_l2_order.py $OUT/pool_l2_order.json
"""
from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import pycuda.gpuarray as ga

import pycuda_heads as ph
from pycuda_heads.core import device
from pycuda_heads.core.source import cu_dir
from pycuda_heads.perf.timing import gpu_time_us
from pycuda_heads.records import git_state

SHAPES = ((5, 128, 1024, 128), (5, 128, 4096, 64), (5, 128, 4096, 256), (5, 128, 64, 4096),
          (2, 1024, 256, 64), (5, 128, 256, 64))
FORWARD_ORDER = "__device__ int key0(const int j) const { return (wt + j * TW) * SKEYS; }"
REVERSED = ("__device__ int key0(const int j) const {\n"
            "        return ((K_STEPS_OF(this) - 1) - (wt + j * TW)) * SKEYS; }")


def reversed_sources() -> Path:
    """A copy of cu/ whose Walk takes each row's steps from the last."""
    folder = Path(tempfile.mkdtemp(prefix="pool-l2-order-"))
    for f in cu_dir().iterdir():
        shutil.copy(f, folder / f.name)
    ring = folder / "pool_ring.cuh"
    text = ring.read_text()
    assert FORWARD_ORDER in text, "pool_ring.cuh's Walk changed: update the probe"
    text = text.replace("int first_row, stride, rows, per_row, wt;",
                        "int first_row, stride, rows, per_row, wt, nsteps;")
    text = text.replace("const int nsteps = (K + SKEYS - 1) / SKEYS;",
                        "nsteps = (K + SKEYS - 1) / SKEYS;")
    text = text.replace(FORWARD_ORDER, REVERSED.replace("K_STEPS_OF(this)", "nsteps"))
    ring.write_text(text)
    return folder


def main(out: str) -> None:
    device.cuda()
    src = reversed_sources()

    class Reversed(ph.PerHorizonAttentionPool):
        SOURCE_DIR = src

    record = {"what": __doc__.split("\n")[0], "commit": git_state()["describe"],
              "gpu": device.gpu_name(), "shapes": []}
    rng = np.random.default_rng(0)
    for h, d, b, k in SHAPES:
        q = ga.to_gpu(rng.standard_normal((h, d), dtype=np.float32))
        ln = ga.to_gpu(rng.standard_normal((b, k, d), dtype=np.float32))
        gc = ga.to_gpu(rng.standard_normal((b, h, d), dtype=np.float32))
        base = ph.PerHorizonAttentionPool(h, d)
        ctx, attn = base.forward(q, ln)
        gq0, gl0 = (x.get() for x in base.backward(q, ln, attn, gc, ctx))
        launch = {r: base.chosen[r]["params"] for r in ("forward", "backward")}
        rev = Reversed(h, d, launch=launch)
        gq1, gl1 = (x.get() for x in rev.backward(q, ln, attn, gc, ctx))
        entry = {"H": h, "D": d, "B": b, "K": k, "launch": launch,
                 "grad_ln_bitwise": bool(np.array_equal(gl0, gl1)),
                 "grad_q_h_max_rel": float(np.abs(gq1 - gq0).max() / np.abs(gq0).max())}

        def chain(bwd) -> None:
            c, a = base.forward(q, ln)
            bwd.backward(q, ln, a, gc, c)

        entry["us"] = {
            "fwd+bwd": gpu_time_us(lambda: chain(base))["median_us"],
            "fwd+bwd reversed": gpu_time_us(lambda: chain(rev))["median_us"],
            "backward": gpu_time_us(lambda: base.backward(q, ln, attn, gc, ctx))["median_us"],
            "backward reversed": gpu_time_us(lambda: rev.backward(q, ln, attn, gc, ctx))["median_us"],
            "forward": gpu_time_us(lambda: base.forward(q, ln))["median_us"]}
        entry["us"] = {n: round(v, 2) for n, v in entry["us"].items()}
        record["shapes"].append(entry)
        print(json.dumps(entry), flush=True)
        Path(out).write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main(sys.argv[1])
