"""GPU timing with CUDA events: median and 20th/80th percentiles over warm repetitions.

Python enqueues a small launch in tens of microseconds, often longer than the kernel runs, so
events around a single call would time the host. Each repetition therefore first launches a spin
kernel that holds the GPU for longer than the host needs to enqueue the batch, then times a batch
of calls back to back on the device and divides by the batch size.
"""
from __future__ import annotations

import time
from functools import lru_cache
from typing import Any, Callable

import numpy as np

from ..core.device import cuda


@lru_cache(maxsize=None)
def _helpers() -> tuple[Any, Any]:
    from ..core.compile import load_module
    module = load_module("timing_spin", {})
    spin, empty = module.get_function("spin"), module.get_function("empty_kernel")
    spin.prepare("q")
    empty.prepare("")
    return spin, empty


def empty_launch() -> None:
    """Launch a kernel that does nothing: the reference for the smallest shapes."""
    _helpers()[1].prepared_call((1, 1, 1), (1, 1, 1))


def gpu_time_us(fn: Callable[[], object], reps: int = 30, warmup: int = 3,
                target_ms: float = 0.5) -> dict[str, float]:
    """Per-call GPU time of ``fn`` (which only enqueues work) in microseconds, and the host's
    wall-clock cost of one call (``python_call_us``, timed while the GPU spins), and the
    per-batch times (``samples_us``).

    The batch size grows until a batch runs for about ``target_ms`` on the GPU; ``reps`` batches
    give the median and spread.
    """
    drv = cuda()
    spin = _helpers()[0]
    for _ in range(warmup):
        fn()
    drv.Context.synchronize()
    # The host's enqueue cost per call (no synchronisation inside: that is not enqueue time).
    t0 = time.perf_counter()
    for _ in range(4):
        fn()
    host_s = [(time.perf_counter() - t0) / 4]
    drv.Context.synchronize()
    start, stop = drv.Event(), drv.Event()

    def batch(n: int) -> tuple[float, float]:
        for attempt in range(3):
            # hold the GPU for twice the time the host needs to enqueue n calls
            spin_ns = int(2e9 * host_s[0] * n) + 20_000
            spin.prepared_call((1, 1, 1), (1, 1, 1), np.int64(spin_ns))
            start.record()
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            host = (time.perf_counter() - t0) / n
            stop.record()
            stop.synchronize()
            # A call that synchronises inside waits out the spin whatever its length: after
            # two longer tries its time is taken as it is.
            if host * n * 1e9 < spin_ns or attempt == 2:
                return stop.time_since(start) * 1e3 / n, host * 1e6
            host_s[0] = 1.5 * host  # the GPU may have waited for the host: again, longer
        raise AssertionError("unreachable")

    n = 1
    while n < 256 and batch(n)[0] * n < target_ms * 1e3:  # deeper batches can fill the queue
        n *= 4
    gpu, host = np.asarray([batch(n) for _ in range(reps)]).T
    return {"median_us": float(np.median(gpu)), "p20_us": float(np.percentile(gpu, 20)),
            "p80_us": float(np.percentile(gpu, 80)), "reps": int(reps), "batch": int(n),
            "python_call_us": float(np.median(host)), "samples_us": [float(g) for g in gpu]}
