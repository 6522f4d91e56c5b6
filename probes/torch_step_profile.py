"""Where the host time of the library's eager pool training step (B=2, K=8) goes, backward
included: the step timed with torch's autograd threads on and off, then cProfile of many steps
with the backward on the calling thread (so the profile sees it). Writes JSON and the profile's
top functions as text beside it.

    source .gpu/env.sh && python probes/torch_step_profile.py OUT.json
"""
from __future__ import annotations

import cProfile
import io
import json
import pstats
import sys

import torch

from host_timing import per_call_runs
from pycuda_heads.perf import torch_train


def per_step_us(step, runs: int = 11, n: int = 200) -> float:
    return round(min(per_call_runs(step, torch.cuda.synchronize, n, runs, warm=20)), 1)


def main(out: str) -> None:
    record: dict = {"what": __doc__.split("\n")[0], "torch": torch.__version__, "min_us": {}}
    for impl in ("library", "torch"):
        library, plain, lib_params, plain_params = torch_train.models(torch, "pool")
        fn, params = (library, lib_params) if impl == "library" else (plain, plain_params)
        step = torch_train.train_step(torch, fn, params,
                                      torch_train.batch(torch, "pool", {"B": 2, "K": 8}), None)
        record["min_us"][f"{impl}, autograd threads"] = per_step_us(step)
        torch.autograd.set_multithreading_enabled(False)
        record["min_us"][f"{impl}, backward on the calling thread"] = per_step_us(step)
        if impl == "library":
            profile = cProfile.Profile()
            profile.enable()
            for _ in range(500):
                step()
            torch.cuda.synchronize()
            profile.disable()
            text = io.StringIO()
            stats = pstats.Stats(profile, stream=text)
            stats.sort_stats("tottime").print_stats(30)
            stats.sort_stats("cumulative").print_stats(40)
            with open(out.replace(".json", "_profile.txt"), "w") as f:
                f.write(text.getvalue())
        torch.autograd.set_multithreading_enabled(True)
        json.dump(record, open(out, "w"), indent=1)
    print(json.dumps(record, indent=1))


if __name__ == "__main__":
    main(sys.argv[1])
