"""Evaluating configurations of one task: cache first, then feasibility, then timing; and the
validation rule: a time counts only after the configuration passes validation.

Validation is the expensive step, so only a candidate that could become the best is
validated: the fastest timed, unvalidated configuration that beats the best validated one,
repeatedly, until none is left. Every other timed configuration stays ``validated: false``.
"""
from __future__ import annotations

import logging
from dataclasses import replace
from typing import Callable, Mapping, Protocol

from pycuda_heads.core.space import Point

from .cache import (
    COMPLETE,
    ERROR,
    FAILED_VALIDATION,
    INFEASIBLE,
    Evaluation,
    TuningCache,
)
from .spaces import TuningTask, point_key

log = logging.getLogger("pycuda_heads.tuning")


class Evaluator(Protocol):
    """Measures and checks configurations (the GPU objective, or a synthetic one in tests)."""

    def time(self, params: Point) -> Mapping[str, float]:
        """``{"median_us", "p20_us", "p80_us"}``; raises when the configuration fails to run."""

    def validate(self, params: Point) -> tuple[bool, str | None]:
        """(passed, reason it failed)."""


class EvaluatorBroken(Exception):
    """Raised by an evaluator when a failure also broke the evaluator (a CUDA error poisons the
    whole context): the configuration is recorded and the run stops, since nothing measured
    after it could be trusted. A re-run starts afresh and skips the recorded configuration."""


def describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).strip()[:1000]}"


class Session:
    def __init__(self, task: TuningTask, feasibility: Callable[[Point], str | None],
                 evaluator: Evaluator, cache: TuningCache):
        self.task = task
        self.feasibility = feasibility
        self.evaluator = evaluator
        self.cache = cache
        # keys of the configurations timed by this session (not replayed from the cache), kept
        # so the run log can show which worker timed what
        self.timed_points: list[str] = []

    @property
    def timed(self) -> int:
        """Configurations timed by this session."""
        return len(self.timed_points)

    def evaluate(self, params: Point) -> Evaluation:
        """The result for ``params``: from the cache, or decided and timed now (and cached)."""
        params = dict(params)
        hit = self.cache.get(params)
        if hit is not None:
            return hit
        reason = self.feasibility(params)
        if reason is not None:
            return self.cache.put(Evaluation(params, INFEASIBLE, reason=reason))
        try:
            t = self.evaluator.time(params)
        except EvaluatorBroken as exc:
            self.cache.put(Evaluation(params, ERROR, reason=describe(exc)))
            raise
        except Exception as exc:  # a broken variant is a recorded result, never the sweep's end
            log.info("%s %s: %s", self.task.label(), params, describe(exc))
            return self.cache.put(Evaluation(params, ERROR, reason=describe(exc)))
        self.timed_points.append(point_key(params))
        return self.cache.put(Evaluation(params, COMPLETE, time_us=float(t["median_us"]),
                                         p20_us=float(t["p20_us"]), p80_us=float(t["p80_us"])))

    def settle(self) -> None:
        """Validate candidates that could become the best until the fastest timed one that has
        not failed validation has passed it."""
        while (candidate := self._next_candidate()) is not None:
            self._validate(candidate)

    def _next_candidate(self) -> Evaluation | None:
        best = self.cache.best()
        pending = [e for e in self.cache.evaluations if e.counts and not e.validated
                   and (best is None or e.time_us < best.time_us)]
        return min(pending, key=lambda e: e.time_us) if pending else None

    def _validate(self, ev: Evaluation) -> None:
        try:
            passed, reason = self.evaluator.validate(ev.params)
        except EvaluatorBroken as exc:
            self.cache.put(replace(ev, state=FAILED_VALIDATION, reason=describe(exc)))
            raise
        except Exception as exc:  # same rule as timing: record, carry on
            passed, reason = False, f"validation raised {describe(exc)}"
        if passed:
            self.cache.put(replace(ev, validated=True))
        else:
            log.info("%s %s failed validation: %s", self.task.label(), ev.params, reason)
            self.cache.put(replace(ev, state=FAILED_VALIDATION, validated=False,
                                   reason=reason or "validation failed"))
