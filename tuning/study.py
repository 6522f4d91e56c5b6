"""The Optuna side of one task: the TPE search, the exhaustive record, and how a result is
written into a trial.

Every trial goes through the session, so a configuration sampled twice is timed once. A trial
records its outcome as user attributes (state, validated, reason) and as constraints (Optuna 5
``set_constraint``: a value above zero is a violation, which TPE learns to avoid):

    INFEASIBLE, ERROR  -> PRUNED trial, never timed      (constraint "infeasible" / "error")
    FAILED_VALIDATION  -> COMPLETE with its time          (constraint "validation")
    COMPLETE           -> COMPLETE with its time, every constraint 0
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import optuna
from optuna.trial import FrozenTrial, TrialState

from pycuda_heads.core.space import KernelSpace

from .cache import ERROR, FAILED_VALIDATION, INFEASIBLE, Evaluation
from .progress import Budget, Progress
from .session import Session
from .spaces import all_points, distributions, point_key, suggest

MODES = ("tpe", "exhaustive")
Callback = Callable[[optuna.Study, FrozenTrial], None]
_CONSTRAINTS = {"infeasible": INFEASIBLE, "error": ERROR, "validation": FAILED_VALIDATION}
_COUNTED = (TrialState.COMPLETE, TrialState.PRUNED)  # a FAIL trial was interrupted: no result


def make_sampler(seed: int) -> optuna.samplers.BaseSampler:
    return optuna.samplers.TPESampler(seed=seed)


def outcome(ev: Evaluation) -> dict[str, Any]:
    """How ``ev`` is written into a trial: its state, value, user attributes, constraints."""
    return {"state": TrialState.PRUNED if ev.time_us is None else TrialState.COMPLETE,
            "value": ev.time_us,
            "user_attrs": {"state": ev.state, "validated": ev.validated, "reason": ev.reason},
            "constraints": {k: 1.0 if ev.state == s else 0.0 for k, s in _CONSTRAINTS.items()}}


def remaining(study: optuna.Study, mode: str, trials: int, space: KernelSpace) -> int:
    """Trials still to run: up to ``trials`` finished (tpe), or the points no finished trial
    has covered (exhaustive)."""
    finished = study.get_trials(deepcopy=False, states=_COUNTED)
    if mode == "tpe":
        return max(0, trials - len(finished))
    seen = {point_key(t.params) for t in finished}
    return sum(1 for p in all_points(space) if point_key(p) not in seen)


def run_tpe(session: Session, study: optuna.Study, *, seed: int, trials: int, budget: Budget,
            progress: Progress, callbacks: Sequence[Callback] = ()) -> int:
    """Run the study up to ``trials`` finished trials, resuming from what it already holds.
    Returns the number of trials run now."""
    space = session.task.space
    total = remaining(study, "tpe", trials, space)
    if total == 0:
        return 0
    # the default first: every table entry is compared with it
    study.enqueue_trial(dict(space.default), skip_if_exists=True)
    ran = []

    def objective(trial: optuna.Trial) -> float:
        params = suggest(trial, space)
        bar.candidate(params)
        session.evaluate(params)
        session.settle()  # may validate this candidate, or find it failing
        ev = session.cache.get(params)
        session.cache.add_trial(params, study.study_name, "tpe", seed, trial.number)
        session.cache.save()
        ran.append(trial.number)
        record = outcome(ev)
        for key, value in record["user_attrs"].items():
            trial.set_user_attr(key, value)
        for key, value in record["constraints"].items():
            trial.set_constraint(key, value)
        best = session.cache.best()
        bar.done(best.time_us if best else None)
        if ev.time_us is None:
            raise optuna.TrialPruned(ev.reason)
        return ev.time_us

    def stop_when_spent(study: optuna.Study, _: FrozenTrial) -> None:
        if budget.expired():
            study.stop()

    with progress.bar(total, session.task.label()) as bar:
        study.optimize(objective, n_trials=total, callbacks=[stop_when_spent, *callbacks])
    return len(ran)


def record_exhaustive(session: Session, study: optuna.Study, seed: int) -> int:
    """Add one finished trial per point of the space not covered yet, from the cache (every
    point must be evaluated: run the exhaustive batch phase first). One storage write per
    trial, instead of the dozen an ask/tell trial costs. Returns the number added."""
    covered = {point_key(t.params) for t in study.get_trials(deepcopy=False, states=_COUNTED)}
    points = [p for p in all_points(session.task.space) if point_key(p) not in covered]
    if not points:
        return 0
    dists = distributions(session.task.space)
    before = {t.number for t in study.get_trials(deepcopy=False)}
    study.add_trials([optuna.trial.create_trial(params=p, distributions=dists,
                                                **outcome(session.cache.get(p)))
                      for p in points])
    added = {point_key(t.params): t.number for t in study.get_trials(deepcopy=False)
             if t.number not in before}
    for p in points:
        session.cache.add_trial(p, study.study_name, "exhaustive", seed, added[point_key(p)])
    session.cache.save()
    return len(points)


def prefill(session: Session, budget: Budget, progress: Progress) -> bool:
    """Evaluate every point not in the cache yet (the default first); False when the budget ran
    out first (what was timed is kept in the cache; validation waits for the next run)."""
    pending = [p for p in all_points(session.task.space) if session.cache.get(p) is None]
    with progress.bar(len(pending), f"{session.task.label()} timing", unit="config") as bar:
        for point in pending:
            if budget.expired():
                return False
            bar.candidate(point)
            session.evaluate(point)
            best = min((e.time_us for e in session.cache.evaluations if e.counts), default=None)
            bar.done(best)
    session.settle()
    return True
