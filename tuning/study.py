"""The Optuna side of one task: the TPE search, the exhaustive record, and how a result is
written into a trial.

Every trial goes through the session, so a configuration sampled twice is timed once. A trial
records its outcome as user attributes (state, validated, reason) and as constraints (Optuna 5
``set_constraint``: a value above zero is a violation, which TPE learns to avoid):

    INFEASIBLE, ERROR  -> PRUNED trial, never timed      (constraint "infeasible" / "error")
    FAILED_VALIDATION  -> COMPLETE with its time          (constraint "validation")
    COMPLETE           -> COMPLETE with its time, every constraint 0

Trials are asked for and told by hand (not ``study.optimize``), so that several workers can
share the study: each asks in its turn (``workers.Turns``), which keeps the number of finished
trials exactly at the target and never lets two workers time one configuration.
"""
from __future__ import annotations

import os
import time
import warnings
from contextlib import nullcontext
from typing import Any, Callable, ContextManager

import optuna
from optuna.trial import FrozenTrial, TrialState

from pycuda_heads.records import pid_alive

from . import DEFAULT_SAMPLER, workers
from .cache import ERROR, FAILED_VALIDATION, INFEASIBLE, Evaluation
from .progress import Bar, Budget, Progress
from .session import Session
from .samplers import ask, first_points
from .spaces import TuningTask, all_points, distributions, point_key
from .workers import POLL_S, claim, fail_stale, heartbeat, running_elsewhere

MODES = ("tpe", "exhaustive")
Turn = Callable[[], ContextManager[Any]]
#: a claim on an exhaustive configuration older than this is void (its worker is gone)
CLAIM_S = 900.0
_CONSTRAINTS = {"infeasible": INFEASIBLE, "error": ERROR, "validation": FAILED_VALIDATION}
_COUNTED = (TrialState.COMPLETE, TrialState.PRUNED)  # a FAIL trial was interrupted: no result


def outcome(ev: Evaluation, mode: str, seed: int) -> dict[str, Any]:
    """How ``ev`` is written into a trial: its state, value, user attributes, constraints."""
    return {"state": TrialState.PRUNED if ev.time_us is None else TrialState.COMPLETE,
            "value": ev.time_us,
            "user_attrs": {"state": ev.state, "validated": ev.validated, "reason": ev.reason,
                           "p20_us": ev.p20_us, "p80_us": ev.p80_us, "mode": mode,
                           "seed": seed},
            "constraints": {k: 1.0 if ev.state == s else 0.0 for k, s in _CONSTRAINTS.items()}}


def from_trial(t: FrozenTrial) -> Evaluation:
    """The result another worker wrote into a finished trial."""
    a = t.user_attrs
    return Evaluation(dict(t.params), a["state"], time_us=t.value, p20_us=a.get("p20_us"),
                      p80_us=a.get("p80_us"), reason=a.get("reason"),
                      validated=bool(a.get("validated")))


def sync_history(session: Session, study: optuna.Study) -> None:
    """The cache's history of ``study`` := its finished trials (the study is the record)."""
    finished = sorted(study.get_trials(deepcopy=False, states=_COUNTED), key=lambda t: t.number)
    session.cache.set_trials(study.study_name, [
        (t.number, t.params, t.user_attrs.get("mode", "tpe"), t.user_attrs.get("seed", 0))
        for t in finished])
    session.cache.save()


def remaining(study: optuna.Study, mode: str, trials: int, task: TuningTask) -> int:
    """Trials still to run: up to ``trials`` finished, one of them on the task's baseline
    (tpe), or the points no finished trial has covered (exhaustive)."""
    finished = study.get_trials(deepcopy=False, states=_COUNTED)
    if mode == "tpe":
        baseline_done = any(t.params == task.baseline for t in finished)
        return max(trials - len(finished), 0 if baseline_done else 1)
    seen = {point_key(t.params) for t in finished}
    return sum(1 for p in all_points(task) if point_key(p) not in seen)


def run_tpe(session: Session, study: optuna.Study, *, seed: int, trials: int, budget: Budget,
            progress: Progress, turn: Turn = nullcontext,
            stop: Callable[[], bool] | None = None, sampler: str = DEFAULT_SAMPLER,
            fresh: bool = False) -> int:
    """Run the study up to ``trials`` finished trials in all, resuming from what it already
    holds and sharing it with any other worker. Returns the number of trials run now.

    The task's baseline is queued first, and again until a trial has finished on it: every
    table entry is compared with it (a kill during its trial must not leave it untimed). A
    study that reached ``trials`` without it (tuned against another baseline) runs one more.
    The random startup trials of a new study are the task's ``startup_points`` (the ones a
    sweep compiles ahead), queued with the baseline, unless ``sampler`` draws its own; ``fresh``
    leaves the shipped point out of them (a replay measuring the search). The study's sampler
    is ``sampler``'s (``samplers.make``)."""
    task = session.task
    ran = 0
    startup = first_points(task, sampler, trials, seed, fresh)
    # a run killed between a tell and its cache save left the history short: rebuild it now,
    # since a finished study runs no trial that would
    sync_history(session, study)
    with progress.bar(remaining(study, "tpe", trials, task), task.label()) as bar:
        while not budget.expired() and not (stop is not None and stop()):
            with turn():
                fail_stale(study)
                finished, running = _counts(study)
                held = _held(study)
                baseline = held.get(point_key(task.baseline), set())
                if finished >= trials and baseline & set(_COUNTED):
                    break
                trial = None
                # a free trial, or the baseline's when no finished or running trial is on it
                # (else the last trials are another worker's: wait for them)
                if finished + running < trials or not baseline - {TrialState.WAITING}:
                    # the baseline whenever no trial holds it (fail_stale fails a killed one, and
                    # may have queued it again); a new study's startup points while trials are free
                    free = trials - finished - running
                    wanted = startup if finished < len(startup) else startup[:1]
                    for i, point in enumerate(wanted):
                        if point_key(point) not in held and (i == 0 or free > 0):
                            study.enqueue_trial(point)
                            free -= 1
                    with warnings.catch_warnings():  # we beat by hand: ask/tell, not optimize
                        warnings.filterwarnings("ignore", message="Heartbeat of storage")
                        trial, params = ask(study, task, sampler)
                    claim(study, trial)
            if trial is None:
                time.sleep(POLL_S)
                continue
            try:
                with heartbeat(study, trial):
                    _run_trial(session, study, trial, params, seed, bar, turn)
            except BaseException:  # this process may live on: no trial of it stays RUNNING
                study.tell(trial, state=TrialState.FAIL)
                raise
            ran += 1
    return ran


