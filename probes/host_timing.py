"""The torch probes' timing loops: runs of back-to-back calls, each run ended by one
synchronisation (the wall time per call of each run), or the host's time to issue them alone;
and the GPU time of a call's kernels, to tell a host-bound call from one the GPU holds back."""
import time

import torch


def per_call_runs(fn, sync, calls: int, runs: int, warm: int) -> list[float]:
    """Microseconds per call of each of ``runs`` runs of ``calls`` calls, after ``warm`` calls:
    the wall time, each run's closing synchronisation timed."""
    return _runs(fn, sync, calls, runs, warm, issue_only=False)


def issue_runs(fn, sync, calls: int, runs: int, warm: int) -> list[float]:
    """Microseconds of host time per call to issue ``calls`` calls, for each of ``runs`` runs:
    the GPU is drained before each run and the closing synchronisation is not timed, so with
    fewer launches per run than the launch queue holds the host never waits on the GPU (a call
    whose kernels outlast its host time would otherwise time the GPU)."""
    return _runs(fn, sync, calls, runs, warm, issue_only=True)


def _runs(fn, sync, calls: int, runs: int, warm: int, issue_only: bool) -> list[float]:
    for _ in range(warm):
        fn()
    sync()
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        if issue_only:
            out.append((time.perf_counter() - t0) / calls * 1e6)
        sync()  # drains the GPU: the next run starts from an empty queue either way
        if not issue_only:
            out.append((time.perf_counter() - t0) / calls * 1e6)
    return out


def gpu_work(fn, steps: int = 20) -> tuple[float, float]:
    """(GPU time of ``fn``'s kernels per call, kernels per call), from the profiler's kernel
    records, so a step's wall time can be split into what the GPU needs and what the host
    adds."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            fn()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == DeviceType.CUDA]
    return round(sum(e.device_time for e in kernels) / steps, 2), len(kernels) / steps


def gpu_us(fn, steps: int = 20) -> float:
    """The GPU time of ``fn``'s kernels per call."""
    return gpu_work(fn, steps)[0]
