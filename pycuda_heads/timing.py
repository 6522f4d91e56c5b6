"""GPU timing with CUDA events: warm launches, median and 20th/80th percentiles."""
from __future__ import annotations

from typing import Callable

import numpy as np

from .device import cuda


def gpu_time_us(fn: Callable[[], object], reps: int = 50, warmup: int = 5,
                min_reps: int = 5) -> dict[str, float]:
    """Per-call GPU time of ``fn`` (which launches asynchronously) in microseconds.

    Each repetition is bracketed by its own event pair so the spread is visible; ``reps`` shrinks
    for slow calls so one measurement stays near a few hundred milliseconds.
    """
    drv = cuda()
    for _ in range(warmup):
        fn()
    start, stop = drv.Event(), drv.Event()
    start.record()
    fn()
    stop.record()
    stop.synchronize()
    first_ms = stop.time_since(start)
    reps = max(min_reps, min(reps, int(300.0 / max(first_ms, 1e-3))))
    times = []
    for _ in range(reps):
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        times.append(stop.time_since(start) * 1e3)
    t = np.asarray(times)
    return {"median_us": float(np.median(t)), "p20_us": float(np.percentile(t, 20)),
            "p80_us": float(np.percentile(t, 80)), "reps": int(reps)}
