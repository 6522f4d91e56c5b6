"""The torch probes' timing loop: runs of back-to-back calls (kernels far shorter than the host
time), each run ended by one synchronisation; the wall time per call of each run."""
import time


def per_call_runs(fn, sync, calls: int, runs: int, warm: int) -> list[float]:
    """Microseconds per call of each of ``runs`` runs of ``calls`` calls, after ``warm`` calls."""
    for _ in range(warm):
        fn()
    sync()
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        out.append((time.perf_counter() - t0) / calls * 1e6)
    return out
