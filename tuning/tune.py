"""Tuning one task end to end: its cache, the exhaustive batch phase when asked, the Optuna
study, and the final importance figures."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from optuna.storages import BaseStorage

from pycuda_heads.space import Point

from .budget import Budget
from .cache import ERROR, FAILED_VALIDATION, Evaluation, TuningCache
from .exhaustive import prefill
from .importance import importance
from .progress import Progress
from .session import Evaluator, Session
from .storage import cache_path, open_storage, open_study, tuning_dir
from .study import MODES, make_sampler, record_exhaustive, remaining, run_tpe
from .task import TuningTask

log = logging.getLogger("pycuda_heads.tuning")


@dataclass
class TuneOutcome:
    task: TuningTask
    best: Evaluation | None
    default: Evaluation | None
    trials: int  # trials run by this call
    timed: int  # configurations timed by this call
    stopped: bool  # the budget ran out before the task was done


def tune(task: TuningTask, evaluator: Evaluator, feasibility: Callable[[Point], str | None], *,
         out: Path, mode: str = "tpe", trials: int = 40, seed: int = 0,
         storage: str | BaseStorage | None = None, budget: Budget | None = None,
         progress: Progress | None = None) -> TuneOutcome:
    """Tune ``task``; re-running the same call resumes (nothing finished is redone)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    budget = budget or Budget()
    progress = progress or Progress(enabled=False)
    tdir = tuning_dir(out, task.slug)
    cache = TuningCache.load(task, cache_path(tdir, task))
    session = Session(task, feasibility, evaluator, cache)
    stopped = mode == "exhaustive" and not prefill(session, budget, progress)
    ran = 0
    if not stopped:
        study = open_study(task, open_storage(storage, tdir), make_sampler(seed))
        if mode == "exhaustive":
            ran = record_exhaustive(session, study, seed)
        else:
            ran = run_tpe(session, study, seed=seed, trials=trials, budget=budget,
                          progress=progress)
        stopped = remaining(study, mode, trials, task.space) > 0
        cache.importance = importance(task, cache.evaluations)
    cache.save()
    best, default = cache.best(), cache.default()
    bad = [e for e in cache.evaluations if e.state in (FAILED_VALIDATION, ERROR)]
    if bad:
        log.warning("%s: %d configurations failed validation or raised, e.g. %s: %s",
                    task.label(), len(bad), bad[0].params, bad[0].reason)
    log.info("%s: best %s (default %s), %d trials, %d timed%s", task.label(),
             _fmt(best), _fmt(default), ran, session.timed, " (budget spent)" if stopped else "")
    return TuneOutcome(task, best, default, ran, session.timed, stopped)


def _fmt(ev: Evaluation | None) -> str:
    return "-" if ev is None or ev.time_us is None else f"{ev.time_us:.2f} us {ev.params}"
