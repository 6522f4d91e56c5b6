"""Feasibility of a point before anything is timed: the space's restrictions (plain
expressions over knobs, template constants and shape) and the static check (no atomics, no
spills, compiles). An infeasible point gets a reason and is never timed."""
from __future__ import annotations

import logging
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Sequence

from pycuda_heads.core.space import Point
from pycuda_heads.records import dims_label

from .spaces import TuningTask, point_key

log = logging.getLogger("pycuda_heads.tuning")

StaticCheck = Callable[[Point], str | None]


class Feasibility:
    """``feasibility(point)`` -> None when the point may be timed, else the reason it may not."""

    def __init__(self, task: TuningTask, static: StaticCheck | None = None):
        self.task = task
        self._static = static
        self._env = task.launch_env
        self._memo: dict[str, str | None] = {}

    def restriction(self, point: Point) -> str | None:
        expr = self.task.space.violated(point, self.task.template, self._env)
        return None if expr is None else f"restriction {expr!r} fails"

    def __call__(self, point: Point) -> str | None:
        key = point_key(point)
        if key not in self._memo:
            reason = self.restriction(point)
            if reason is None and self._static is not None:
                reason = self._static(point)
            self._memo[key] = reason
        return self._memo[key]

    def variant(self, point: Point) -> str:
        """The compiled variant a point is (shared by every shape and by kernels of one file)."""
        return f"{self.task.family}:{dims_label({**self.task.template, **point})}"


def spec_static(task: TuningTask, arch: str) -> StaticCheck:
    """The static check of ``task``'s kernel as a reason (None when the point is ok)."""
    from pycuda_heads.verify.static_check import NvccUnavailableError, check_kernel

    def check(point: Point) -> str | None:
        try:
            report = check_kernel(task.spec, dict(point), arch, dict(task.template))
        except NvccUnavailableError:
            raise  # a missing compiler says nothing about the point
        except RuntimeError as exc:
            return f"static check: does not compile: {str(exc).strip()[:500]}"
        return None if report.ok else "static check: " + "; ".join(report.problems())

    return check


def warm(items: Sequence[tuple[Feasibility, Point]], workers: int) -> None:
    """Decide feasibility of many points in parallel threads (nvcc runs as a subprocess).

    Points that are the same compiled variant run in one thread, one after the other: the
    static check's disk cache is then written once and never read half-written.
    """
    groups: dict[str, list[tuple[Feasibility, Point]]] = defaultdict(list)
    for feas, point in items:
        if feas.restriction(point) is None:
            groups[feas.variant(point)].append((feas, point))

    def run(group: list[tuple[Feasibility, Point]]) -> None:
        for feas, point in group:
            feas(point)

    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        for future in [pool.submit(run, g) for g in groups.values()]:
            future.result()
    log.debug("feasibility decided for %d points (%d variants)", len(items), len(groups))
