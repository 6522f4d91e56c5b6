"""Print every LAYOUT 4 point of both pool passes as gpu_round.sh's TUNE_TRY items
(KERNEL=JSON), so a re-tune of a LAYOUT 4 shape times the layout's whole grid of launches
(BLOCK x GRID x MIN_BLOCKS) before TPE goes on:

    TUNE_TRY="$(python probes/pool_l4_tries.py)"            # GRID 0, 2, 3, 4
    TUNE_TRY="$(python probes/pool_l4_tries.py --grids 0,2)"

The points come from the pool's spaces at the H=32 suite template; invalid ones are left out."""
from __future__ import annotations

import argparse
import json

from pycuda_heads.ops.pool import BACKWARD_SPACE, FORWARD_SPACE

TEMPLATE = {"N_HORIZONS": 32, "HIDDEN_DIM": 128}
SHAPE = {"B": 512, "K": 64}
GRIDS = (0, 2, 3, 4)  # GRID 1 leaves half of an SM's block slots empty

ap = argparse.ArgumentParser()
ap.add_argument("--grids", default=",".join(map(str, GRIDS)))
grids = {int(g) for g in ap.parse_args().grids.split(",")}
items = []
for space in (FORWARD_SPACE, BACKWARD_SPACE):
    for p in space.points(TEMPLATE, SHAPE):
        if p["LAYOUT"] == 4 and p["GRID"] in grids:
            items.append(f"{space.kernel}={json.dumps(p, separators=(',', ':'))}")
print(" ".join(items))
