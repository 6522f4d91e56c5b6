"""Split-K as the pool op runs it (``split_count`` in pycuda_heads/ops/pool.py), swept over the
rule's two numbers, SPLIT_ROWS (rows the split aims at) and SPLIT_KEYS (fewest keys a virtual
row keeps), and over a few launch points of the layouts on those rows, at long-sequence shapes:
GPU time per pass beside the memory floor, error against float64 (pass or fail by the library's
validation tolerance), bitwise reruns, and at each split the layouts' passes alone on the
virtual rows (the rest is the joins'). It says which rule and launches the tuner should search
(the rule is fixed today).

    source .gpu/env.sh && python probes/pool_splitk/virtual.py OUT.json [--rule-only]

``--rule-only``: the op's own rule and tuned launch alone at each shape (about 20 s, to see a
change of the joins), not the sweep.
"""
from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pycuda.gpuarray as ga

from pycuda_heads import reference as ref
from pycuda_heads.core import device
from pycuda_heads.ops import pool as pool_module
from pycuda_heads.perf.bench import CudaHarness
from pycuda_heads.perf.timing import gpu_time_us
from pycuda_heads.records import git_state
from pycuda_heads.verify.checks import compare

H, D = 5, 128
SHAPES = ((64, 4096), (16, 16384), (2, 65536))
RULES = tuple(itertools.product((512, 1024, 2048, 4096), (128, 256, 512)))
# None: the tuned table's launch at the shape; the others: the layouts' rows at other points
LAUNCHES = (None, {"forward": {"GRID": 2}, "backward": {"GRID": 2}},
            {"forward": {"TEAMS": 2, "LANE_ACC": 0}, "backward": {"TEAMS": 2}},
            {"forward": {"STAGES": 6}, "backward": {"STAGES": 6, "GROUP_KEYS": 2}})


def layouts_alone(params: dict, q_h: Any, ln: Any, grad_ctx: Any, split: int) -> dict:
    """The layouts' passes alone on the virtual rows (what is left of the split op's time is the
    joins'): the same launch on ln viewed as [B*split, K/split, D], a shape that splits no more
    (its softmax per virtual row: the same work)."""
    b, k, _ = ln.shape
    rows = ln.reshape(b * split, k // split, D)
    grads = ga.to_gpu(np.repeat(grad_ctx.get(), split, axis=0))
    pool = pool_module.PerHorizonAttentionPool(H, D, launch=params)
    assert pool_module.split_count(b * split, k // split) == 1
    ctx, attn = pool.forward(q_h, rows)
    return {"forward": gpu_time_us(lambda: pool.forward(q_h, rows))["median_us"],
            "backward": gpu_time_us(
                lambda: pool.backward(q_h, rows, attn, grads, ctx))["median_us"]}


def main(out: str, rule_only: bool) -> None:
    bandwidth = CudaHarness().copy_bandwidth_gbps()
    rng = np.random.default_rng(0)
    record = {"what": __doc__.split("\n")[0], "commit": git_state()["describe"],
              "gpu": device.gpu_name(), "copy_bandwidth_GBps": round(bandwidth, 1), "shapes": []}
    for b, k in SHAPES:
        q_h = rng.standard_normal((H, D)).astype(np.float32)
        ln = rng.standard_normal((b, k, D)).astype(np.float32)
        grad_ctx = rng.standard_normal((b, H, D)).astype(np.float32)
        forward = ref.pool_forward(q_h, ln)
        want = (*forward, *ref.pool_backward(q_h, ln, forward[1], grad_ctx))
        f32 = (*ref.pool_forward(q_h, ln, dtype=np.float32),
               *ref.pool_backward(q_h, ln, forward[1], grad_ctx, dtype=np.float32))
        d_q, d_ln, d_g = map(ga.to_gpu, (q_h, ln, grad_ctx))
        floor = {"forward": 4 * (b * k * D + b * H * k + b * H * D) / bandwidth / 1e3,
                 "backward": 4 * (2 * b * k * D + b * H * k + 2 * b * H * D) / bandwidth / 1e3}
        entry = {"B": b, "K": k, "floor_us": floor, "points": []}
        seen = set()
        points = (((pool_module.SPLIT_ROWS, pool_module.SPLIT_KEYS), None),) if rule_only \
            else itertools.product(RULES, LAUNCHES)
        for (rows, keys), launch in points:
            pool_module.SPLIT_ROWS, pool_module.SPLIT_KEYS = rows, keys
            split = pool_module.split_count(b, k)
            if (split, json.dumps(launch)) in seen:
                continue
            seen.add((split, json.dumps(launch)))
            pool = pool_module.PerHorizonAttentionPool(H, D, launch=launch)
            ctx, attn = pool.forward(d_q, d_ln)
            gq, gln = pool.backward(d_q, d_ln, attn, d_g, ctx)
            again = pool.backward(d_q, d_ln, attn, d_g, ctx)
            point = {"SPLIT_ROWS": rows, "SPLIT_KEYS": keys, "split": split, "launch": launch,
                     "params": {r: c["params"] for r, c in pool.chosen.items()},
                     "checks": {name: compare(got.get(), w, f) for name, got, w, f in zip(
                         ("ctx", "attn", "grad_q_h", "grad_ln"), (ctx, attn, gq, gln), want, f32)},
                     "rerun_bitwise": bool((again[1].get() == gln.get()).all()),
                     "forward_us": gpu_time_us(lambda: pool.forward(d_q, d_ln))["median_us"],
                     "backward_us": gpu_time_us(
                         lambda: pool.backward(d_q, d_ln, attn, d_g, ctx))["median_us"]}
            if split > 1:
                point["layouts_us"] = layouts_alone(point["params"], d_q, d_ln, d_g, split)
            entry["points"].append(point)
            total = point["forward_us"] + point["backward_us"]
            print(b, k, split, launch, round(point["forward_us"], 1),
                  round(point["backward_us"], 1), "%.0f%% of the floor" % (
                      100 * sum(floor.values()) / total),
                  "rel err %.2e" % max(c["max_rel_err"] for c in point["checks"].values()),
                  "passes" if all(c["passed"] for c in point["checks"].values()) else "FAILS",
                  flush=True)
        record["shapes"].append(entry)
        Path(out).write_text(json.dumps(record, indent=1))  # after each shape: a cut run keeps it


if __name__ == "__main__":
    main(sys.argv[1], "--rule-only" in sys.argv[2:])
