"""Tuning one task end to end: its cache, the exhaustive batch phase when asked, the Optuna
study, and the final importance figures."""
from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import optuna
from optuna.storages import BaseStorage

from pycuda_heads.core.space import Point

from . import DEFAULT_SAMPLER
from .cache import ERROR, FAILED_VALIDATION, Evaluation, TuningCache, beats_default
from .progress import Budget, Progress
from .session import Evaluator, Session
from .spaces import TuningTask, distributions, point_key
from .storage import cache_path, open_storage, open_study, tuning_dir
from .workers import Turns
from .samplers import make
from .study import MODES, prefill, record_exhaustive, remaining, run_tpe

log = logging.getLogger("pycuda_heads.tuning")


@dataclass
class TuneOutcome:
    task: TuningTask
    best: Evaluation | None
    default: Evaluation | None
    trials: int  # trials run by this call
    timed_points: list[str]  # keys of the configurations timed by this call
    stopped: bool  # the budget ran out before the task was done

    @property
    def timed(self) -> int:
        """Configurations timed by this call."""
        return len(self.timed_points)


def tune(task: TuningTask, evaluator: Evaluator, feasibility: Callable[[Point], str | None], *,
         out: Path, mode: str = "tpe", trials: int = 40, seed: int = 0,
         storage: str | BaseStorage | None = None, budget: Budget | None = None,
         progress: Progress | None = None, sampler: str = DEFAULT_SAMPLER) -> TuneOutcome:
    """Tune ``task`` (TPE mode: with ``sampler``, a name of ``samplers.SAMPLERS``); re-running
    the same call resumes (nothing finished is redone)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    budget = budget or Budget()
    progress = progress or Progress(enabled=False)
    tdir = tuning_dir(out, task.slug)
    cache = TuningCache.load(task, cache_path(tdir, task))
    session = Session(task, feasibility, evaluator, cache)
    storage = open_storage(storage, tdir)
    study = open_study(task, storage, make(sampler, task, seed))
    turn = Turns(storage, task.study_name, tdir / f"{task.name}.lock").turn
    ran = 0
    stopped = mode == "exhaustive" and not prefill(session, study, budget, progress, turn)
    if not stopped:
        if mode == "exhaustive":
            ran = record_exhaustive(session, study, seed, turn)
        else:
            ran = run_tpe(session, study, seed=seed, trials=trials, budget=budget,
                          progress=progress, turn=turn, sampler=sampler)
        stopped = remaining(study, mode, trials, task) > 0
        if ran or session.timed or not cache.importance:  # a resumed finished task: as it was
            cache.importance = importance(task, cache.evaluations)
    if stopped:
        cache.save()
    else:
        with turn():  # one comparison per study: a later worker finds it in the file
            cache.refresh()
            compare_with_default(task, evaluator, cache)
            cache.save()
    best, default = cache.best(), cache.default()
    bad = [e for e in cache.evaluations if e.state in (FAILED_VALIDATION, ERROR)]
    if bad:
        log.warning("%s: %d configurations failed validation or raised, e.g. %s: %s",
                    task.label(), len(bad), bad[0].params, bad[0].reason)
    log.info("%s: best %s (default %s), %d trials, %d timed%s", task.label(),
             _fmt(best), _fmt(default), ran, session.timed, " (budget spent)" if stopped else "")
    return TuneOutcome(task, best, default, ran, session.timed_points, stopped)


def _fmt(ev: Evaluation | None) -> str:
    return "-" if ev is None or ev.time_us is None else f"{ev.time_us:.2f} us {ev.params}"


def importance(task: TuningTask, evaluations: list[Evaluation]) -> dict[str, float]:
    """Importance per knob from configurations that were timed and did not fail; {} unless at
    least two of them differ in both time and knobs."""
    timed = [e for e in evaluations if e.counts]
    if len({e.time_us for e in timed}) < 2 or len({point_key(e.params) for e in timed}) < 2:
        return {}
    dists = distributions(task.space)
    study = optuna.create_study(storage=optuna.storages.InMemoryStorage())
    study.add_trials([optuna.trial.create_trial(params=e.params, distributions=dists,
                                                value=e.time_us) for e in timed])
    return {k: float(v) for k, v in optuna.importance.get_param_importances(study).items()}




def compare_with_default(task: TuningTask, evaluator: Evaluator, cache: TuningCache) -> None:
    """Time the best validated configuration and the task's baseline (``TuningTask.baseline``,
    what the op runs without a tuned entry) interleaved and decide whether the best is faster
    beyond noise (``speedup_test``); the verdict, with both points, goes into the cache. Kept
    from an earlier run while the best and the baseline are the same; skipped for evaluators
    that cannot interleave (replays)."""
    best, default = cache.best(), cache.default()
    if best is None or default is None or not hasattr(evaluator, "interleaved"):
        return
    made = cache.comparison or {}
    if made.get("params") == best.params and made.get("default_params") == default.params:
        return
    if default.counts and not default.validated:  # a kept default must be validated too
        passed, reason = evaluator.validate(default.params)
        cache.put(replace(default, validated=passed) if passed else
                  replace(default, state=FAILED_VALIDATION, reason=reason))
        default = cache.default()
    pair = {"params": best.params, "default_params": default.params}
    if best.params == default.params:
        cache.comparison = {**pair, "speedup": 1.0, "ci": [1.0, 1.0], "p_value": 1.0,
                            "significant": False, "samples": 0}
        return
    if not default.counts:  # the default failed: any validated configuration beats it
        cache.comparison = {**pair, "speedup": None, "ci": None, "p_value": 0.0,
                            "significant": True, "samples": 0,
                            "note": f"the default is {default.state}"}
        return
    t_best, t_default = evaluator.interleaved(best.params, default.params)
    cache.comparison = {**pair, **speedup_test(t_best, t_default)}
    log.info("%s: %s vs default: %.3fx (95%% CI %.3f..%.3f, p=%.2g)%s", task.label(),
             best.params, cache.comparison["speedup"], *cache.comparison["ci"],
             cache.comparison["p_value"], "" if cache.comparison["significant"]
             else ": not beyond noise, the default stays")


def speedup_test(t_best: list[float], t_default: list[float], seed: int = 0,
                 resamples: int = 2000) -> dict[str, object]:
    """Speed-up of the best over the default (ratio of median per-batch times) with a 95%
    bootstrap interval, and a one-sided Mann-Whitney U test that the best is faster. It counts
    as significant by ``cache.beats_default``."""
    import numpy as np
    from scipy.stats import mannwhitneyu
    a, b = np.asarray(t_best, float), np.asarray(t_default, float)
    p = float(mannwhitneyu(a, b, alternative="less").pvalue)
    rng = np.random.default_rng(seed)
    ratios = [np.median(rng.choice(b, b.size)) / np.median(rng.choice(a, a.size))
              for _ in range(resamples)]
    lo, hi = (float(x) for x in np.percentile(ratios, [2.5, 97.5]))
    verdict = {"speedup": float(np.median(b) / np.median(a)), "ci": [lo, hi], "p_value": p,
               "samples": int(a.size)}
    return {**verdict, "significant": beats_default(verdict)}
