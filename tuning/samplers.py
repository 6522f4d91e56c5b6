"""The samplers a search can run with (``--sampler``), and how a study asks for its next point.

Each sampler is named here once; the tuner's studies, the quality measurement's chains and their
CPU replays all ask through ``ask``, so a replay proposes exactly what the search proposed.
Pool spaces are sparse (about 0.3% of the knob product passes the restrictions): a sampler that
is ``valid_only`` redraws a proposal that breaks a restriction instead of spending a trial on it.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import optuna
from optuna.distributions import BaseDistribution
from optuna.samplers import BaseSampler, TPESampler
from optuna.trial import FrozenTrial, TrialState

from pycuda_heads.core.space import Point

from .spaces import (STARTUP_TRIALS, TuningTask, distributions, point_key, startup_points,
                     suggest)

#: redraws of a proposal that breaks a restriction before the closest valid point is taken
MAX_REDRAWS = 3


def valid_points(task: TuningTask) -> list[Point]:
    """The task's points that pass its restrictions and launch restrictions, in the space's
    order."""
    return list(_valid(task)[0])


_VALID: dict[tuple[str, str], tuple[list[Point], np.ndarray]] = {}


def _valid(task: TuningTask) -> tuple[list[Point], np.ndarray]:
    """The valid points, and each one's knob values as indices into the space's value lists
    (the walk of a pool space takes seconds: once per task and process)."""
    key = (task.name, point_key(task.launch_env))
    if key not in _VALID:
        space = task.space
        points = space.points(task.template, task.launch_env)
        index = {k: {v: i for i, v in enumerate(vs)} for k, vs in space.params.items()}
        _VALID[key] = points, np.array([[index[k][p[k]] for k in space.params] for p in points])
    return _VALID[key]


def _shared(task: TuningTask, point: Point) -> tuple[list[Point], np.ndarray]:
    """The valid points, and how many knob values each shares with ``point``."""
    points, matrix = _valid(task)
    want = np.array([list(vs).index(point[k]) for k, vs in task.space.params.items()])
    return points, (matrix == want).sum(axis=1)


def closest(task: TuningTask, point: Point, rng: random.Random) -> Point:
    """A valid point sharing most knob values with ``point`` (ties drawn with ``rng``)."""
    points, shared = _shared(task, point)
    return dict(points[rng.choice(np.flatnonzero(shared == shared.max()).tolist())])


class ValidPoints(BaseSampler):
    """Uniform over the task's valid points (restrictions and launch restrictions), never one
    the study holds already; the order is fixed by the seed, so the draw is reproducible."""

    def __init__(self, task: TuningTask, seed: int, salt: str = ""):
        self._task = task
        self._seed = f"{seed}:{task.name}{salt}"
        self._order: list[Point] | None = None

    def order(self) -> list[Point]:
        if self._order is None:
            self._order = valid_points(self._task)
            random.Random(self._seed).shuffle(self._order)
        return self._order

    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial
                                    ) -> dict[str, BaseDistribution]:
        return dict(distributions(self._task.space))

    def sample_relative(self, study: optuna.Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        taken = {point_key(t.params) for t in study.get_trials(deepcopy=False)
                 if t.state != TrialState.FAIL}
        return next((p for p in self.order() if point_key(p) not in taken), self.order()[0])

    def sample_independent(self, study: optuna.Study, trial: FrozenTrial, param_name: str,
                           param_distribution: BaseDistribution) -> Any:
        return param_distribution.to_external_repr(0)  # only for knobs outside the space


class LocalMoves(ValidPoints):
    """A one-knob move from the best point so far: the valid points that differ from it in one
    knob, not tried yet, in an order fixed by the seed and that point (so a replay draws the
    same); a uniform valid point (``ValidPoints``) when none is left or nothing finished yet."""

    def __init__(self, task: TuningTask, seed: int):
        super().__init__(task, seed, salt=":local")
        self._moves_seed = f"{seed}:{task.name}:local"

    def sample_relative(self, study: optuna.Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        trials = study.get_trials(deepcopy=False)
        done = [t for t in trials if t.state == TrialState.COMPLETE and t.value is not None]
        if done:
            best = min(done, key=lambda t: t.value).params
            points, shared = _shared(self._task, best)
            taken = {point_key(t.params) for t in trials if t.state != TrialState.FAIL}
            one_off = np.flatnonzero(shared == len(self._task.space.params) - 1)
            moves = [points[i] for i in one_off if point_key(points[i]) not in taken]
            if moves:
                random.Random(f"{self._moves_seed}:{point_key(best)}").shuffle(moves)
                return dict(moves[0])
        return super().sample_relative(study, trial, search_space)


class Alternating(BaseSampler):
    """TPE, with every other trial after its startup the ``other`` sampler's point: TPE's
    model and a second way to propose, one trial each."""

    def __init__(self, tpe: TPESampler, other: BaseSampler):
        self._tpe, self._other = tpe, other

    def _pick(self, study: optuna.Study) -> BaseSampler:
        done = len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,
                                                           TrialState.PRUNED)))
        return self._other if done >= STARTUP_TRIALS and done % 2 else self._tpe

    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial
                                    ) -> dict[str, BaseDistribution]:
        return self._pick(study).infer_relative_search_space(study, trial)

    def sample_relative(self, study: optuna.Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        return self._pick(study).sample_relative(study, trial, search_space)

    def sample_independent(self, study: optuna.Study, trial: FrozenTrial, param_name: str,
                           param_distribution: BaseDistribution) -> Any:
        return self._tpe.sample_independent(study, trial, param_name, param_distribution)

    def before_trial(self, study: optuna.Study, trial: FrozenTrial) -> None:
        self._tpe.before_trial(study, trial)

    def after_trial(self, study: optuna.Study, trial: FrozenTrial, state: TrialState,
                    values: Any) -> None:
        self._tpe.after_trial(study, trial, state, values)


@dataclass(frozen=True)
class SamplerSpec:
    name: str
    about: str
    make: Callable[[TuningTask, int], BaseSampler]
    #: a proposal breaking a restriction is redrawn (a FAIL trial) and costs no trial
    valid_only: bool
    #: the tuner's startup points lead (baseline, then seeded valid points); else the baseline
    startup: bool = True
    #: the startup points take the kernel's tuned entries at its other shapes first
    transfer: bool = False


def _tpe(task: TuningTask, seed: int) -> TPESampler:
    return TPESampler(seed=seed, n_startup_trials=STARTUP_TRIALS)


def _mixed(task: TuningTask, seed: int) -> BaseSampler:
    return Alternating(_tpe(task, seed), ValidPoints(task, seed, salt=":mixed"))  # not random's


def _local(task: TuningTask, seed: int) -> BaseSampler:
    return Alternating(_tpe(task, seed), LocalMoves(task, seed))


SAMPLERS = {s.name: s for s in (
    SamplerSpec("tpe", "Optuna's TPE (knobs modelled jointly) after the startup points; a "
                "proposal breaking a restriction is a pruned trial that TPE learns from",
                _tpe, False),
    SamplerSpec("random", "uniform over the valid points, none twice, after the baseline",
                ValidPoints, True, startup=False),
    SamplerSpec("tpe-valid", "as tpe, but a proposal breaking a restriction is redrawn and "
                "costs no trial", _tpe, True),
    SamplerSpec("mixed", "the reference search: tpe-valid with every other trial a uniform "
                "valid point", _mixed, True),
    SamplerSpec("tpe-transfer", "as tpe-valid, the startup led by the kernel's tuned entries "
                "at its other shapes that are valid here, the nearest shape first",
                _tpe, True, transfer=True),
    SamplerSpec("tpe-local", "as tpe-transfer, with every other trial after the startup a "
                "one-knob move from the best point so far (valid, not tried yet)", _local, True,
                transfer=True),
)}


def check_sampler(name: str) -> None:
    """ValueError in one line when ``name`` is not a sampler."""
    if name not in SAMPLERS:
        raise ValueError(f"--sampler {name!r} is unknown; samplers: {', '.join(SAMPLERS)}")


def first_points(task: TuningTask, name: str, trials: int, seed: int, fresh: bool = False,
                 transferred: Sequence[Point] | None = None) -> list[Point]:
    """The points a new search of sampler ``name`` queues first: the tuner's startup points
    (``spaces.startup_points``), else the baseline alone. A sampler that transfers takes
    ``transferred`` (a measurement's, kept in its record), else ``task.transferred``."""
    spec = SAMPLERS[name]
    if not spec.startup:
        return [dict(task.baseline)]
    transfer = () if not spec.transfer else \
        task.transferred if transferred is None else transferred
    return startup_points(task, trials, seed, fresh, transfer=transfer)


def make(name: str, task: TuningTask, seed: int) -> BaseSampler:
    return SAMPLERS[name].make(task, seed)


def ask(study: optuna.Study, task: TuningTask, name: str) -> tuple[optuna.Trial, Point]:
    """The study's next trial and its point. For a ``valid_only`` sampler a proposal that
    breaks a restriction is told FAIL (no finished trial, nothing learnt) and drawn again; after
    MAX_REDRAWS a valid point sharing most knob values with the last one is taken (``closest``,
    ties drawn with the study's trial count as seed, so a replay draws the same). A queued
    point is never redrawn: the caller asked for that point (a baseline that cannot run is then
    recorded infeasible, as any sampler records it, instead of queued again for good)."""
    point: Point = {}
    for _ in range(MAX_REDRAWS if SAMPLERS[name].valid_only else 1):
        queued = SAMPLERS[name].valid_only and bool(
            study.get_trials(deepcopy=False, states=(TrialState.WAITING,)))
        trial = study.ask()
        point = suggest(trial, task.space)
        if queued or not SAMPLERS[name].valid_only or task.space.violated(
                point, task.template, task.launch_env) is None:
            return trial, point
        study.tell(trial, state=TrialState.FAIL)
    study.enqueue_trial(closest(task, point, random.Random(len(study.trials))))
    trial = study.ask()
    return trial, suggest(trial, task.space)