def _counts(study: optuna.Study) -> tuple[int, int]:
    """(finished, running) trials."""
    states = [t.state for t in study.get_trials(deepcopy=False)]
    return sum(s in _COUNTED for s in states), states.count(TrialState.RUNNING)


def _held(study: optuna.Study) -> dict[str, set[TrialState]]:
    """Point key -> the states of the trials on it that are not FAIL, a queued (WAITING) one
    included: it holds its point only as the ``fixed_params`` Optuna pops at the next ask."""
    held: dict[str, set[TrialState]] = {}
    for t in study.get_trials(deepcopy=False):
        if t.state != TrialState.FAIL:
            point = t.params or t.system_attrs.get("fixed_params") or {}
            held.setdefault(point_key(point), set()).add(t.state)
    return held


def _run_trial(session: Session, study: optuna.Study, trial: optuna.Trial,
               params: dict[str, Any], seed: int, bar: Bar, turn: Turn) -> None:
    bar.candidate(params)
    cache = session.cache
    cache.refresh()
    while cache.get(params) is None:
        done = next((t for t in study.get_trials(deepcopy=False, states=_COUNTED)
                     if t.params == params and "state" in t.user_attrs), None)
        if done is not None:  # timed by a worker on another machine
            cache.put(from_trial(done))
        elif running_elsewhere(study, trial, params) is not None:
            time.sleep(POLL_S)  # another worker is timing it: wait for its result
            with turn():  # unless that worker died
                fail_stale(study)
            cache.refresh()
        else:
            session.evaluate(params)
    session.settle()  # may validate this candidate, or find it failing
    record = outcome(cache.get(params), "tpe", seed)
    for key, value in record["user_attrs"].items():
        trial.set_user_attr(key, value)
    for key, value in record["constraints"].items():
        trial.set_constraint(key, value)
    study.tell(trial, record["value"], state=record["state"])
    sync_history(session, study)
    best = cache.best()
    bar.done(best.time_us if best else None)


def record_exhaustive(session: Session, study: optuna.Study, seed: int,
                      turn: Turn = nullcontext) -> int:
    """Add one finished trial per point of the space not covered yet, from the cache (every
    point must be evaluated: run the exhaustive batch phase first). One storage write per
    trial, instead of the dozen an ask/tell trial costs. Returns the number added."""
    dists = distributions(session.task.space)
    with turn():
        covered = {point_key(t.params)
                   for t in study.get_trials(deepcopy=False, states=_COUNTED)}
        points = [p for p in all_points(session.task) if point_key(p) not in covered]
        study.add_trials([optuna.trial.create_trial(
            params=p, distributions=dists, **outcome(session.cache.get(p), "exhaustive", seed))
            for p in points])
    sync_history(session, study)
    return len(points)


def prefill(session: Session, study: optuna.Study, budget: Budget, progress: Progress,
            turn: Turn = nullcontext) -> bool:
    """Evaluate every point not in the cache yet (the baseline first), sharing the work with
    any other worker through claims on the points; False when the budget ran out first (what
    was timed is kept in the cache; validation waits for the next run)."""
    cache = session.cache
    points = all_points(session.task)
    with progress.bar(sum(cache.get(p) is None for p in points),
                      f"{session.task.label()} timing", unit="config") as bar:
        while pending := [p for p in points if cache.get(p) is None]:
            if budget.expired():
                return False
            with turn():
                claims = study._storage.get_study_system_attrs(study._study_id)
                point = next((p for p in pending
                              if not _claimed(claims.get(f"claim:{point_key(p)}"))), None)
                if point is not None:
                    study._storage.set_study_system_attr(
                        study._study_id, f"claim:{point_key(point)}",
                        {"host": workers.HOST, "pid": os.getpid(), "at": time.time()})
            if point is None:  # the rest is being timed by other workers
                time.sleep(POLL_S)
                cache.refresh()
                continue
            bar.candidate(point)
            session.evaluate(point)
            bar.done(min((e.time_us for e in cache.evaluations if e.counts), default=None))
            cache.refresh()
    session.settle()
    return True


def _claimed(owner: dict[str, Any] | None) -> bool:
    """Whether a claim binds this worker: someone else's, alive and recent."""
    if owner is None or time.time() - owner["at"] > CLAIM_S:
        return False
    if owner["host"] != workers.HOST:
        return True
    return owner["pid"] != os.getpid() and pid_alive(int(owner["pid"]))
