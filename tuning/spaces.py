"""Optuna's view of a kernel's launch-parameter space: one categorical per knob, and the
canonical text keys that name points, template constants and shapes in files and studies."""
from __future__ import annotations

import itertools
import json
from typing import Any, Mapping

import optuna
from optuna.distributions import CategoricalDistribution

from pycuda_heads.space import KernelSpace, Point


def distributions(space: KernelSpace) -> dict[str, CategoricalDistribution]:
    return {knob: CategoricalDistribution(tuple(values)) for knob, values in space.params.items()}


def suggest(trial: optuna.Trial, space: KernelSpace) -> Point:
    """One point of ``space`` chosen by the trial's sampler."""
    return {knob: trial.suggest_categorical(knob, tuple(values))
            for knob, values in space.params.items()}


def all_points(space: KernelSpace) -> list[Point]:
    """Every combination of knob values, the default first (it is the baseline every table
    entry is compared with), the rest in a fixed order; restrictions are not applied."""
    keys = list(space.params)
    default = dict(space.default)
    rest = [dict(zip(keys, values)) for values in itertools.product(*space.params.values())]
    return [default] + [p for p in rest if p != default]


def point_key(point: Mapping[str, Any]) -> str:
    """Canonical identity of a point (knob order does not matter)."""
    return json.dumps(dict(point), sort_keys=True)


def dims_key(dims: Mapping[str, Any]) -> str:
    """'B=4096,K=256' (sorted) for file and study names; 'none' when there are no entries."""
    return ",".join(f"{k}={int(dims[k])}" for k in sorted(dims)) or "none"


def parse_dims(text: str) -> dict[str, int]:
    """'B=4096,K=256' -> {'B': 4096, 'K': 256}."""
    out: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"expected NAME=INT pairs separated by commas, got {text!r}")
        try:
            out[key.strip()] = int(value)
        except ValueError:
            raise ValueError(f"{key.strip()} must be an integer in {text!r}") from None
    return out
