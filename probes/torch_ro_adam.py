"""Why the library's pool model loses a few percent to plain torch under
``torch.compile(mode="reduce-overhead")`` at small shapes: the breakdown probe's cuts say its
forward + backward is cheaper than torch's but its fused Adam step after that backward costs
70-150 us more host time. This times ``opt.step()`` alone (host time, the GPU idle before it)
after each implementation's compiled backward, with the gradients as the backward left them
(the library's are views of one packed row per op) and as separate copies, to tell whether the
views are the cause. Writes JSON.

    source .gpu/env.sh && python probes/torch_ro_adam.py OUT.json
"""
from __future__ import annotations

import json
import statistics
import sys
import time

import torch

from pycuda_heads.perf import torch_train

STEPS = 300


def adam_host_us(loss_fn, params, inputs, copies: bool) -> dict[str, float]:
    fn = torch.compile(loss_fn, mode="reduce-overhead", fullgraph=True, dynamic=False)
    opt = torch.optim.Adam(params, lr=1e-3, fused=True)
    leaves = [x for x in inputs if x.requires_grad]
    times, views = [], 0
    for i in range(STEPS + 20):
        torch.compiler.cudagraph_mark_step_begin()
        fn(*inputs).backward()
        if copies:
            for p in params:
                p.grad = p.grad.clone()
        views = sum(p.grad._base is not None for p in params)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        opt.step()
        t1 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        for x in leaves:
            x.grad = None
        if i >= 20:
            times.append((t1 - t0) * 1e6)
    return {"median_us": round(statistics.median(times), 2), "min_us": round(min(times), 2),
            "grads_that_were_views": views}


def main(out: str) -> None:
    record = {"what": __doc__.split("\n")[0], "torch": torch.__version__, "steps": STEPS,
              "cases": []}
    for model, shape in (("pool", {"B": 2, "K": 8}), ("pool", {"B": 256, "K": 64}),
                         ("frd", {"B": 4096})):
        for copies in (False, True):
            library, plain, lib_params, plain_params = torch_train.models(torch, model)
            for impl, fn, params in (("library", library, lib_params),
                                     ("torch", plain, plain_params)):
                torch._dynamo.reset()
                case = {"model": model, "shape": shape, "impl": impl,
                        "grads": "copies" if copies else "as returned",
                        **adam_host_us(fn, params, torch_train.batch(torch, model, shape),
                                       copies)}
                print(json.dumps(case), flush=True)
                record["cases"].append(case)
                json.dump(record, open(out, "w"), indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
