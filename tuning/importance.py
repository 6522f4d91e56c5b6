"""Which knobs matter: Optuna's parameter importance over the timed configurations."""
from __future__ import annotations

import optuna

from .cache import Evaluation
from .spaces import distributions, point_key
from .task import TuningTask


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
