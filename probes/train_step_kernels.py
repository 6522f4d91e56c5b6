"""Where a TrainStep's time goes: per shape, the graph replay's and the eager step's wall time
per step, and each launch of one eager step timed alone on the GPU (entry, grid, median us;
both streams' launches, in the order they were made: probes/train_step_notes.md lists them).

    source .gpu/env.sh && python probes/train_step_kernels.py $OUT/train_step_kernels.json
"""
from __future__ import annotations

import json
import sys

from pycuda_heads.perf import train_bench
from pycuda_heads.perf.step_bench import wall_us

SHAPES = ({"B": 2, "K": 8}, {"B": 256, "K": 64}, {"B": 1024, "K": 64})


def main(path: str) -> None:
    out = []
    for shape in SHAPES:
        params, data = train_bench.model(shape)
        step = train_bench.library_step(shape, params, data)
        wall = wall_us({"graph": (step.replay, step.synchronize),
                        "eager": (step.run, step.synchronize)})
        kernels = train_bench.kernel_sum_us(step, reps=30)
        row = {"shape": shape, "graph_us": wall["graph"]["median_us"],
               "eager_us": wall["eager"]["median_us"], "kernel_sum_us": kernels["median_us"],
               "kernels": kernels["note"].split("; ")}
        print(json.dumps(row, indent=1), flush=True)
        out.append(row)
    with open(path, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
