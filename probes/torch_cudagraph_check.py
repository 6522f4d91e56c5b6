"""Does torch.compile(mode="reduce-overhead") run each torch_train model from CUDA graphs?
For every model and implementation: the cudagraph skips inductor counted, the skip messages
it logged, and the fastest-of-runs wall time per step. Writes JSON.

    source .gpu/env.sh && python probes/torch_cudagraph_check.py OUT.json
"""
from __future__ import annotations

import json
import logging
import sys
import time

import torch
from torch._dynamo.utils import counters

from pycuda_heads.perf import torch_train


class _Messages(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.seen.append(record.getMessage()[:600])


def main(out: str) -> None:
    handler = _Messages()
    for name in ("torch._inductor.cudagraph_trees", "torch._inductor.compile_fx",
                 "torch._inductor.cudagraph_utils", "torch._inductor"):
        logging.getLogger(name).addHandler(handler)
    record = {"what": __doc__.split("\n")[0], "torch": torch.__version__, "cases": []}
    for model, shape in (("pool", {"B": 2, "K": 8}), ("frd", {"B": 256})):
        for impl in ("library", "torch"):
            torch._dynamo.reset()
            counters.clear()
            handler.seen.clear()
            library, plain, lib_params, plain_params = torch_train.models(torch, model)
            fn, params = (library, lib_params) if impl == "library" else (plain, plain_params)
            step = torch_train.train_step(torch, fn, params, torch_train.batch(torch, model, shape),
                                          "reduce-overhead")
            for _ in range(5):
                step()
            torch.cuda.synchronize()
            runs = []
            for _ in range(11):
                t0 = time.perf_counter()
                for _ in range(100):
                    step()
                torch.cuda.synchronize()
                runs.append((time.perf_counter() - t0) / 100 * 1e6)
            record["cases"].append({
                "model": model, "shape": shape, "impl": impl,
                "cudagraph_skips": counters["inductor"]["cudagraph_skips"],
                "inductor_counters": {k: v for k, v in counters["inductor"].items()},
                "messages": [m for m in handler.seen if "cudagraph" in m.lower()][:5],
                "min_us": round(min(runs), 1), "median_us": round(sorted(runs)[5], 1)})
            json.dump(record, open(out, "w"), indent=1)
    print(json.dumps(record, indent=1))


if __name__ == "__main__":
    main(sys.argv[1])
