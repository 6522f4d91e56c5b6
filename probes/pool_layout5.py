"""Issue 34: LAYOUT 5 (wide rows through a ring of 16-key slots, tensor-core products) against
the shipped launches, GPU time of each pass at the wide suite shapes, before any tuning: each
pass over its own points, the other pass at its shipped launch. Each point's outputs are
compared with the shipped launch's (max abs difference over the largest value), so a wrong
point shows at once. One JSON line a point; the record into $1.

    source .gpu/env.sh && PYCUDA_HEADS_COMMIT=<commit> python probes/pool_layout5.py \
        $OUT/pool_layout5.json [--roles forward,backward] [--shapes 8,512,1024,128 ...] \
        [--points 'forward={"GRID": 3}' ...]

(the device's copy of .git can be stale: the commit named in the environment goes into the
record; `--roles ""` times the shipped launches alone)
"""
from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

import numpy as np
import pycuda.gpuarray as ga

import pycuda_heads as ph
from pycuda_heads.core import device
from pycuda_heads.perf.timing import gpu_time_us
from pycuda_heads.records import git_state
from pool_shipped import shipped  # probes/ is this script's folder

SHAPES = ((8, 512, 1024, 128), (32, 128, 512, 64))
_KNOBS = {"VEC": 4, "UNROLL": 1, "LAYOUT": 5, "GROUP": 32, "TEAMS": 1, "GROUP_KEYS": 1,
          "CHUNK": 4096}
POINTS = {
    "forward": [{**_KNOBS, "QREG": 0, "SMEM_SCORES": 0, "LANE_ACC": 0, "BLOCK": bl, "STAGES": st,
                 "MIN_BLOCKS": mb, "GRID": 0}
                for bl, st, mb in itertools.product((128, 256, 512), (2, 3), (0, 2, 3))
                if bl * mb <= 1024],
    "backward": [{**_KNOBS, "BLOCK": bl, "STAGES": st, "MIN_BLOCKS": mb, "GRID": gr}
                 for bl, st, mb, gr in itertools.product((256, 512), (2, 3), (0, 2, 3), (0, 2, 3))
                 if bl * mb <= 1024]}


def rel(a, b) -> float:
    a, b = a.get().astype(np.float64), b.get().astype(np.float64)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


def main(out: str, roles: list[str], shapes: list[tuple[int, ...]],
         points: dict[str, list[dict]] | None = None) -> None:
    """Each role's POINTS, or where ``points`` names a role, those changes of its shipped
    launch instead."""
    device.cuda()  # the context, before the first allocation
    rng = np.random.default_rng(0)
    record = {"what": __doc__.split("\n")[0], "commit": git_state()["describe"], "rows": []}
    for h, d, b, k in shapes:
        q, ln, gc = (ga.to_gpu(rng.standard_normal(s, dtype=np.float32))
                     for s in ((h, d), (b, k, d), (b, h, d)))
        launch = shipped(h, d, b, k)
        base = ph.PerHorizonAttentionPool(h, d, launch=launch)
        ctx0, attn0 = base.forward(q, ln)
        gq0, gln0 = base.backward(q, ln, attn0, gc, ctx0)
        runs = [("both", "shipped", base)]
        for role in roles:
            mine = [{**launch[role], **c} for c in points[role]] if role in (points or {}) \
                else POINTS[role]
            for p in mine:
                try:
                    runs.append((role, json.dumps({n: p[n] for n in ("BLOCK", "STAGES",
                                                                     "MIN_BLOCKS", "GRID")}),
                                 ph.PerHorizonAttentionPool(
                                     h, d, launch={**launch, role: p})))
                except ValueError as e:  # a point the shape does not allow
                    print(f"skip {role} {p}: {e}", flush=True)
        for role, name, pool in runs:
            row = {"H": h, "D": d, "B": b, "K": k, "role": role, "point": name}
            try:
                ctx, attn = pool.forward(q, ln)
                gq, gln = pool.backward(q, ln, attn0, gc, ctx0)
                row["err"] = {"ctx": rel(ctx, ctx0), "attn": rel(attn, attn0),
                              "grad_q": rel(gq, gq0), "grad_ln": rel(gln, gln0)}
                if role != "backward":
                    row["forward_us"] = gpu_time_us(lambda: pool.forward(q, ln),
                                                    reps=15)["median_us"]
                if role != "forward":
                    row["backward_us"] = gpu_time_us(
                        lambda: pool.backward(q, ln, attn0, gc, ctx0), reps=15)["median_us"]
                row["chosen"] = {r: pool.chosen[r]["params"]["LAYOUT"] for r in pool.chosen}
            except Exception as e:  # noqa: BLE001  a failing point is data here
                row["error"] = f"{type(e).__name__}: {e}"[:300]
            print(json.dumps(row), flush=True)
            record["rows"].append(row)
            Path(out).write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--roles", default="forward,backward")
    ap.add_argument("--shapes", nargs="*", default=[",".join(map(str, s)) for s in SHAPES])
    ap.add_argument("--points", nargs="*", default=[], metavar="ROLE=JSON",
                    help="changes of the shipped launch to time, in place of the role's POINTS")
    a = ap.parse_args()
    given: dict[str, list[dict]] = {}
    for item in a.points:
        role, _, change = item.partition("=")
        given.setdefault(role, []).append(json.loads(change))
    main(a.out, [r for r in a.roles.split(",") if r],
         [tuple(map(int, s.split(","))) for s in a.shapes], given)
