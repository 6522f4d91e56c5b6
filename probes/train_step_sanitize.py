"""A few TrainStep steps under compute-sanitizer (GPU): eager steps, a capture and replays, at an
odd B with sentinel labels. Run it as

    compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 86 \
        python probes/train_step_sanitize.py

(and --tool racecheck, initcheck, synccheck; failed driver calls are no findings, as in
``validate --sanitize``: cuda-bindings probes entry points a driver refuses); it prints the
losses and exits 0 when they are finite and the graph gave bitwise the eager steps' losses."""
import sys

import numpy as np

import pycuda_heads as ph
from pycuda_heads.perf import train_bench


def main() -> int:
    shape = {"B": 3, "K": 9}
    params, data = train_bench.model(shape)
    losses = []
    for graph in (False, True):
        step = ph.TrainStep(5, 128, shape["B"], shape["K"], lr=1e-3)
        step.load(params)
        step.feed(**data)
        losses.append([float((step.replay() if graph else step.run()).get()[0])
                       for _ in range(3)])
        step.synchronize()
    print("eager", losses[0], "graph", losses[1])
    same = np.array(losses[0], np.float32).tobytes() == np.array(losses[1], np.float32).tobytes()
    return 0 if same and np.isfinite(losses).all() else 1


if __name__ == "__main__":
    sys.exit(main())
