"""The Kernel-Tuner-style record of every evaluated configuration of one task, as JSON:
``reports/<slug>/tuning/<kernel>__<template>__<shape>.json``.

It makes sweeps resumable and replayable: a configuration found here is never timed again.
Written after every change (atomically), so a killed sweep loses at most the configuration it
was timing.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pycuda_heads import records
from pycuda_heads.core.space import Point

from .spaces import TuningTask, point_key

log = logging.getLogger("pycuda_heads.tuning")

COMPLETE = "COMPLETE"
INFEASIBLE = "INFEASIBLE"
FAILED_VALIDATION = "FAILED_VALIDATION"
ERROR = "ERROR"


@dataclass
class Evaluation:
    """One configuration's result. ``validated`` is true only once validation has passed;
    a COMPLETE record that is not validated was timed but never needed validating (it was
    slower than a validated configuration)."""

    params: Point
    state: str
    time_us: float | None = None
    p20_us: float | None = None
    p80_us: float | None = None
    reason: str | None = None
    validated: bool = False
    trial_numbers: list[int] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        # by hand: dataclasses.asdict deep-copies recursively, and this runs on every save
        return {"params": self.params, "state": self.state, "time_us": self.time_us,
                "p20_us": self.p20_us, "p80_us": self.p80_us, "reason": self.reason,
                "validated": self.validated, "trial_numbers": self.trial_numbers}

    @property
    def counts(self) -> bool:
        """Timed and not failed: a candidate for the best (once validated)."""
        return self.state == COMPLETE and self.time_us is not None


class TuningCache:
    def __init__(self, task: TuningTask, path: Path | None = None):
        """``path`` None keeps the record in memory only (replays)."""
        self.task = task
        self.path = path
        self.importance: dict[str, float] = {}
        #: the interleaved best-vs-default verdict (``tune.compare_with_default``)
        self.comparison: dict[str, Any] | None = None
        self.history: list[dict[str, Any]] = []
        self._evals: dict[str, Evaluation] = {}

    @classmethod
    def load(cls, task: TuningTask, path: Path) -> "TuningCache":
        cache = cls(task, path)
        if not path.is_file():
            return cache
        data = records.read_json(path, "tuning cache")
        if data.get("source_hash", "") != task.source_hash:
            log.warning("%s: kernel sources changed since %s was written; starting afresh",
                        task.label(), path)
            return cache
        cache.fill(data)
        return cache

    def fill(self, data: dict[str, Any]) -> None:
        """Take evaluations, history and importance from a cache file's JSON."""
        for raw in data.get("evaluations", ()):
            ev = Evaluation(**raw)
            self._evals[point_key(ev.params)] = ev
        self.history = list(data.get("history", ()))
        self.importance = dict(data.get("importance", {}))
        self.comparison = data.get("comparison")

    @property
    def evaluations(self) -> list[Evaluation]:
        return list(self._evals.values())

    def get(self, params: Point) -> Evaluation | None:
        return self._evals.get(point_key(params))

    def put(self, ev: Evaluation) -> Evaluation:
        """Store (or replace) a result, keeping the trials that already used it."""
        key = point_key(ev.params)
        old = self._evals.get(key)
        if old is not None:
            ev = replace(ev, trial_numbers=sorted(set(old.trial_numbers) | set(ev.trial_numbers)))
        self._evals[key] = ev
        self.save()
        return ev

    def add_trial(self, params: Point, study: str, mode: str, seed: int, number: int) -> None:
        """Note that trial ``number`` of ``study`` used ``params`` (already evaluated); the
        caller saves (the study itself already holds the trial durably)."""
        ev = self._evals[point_key(params)]
        if number not in ev.trial_numbers:
            ev.trial_numbers.append(number)
        time_us = ev.time_us if ev.counts else None
        previous = [h["best_so_far_us"] for h in self.history
                    if h["study"] == study and h["best_so_far_us"] is not None]
        candidates = [t for t in (time_us, previous[-1] if previous else None) if t is not None]
        self.history.append({"study": study, "mode": mode, "seed": seed, "trial": number,
                             "time_us": time_us,
                             "best_so_far_us": min(candidates) if candidates else None})

    def best(self) -> Evaluation | None:
        """Fastest configuration that was timed and passed validation."""
        valid = [e for e in self._evals.values() if e.counts and e.validated]
        return min(valid, key=lambda e: e.time_us) if valid else None

    def default(self) -> Evaluation | None:
        return self.get(dict(self.task.space.default))

    def to_json(self) -> dict[str, Any]:
        task, best, default = self.task, self.best(), self.default()
        return {
            "kernel": task.kernel, "template": dict(task.template), "shape": dict(task.shape),
            "gpu": task.gpu, "gpu_slug": task.slug,
            "default_params": dict(task.space.default),
            "default_time_us": default.time_us if default is not None else None,
            "importance": self.importance,
            "evaluations": [e.to_json() for e in self._evals.values()],
            "history": self.history,
            "best": {"params": best.params, "time_us": best.time_us} if best else None,
            "comparison": self.comparison,
            "source_hash": task.source_hash,
        }

    def save(self) -> None:
        if self.path is None:
            return
        # compact (the C encoder, fast to rewrite); atomic: a kill leaves the previous file
        records.write_json(self.path, self.to_json(), indent=None)
