"""The GPU side of tuning: the objective (median kernel time from CUDA events over warm
launches, on random inputs that are never zeros, rotating input sets when they fit in L2;
validation is the kernel's full GPU check, ``checks.validate_case``), the current GPU, and the
warm-up that compiles every variant about to be timed. Imported only by GPU commands."""
from __future__ import annotations

import itertools
import logging
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from pycuda_heads.core import device
from pycuda_heads.core.compile import NVCC_OPTIONS, variant_arch
from pycuda_heads.core.device import cuda
from pycuda_heads.core.source import render
from pycuda_heads.core.space import Point
from pycuda_heads.perf.timing import gpu_time_us

from .session import EvaluatorBroken
from .spaces import TuningTask

MAX_INPUT_SETS = 4


class GpuEvaluator:
    def __init__(self, task: TuningTask, reps: int = 20, warmup: int = 3):
        self.task = task
        self.reps = reps
        self.warmup = warmup

    def _case(self, params: Point, seed: int) -> Any:
        # device inputs are made once per (task, seed) and shared by every candidate
        from pycuda_heads.verify.cases import Case
        return Case(self.task.spec, dict(self.task.shape), dict(params),
                    dict(self.task.template), seed=seed)

    def _launcher(self, params: Point) -> Any:
        first = self._case(params, 0)
        cases = [first] + [self._case(params, s)
                           for s in range(1, input_sets(first.floor_bytes))]
        rotation = itertools.cycle(cases)
        return lambda: next(rotation).launch()

    def time(self, params: Point) -> Mapping[str, float]:
        try:
            return gpu_time_us(self._launcher(params), reps=self.reps, warmup=self.warmup)
        except Exception as exc:
            if not context_alive():
                raise EvaluatorBroken(f"CUDA context lost: {exc}") from exc
            raise

    def interleaved(self, a: Point, b: Point, rounds: int = 6,
                    reps: int = 5) -> tuple[list[float], list[float]]:
        """Per-batch times of ``a`` and ``b``, measured in alternating rounds so that clock and
        temperature drift fall on both alike."""
        fa, fb = self._launcher(a), self._launcher(b)
        ta: list[float] = []
        tb: list[float] = []
        for _ in range(rounds):
            ta += gpu_time_us(fa, reps=reps, warmup=1)["samples_us"]
            tb += gpu_time_us(fb, reps=reps, warmup=1)["samples_us"]
        return ta, tb

    def validate(self, params: Point) -> tuple[bool, str | None]:
        from pycuda_heads.verify.checks import validate_case
        result = validate_case(self._case(params, 0))
        reason = "; ".join(result["failures"]) or "validation failed"
        if not context_alive():  # validation catches the kernel's error itself
            raise EvaluatorBroken(f"CUDA context lost during validation: {reason}")
        return (True, None) if result["passed"] else (False, reason)


def context_alive() -> bool:
    """False once a kernel fault (illegal address, trap) has poisoned the CUDA context."""
    drv = cuda()
    try:
        drv.Context.synchronize()
    except drv.Error:
        return False
    return True


def input_sets(floor_bytes: int) -> int:
    """Enough input sets that one rotation exceeds L2 (so launches see cold inputs, as in a
    training step), at most MAX_INPUT_SETS; one when a single set is already larger."""
    l2 = l2_bytes()
    if floor_bytes >= l2:
        return 1
    return min(MAX_INPUT_SETS, 1 + l2 // max(int(floor_bytes), 1))


def l2_bytes() -> int:
    drv = cuda()
    return drv.Context.get_device().get_attribute(drv.device_attribute.L2_CACHE_SIZE)


log = logging.getLogger("pycuda_heads.tuning")


def compile_source(source: str, arch: str) -> str | None:
    """Compile one rendered source into PyCUDA's disk cache; the error text when it fails."""
    from pycuda.compiler import compile as nvcc_compile
    try:
        nvcc_compile(source, no_extern_c=True, options=list(NVCC_OPTIONS), arch=arch)
    except Exception as exc:  # reported; the timing step records the failure as ERROR
        return f"{type(exc).__name__}: {exc}"
    return None


def compile_all(sources: Iterable[tuple[str, str]], workers: int) -> int:
    """Compile every distinct (source, arch); returns how many failed."""
    unique = list(dict.fromkeys(sources))
    if not unique:
        return 0
    # spawn: the parent holds a CUDA context, which a forked child must not inherit
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=max(1, workers), mp_context=context) as pool:
        errors = list(pool.map(compile_source, *zip(*unique)))
    failed = [e for e in errors if e]
    for error in failed[:3]:
        log.warning("precompile failed: %s", error[:500])
    log.info("compiled %d variants (%d failed)", len(unique), len(failed))
    return len(failed)


@dataclass(frozen=True)
class GpuContext:
    name: str
    slug: str
    arch: str
    max_shared_bytes: int

    @classmethod
    def current(cls) -> "GpuContext":
        """Raises GpuUnavailableError without PyCUDA or a device."""
        major, minor = device.compute_capability()
        return cls(device.gpu_name(), device.gpu_slug(), f"sm_{major}{minor}",
                   device.max_shared_bytes())

    def precompile(self, items: list[tuple[TuningTask, Point]], workers: int) -> int:
        constants = [({**task.template, **point}, task) for task, point in items]
        return compile_all([(render(task.family, c, task.spec.source_dir),
                             variant_arch(c) or self.arch) for c, task in constants], workers)
