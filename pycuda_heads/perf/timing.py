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


# A spin never holds the GPU longer than this, whatever the host measured.
_SPIN_CAP_NS = 200_000_000
# The spin that tells whether a call waits for the GPU before returning.
_PROBE_NS = 5_000_000


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
    host_s = (time.perf_counter() - t0) / 4
    drv.Context.synchronize()
    # A call that waits for the GPU inside would wait out any spin, and a spin sized by its
    # host time would grow without bound: such a call is timed as it is, with no spin.
    spin.prepared_call((1, 1, 1), (1, 1, 1), np.int64(_PROBE_NS))
    t0 = time.perf_counter()
    fn()
    blocks = (time.perf_counter() - t0) * 1e9 > _PROBE_NS / 2
    drv.Context.synchronize()
    start, stop = drv.Event(), drv.Event()

    def timed(n: int) -> tuple[float, float, bool]:
        """(GPU us per call, host s per call, whether the spin outlasted the enqueueing)."""
        spin_ns = 0 if blocks else min(int(2e9 * host_s * n) + 20_000, _SPIN_CAP_NS)
        if spin_ns:
            spin.prepared_call((1, 1, 1), (1, 1, 1), np.int64(spin_ns))
        start.record()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        host = (time.perf_counter() - t0) / n
        stop.record()
        stop.synchronize()
        return stop.time_since(start) * 1e3 / n, host, blocks or host * n * 1e9 < spin_ns

    def batch(n: int) -> tuple[float, float]:
        nonlocal host_s
        gpu, host, covered = timed(n)
        for _ in range(2):  # the GPU may have waited for the host: again, with a longer spin
            if covered:
                break
            host_s = 1.5 * host
            gpu, host, covered = timed(n)
        return gpu, host * 1e6

    n = 1
    while n < 256 and batch(n)[0] * n < target_ms * 1e3:  # deeper batches can fill the queue
        n *= 4
    gpu, host = np.asarray([batch(n) for _ in range(reps)]).T
    return {"median_us": float(np.median(gpu)), "p20_us": float(np.percentile(gpu, 20)),
            "p80_us": float(np.percentile(gpu, 80)), "reps": int(reps), "batch": int(n),
            "python_call_us": float(np.median(host)), "samples_us": [float(g) for g in gpu]}


def error_text(exc: BaseException) -> str:
    """What a failed measurement records: the error on one line, short enough for a CSV cell."""
    return f"{type(exc).__name__}: {exc}".replace("\n", " ")[:400]
