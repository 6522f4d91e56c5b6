"""The GPU objective: median kernel time from CUDA events over warm launches, on random
inputs (never zeros), rotating input sets when they fit in L2; validation is the op's full
GPU suite (``Case.validate``). Needs PyCUDA and a GPU; imported only by GPU commands."""
from __future__ import annotations

import itertools
from typing import Any, Mapping

from pycuda_heads.device import cuda
from pycuda_heads.space import Point
from pycuda_heads.timing import gpu_time_us

from .session import EvaluatorBroken
from .task import TuningTask

MAX_INPUT_SETS = 4


class GpuEvaluator:
    def __init__(self, task: TuningTask, reps: int = 20, warmup: int = 3):
        self.task = task
        self.reps = reps
        self.warmup = warmup

    def _case(self, params: Point, seed: int) -> Any:
        from pycuda_heads.cases import make_case  # builds device inputs: GPU commands only
        return make_case(self.task.kernel, dict(self.task.shape), dict(params),
                         dict(self.task.template), seed=seed)

    def time(self, params: Point) -> Mapping[str, float]:
        try:
            first = self._case(params, 0)
            cases = [first] + [self._case(params, s)
                               for s in range(1, input_sets(first.floor_bytes))]
            rotation = itertools.cycle(cases)
            return gpu_time_us(lambda: next(rotation).launch(), reps=self.reps,
                               warmup=self.warmup)
        except Exception as exc:
            if not context_alive():
                raise EvaluatorBroken(f"CUDA context lost: {exc}") from exc
            raise

    def validate(self, params: Point) -> tuple[bool, str | None]:
        result = self._case(params, 0).validate()
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
