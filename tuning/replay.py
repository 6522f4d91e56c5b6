"""Replaying a finished (exhaustive) cache: an evaluator and a feasibility check that look
results up instead of measuring, so the tuner can be studied on the CPU."""
from __future__ import annotations

from typing import Mapping

from pycuda_heads.space import Point

from .cache import COMPLETE, ERROR, FAILED_VALIDATION, INFEASIBLE, Evaluation
from .spaces import point_key


class Replay:
    """Feasibility (``replay(point)``) and evaluator (``time``/``validate``) from recorded
    evaluations. A timed configuration that was never validated (it was slower than a
    validated one) is taken to pass."""

    def __init__(self, evaluations: list[Evaluation]):
        self._evals = {point_key(e.params): e for e in evaluations}

    def covers(self, points: list[Point]) -> bool:
        return all(point_key(p) in self._evals for p in points)

    def _get(self, params: Point) -> Evaluation:
        return self._evals[point_key(params)]

    def __call__(self, params: Point) -> str | None:
        ev = self._get(params)
        return ev.reason if ev.state == INFEASIBLE else None

    def time(self, params: Point) -> Mapping[str, float]:
        ev = self._get(params)
        if ev.state == ERROR:
            raise RuntimeError(ev.reason or "recorded error")
        return {"median_us": ev.time_us, "p20_us": ev.p20_us, "p80_us": ev.p80_us}

    def validate(self, params: Point) -> tuple[bool, str | None]:
        ev = self._get(params)
        if ev.state == FAILED_VALIDATION:
            return False, ev.reason
        return ev.state == COMPLETE, None
