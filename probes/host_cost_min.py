"""Host cost per op call on a GPU, robust to a noisy machine: each case is called back to
back (kernels too small to hide the host), and the fastest of many runs is kept. Imports
whichever pycuda_heads is first on the path, so the same file times two checkouts:

    source .gpu/env.sh && (cd .base && python ../probes/host_cost_min.py) > base.json
    python probes/host_cost_min.py > head.json

Prints JSON: per case the fastest and the median run's microseconds per call."""
import json
import statistics
import time

import numpy as np
import pycuda.gpuarray as ga

import pycuda_heads as ph
from pycuda_heads.core.device import thread_context

CALLS, RUNS = 500, 21


def timed(fn) -> dict[str, float]:
    for _ in range(100):
        fn()
    ph.synchronize()
    runs = []
    for _ in range(RUNS):
        t0 = time.perf_counter()
        for _ in range(CALLS):
            fn()
        ph.synchronize()
        runs.append((time.perf_counter() - t0) / CALLS * 1e6)
    return {"min_us": round(min(runs), 3), "median_us": round(statistics.median(runs), 3)}


def main() -> None:
    rng = np.random.default_rng(0)

    def dev(*shape, values=None):
        with thread_context():  # the library's context, as its own arrays are
            return ga.to_gpu(rng.standard_normal(shape).astype(np.float32)
                             if values is None else values)

    h, d, b, k = 5, 128, 3, 8
    gate, pool = ph.ResidualGate(h, d), ph.PerHorizonAttentionPool(h, d)
    frd, adam = ph.FrdSoftmaxCE(h, 21), ph.Adam()
    ctx, w, bias, head, alpha = dev(b, h, d), dev(h, d), dev(h), dev(b, h), dev(h)
    out, residual = gate.forward(ctx, w, bias, head, alpha)
    q, ln = dev(h, d), dev(b, k, d)
    pctx, attn = pool.forward(q, ln)
    logits = dev(b, h, 21)
    labels = dev(values=rng.integers(-1, 21, (b, h)).astype(np.int32))
    p, g, m = dev(1024), dev(1024), dev(1024)
    v = dev(values=np.ones(1024, np.float32))
    cases = {
        "resgate.forward B=3": lambda: gate.forward(ctx, w, bias, head, alpha),
        "resgate.backward B=3": lambda: gate.backward(ctx, w, alpha, residual, out),
        "pool.forward B=3,K=8": lambda: pool.forward(q, ln),
        "pool.backward B=3,K=8": lambda: pool.backward(q, ln, attn, pctx, pctx),
        "frd.softmax_ce_grad B=3": lambda: frd.softmax_ce_grad(logits, labels,
                                                               check_labels=False),
        "adam.step N=1024": lambda: adam.step(p, g, m, v, 1, inplace=True),
    }
    print(json.dumps({"library": ph.__file__, "calls": CALLS, "runs": RUNS,
                      "cases": {name: timed(fn) for name, fn in cases.items()}}, indent=1))


if __name__ == "__main__":
    main()
