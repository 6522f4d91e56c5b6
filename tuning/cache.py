"""The Kernel-Tuner-style record of every evaluated configuration of one task, as JSON:
``reports/<slug>/tuning/<kernel>__<template>__<shape>.json``.

It makes sweeps resumable and replayable: a configuration found here is never timed again.
Written after every change (atomically), so a killed sweep loses at most the configuration it
was timing. Several processes may share one file: each save merges what is on disk under a
lock, so no process drops another's timings. The cache holds the timings; the Optuna study
holds the trials, and the history is rebuilt from the study after every finished trial.
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pycuda_heads import records
from pycuda_heads.core.space import Point

from .locks import FileLock
from .spaces import TuningTask, point_key

log = logging.getLogger("pycuda_heads.tuning")

COMPLETE = "COMPLETE"
INFEASIBLE = "INFEASIBLE"
FAILED_VALIDATION = "FAILED_VALIDATION"
ERROR = "ERROR"

# A tuned entry ships only when it beats the default beyond noise: a one-sided Mann-Whitney p
# below P_VALUE, and the low end of the speed-up's 95% interval above MIN_GAIN. An interleaved
# comparison sees only within-run noise, and a gain below a few percent did not survive a
# separate bench run on the H200 (Adam at N=1048576: 1.005x in the tuner, 0.82x in the bench).
P_VALUE = 0.01
MIN_GAIN = 1.03


def beats_default(comparison: dict[str, Any] | None) -> bool:
    """Whether a recorded best-vs-default comparison ships the best (no interval: the default
    failed, and any validated configuration beats it)."""
    if not comparison:
        return False
    ci = comparison.get("ci")
    return comparison.get("p_value", 1.0) < P_VALUE and (ci is None or ci[0] > MIN_GAIN)


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

    @property
    def rank(self) -> int:
        """How settled the result is; of two records of one point the higher rank wins."""
        return 2 if self.state != COMPLETE else int(self.validated)


def checked(ev: Evaluation) -> Evaluation:
    """``ev``, or an ERROR when a time is NaN, infinite, zero or negative (a broken
    measurement: never a best, never exported)."""
    times = (ev.time_us, ev.p20_us, ev.p80_us)
    if ev.state != COMPLETE or all(t is None or (math.isfinite(t) and t > 0) for t in times):
        return ev
    what = "non-finite" if any(t is not None and not math.isfinite(t) for t in times) \
        else "non-positive"
    reason = (f"{what} timing {ev.time_us!r} us (p20 {ev.p20_us!r}, p80 {ev.p80_us!r}) "
              f"for {dict(ev.params)}")
    log.warning("rejected %s", reason)
    return replace(ev, state=ERROR, time_us=None, p20_us=None, p80_us=None, validated=False,
                   reason=reason)


class TuningCache:
    def __init__(self, task: TuningTask, path: Path | None = None):
        """``path`` None keeps the record in memory only (replays)."""
        self.task = task
        self.path = path
        self.importance: dict[str, float] = {}
        #: the interleaved best-vs-baseline verdict (``tune.compare_with_default``)
        self.comparison: dict[str, Any] | None = None
        self.history: list[dict[str, Any]] = []
        self._evals: dict[str, Evaluation] = {}
        self._lock = FileLock(f"{path}.lock") if path is not None else None

    @classmethod
    def load(cls, task: TuningTask, path: Path) -> "TuningCache":
        cache = cls(task, path)
        cache.refresh()
        return cache

    def _read(self) -> dict[str, Any] | None:
        """The file's JSON when it belongs to the installed sources; None when missing or
        stale. A corrupt file raises a ValueError naming it."""
        if self.path is None or not self.path.is_file():
            return None
        data = records.read_json(self.path, "tuning cache")
        if not isinstance(data, dict) or not isinstance(data.get("evaluations", []), list):
            raise ValueError(f"tuning cache {self.path} is not a cache record; delete it")
        if data.get("source_hash", "") != self.task.source_hash:
            log.warning("%s: kernel sources changed since %s was written; starting afresh",
                        self.task.label(), self.path)
            return None
        return data

    def refresh(self) -> None:
        """Take in what other processes wrote to the file since."""
        if self._lock is None:
            return
        with self._lock:
            data = self._read()
        if data is not None:
            self.fill(data)

    def fill(self, data: dict[str, Any]) -> None:
        """Merge evaluations, history and importance from a cache file's JSON."""
        try:
            for raw in data.get("evaluations", ()):
                self._merge(checked(Evaluation(**raw)))
        except TypeError as exc:
            raise ValueError(f"tuning cache {self.path}: malformed evaluation ({exc}); "
                             "delete the file") from None
        history = data.get("history", ())
        if not isinstance(history, list) or not all(isinstance(h, dict) and "study" in h
                                                     for h in history):
            raise ValueError(f"tuning cache {self.path}: a history entry names no study; "
                             "delete the file")
        # per study, the longer history is the later one: a study only gains finished trials
        studies: dict[str, list[dict[str, Any]]] = {}
        for source in (history, self.history):
            mine: dict[str, list[dict[str, Any]]] = {}
            for h in source:
                mine.setdefault(h["study"], []).append(h)
            for study, hist in mine.items():
                if len(hist) >= len(studies.get(study, ())):
                    studies[study] = hist
        self.history = [h for hist in studies.values() for h in hist]
        self.importance = self.importance or dict(data.get("importance", {}))
        comparison = data.get("comparison")
        if comparison is not None and "default_params" not in comparison:
            # recorded before comparisons named their baseline: made against the space default
            comparison = {**comparison, "default_params": dict(self.task.space.default)}
        self.comparison = self.comparison or comparison

    def _merge(self, ev: Evaluation) -> Evaluation:
        key = point_key(ev.params)
        old = self._evals.get(key)
        if old is not None:
            numbers = sorted(set(old.trial_numbers) | set(ev.trial_numbers))
            ev = replace(ev if ev.rank >= old.rank else old, trial_numbers=numbers)
        self._evals[key] = ev
        return ev

    @property
    def evaluations(self) -> list[Evaluation]:
        return list(self._evals.values())

    def get(self, params: Point) -> Evaluation | None:
        return self._evals.get(point_key(params))

    def put(self, ev: Evaluation) -> Evaluation:
        """Store a result (a settled one wins over a less settled record of the same point),
        keeping the trials that already used it."""
        key = point_key(ev.params)
        self._merge(checked(ev))
        self.save()
        return self._evals[key]

    def set_trials(self, study: str, trials: list[tuple[int, Point, str, int]]) -> None:
        """Make the history of ``study`` the given finished trials, (number, params, mode,
        seed) each, in order: the study is the record of trials, the cache follows it."""
        self.history = [h for h in self.history if h["study"] != study]
        numbers: dict[str, list[int]] = {}
        best = None
        for number, params, mode, seed in trials:
            ev = self._evals.get(point_key(params))
            time_us = ev.time_us if ev is not None and ev.counts else None
            best = time_us if best is None or (time_us is not None and time_us < best) else best
            numbers.setdefault(point_key(params), []).append(number)
            self.history.append({"study": study, "mode": mode, "seed": seed, "trial": number,
                                 "time_us": time_us, "best_so_far_us": best})
        for key, ev in self._evals.items():
            ev.trial_numbers = numbers.get(key, [])

    def best(self) -> Evaluation | None:
        """Fastest configuration that was timed and passed validation."""
        valid = [e for e in self._evals.values() if e.counts and e.validated]
        return min(valid, key=lambda e: e.time_us) if valid else None

    def default(self) -> Evaluation | None:
        """The record of the task's baseline (``TuningTask.baseline``), what runs untuned."""
        return self.get(self.task.baseline)

    def to_json(self) -> dict[str, Any]:
        task, best, default = self.task, self.best(), self.default()
        return {
            "kernel": task.kernel, "template": dict(task.template), "shape": dict(task.shape),
            "gpu": task.gpu, "gpu_slug": task.slug,
            "default_params": dict(task.baseline),
            "default_time_us": default.time_us if default is not None else None,
            "importance": self.importance,
            "evaluations": [e.to_json() for e in self._evals.values()],
            "history": self.history,
            "best": {"params": best.params, "time_us": best.time_us} if best else None,
            "comparison": self.comparison,
            "source_hash": task.source_hash,
        }

    def save(self) -> None:
        if self.path is None or self._lock is None:
            return
        with self._lock:  # merge first: another process may have written since
            data = self._read()
            if data is not None:
                self.fill(data)
            # compact (the C encoder, fast to rewrite); atomic: a kill leaves the previous file
            records.write_json(self.path, self.to_json(), indent=None)
