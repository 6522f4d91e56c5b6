"""Optuna's view of a kernel's launch-parameter space (one categorical per knob, the canonical
key of a point) and what one study tunes: a kernel, its template constants, a problem shape,
on one GPU."""
from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field
from typing import Any, Mapping

import optuna
from optuna.distributions import CategoricalDistribution

from pycuda_heads.core.op import op_source_hash
from pycuda_heads.core.space import KernelSpace, Point
from pycuda_heads.core.spec import KernelSpec
from pycuda_heads.records import dims_label


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


@dataclass(frozen=True)
class TuningTask:
    kernel: str
    space: KernelSpace
    template: Mapping[str, int]
    shape: Mapping[str, int]
    gpu: str
    slug: str
    #: the kernel's declaration; None for synthetic spaces in tests
    spec: KernelSpec | None = field(default=None, compare=False)
    #: identity of the kernel sources: a change starts a fresh cache and study
    source_hash: str = ""

    @classmethod
    def from_spec(cls, spec: KernelSpec, shape: Mapping[str, int], gpu: str, slug: str,
                  template: Mapping[str, int] | None = None) -> "TuningTask":
        from pycuda_heads.catalog import SUITE_TEMPLATE
        return cls(kernel=spec.id, space=spec.space,
                   template=spec.template({**SUITE_TEMPLATE, **(template or {})}),
                   shape={k: int(v) for k, v in shape.items()}, gpu=gpu, slug=slug, spec=spec,
                   source_hash=op_source_hash(spec.op))

    @property
    def family(self) -> str:
        return self.spec.family if self.spec is not None else ""

    @property
    def name(self) -> str:
        """File-name stem: '<kernel>__<template>__<shape>'."""
        return f"{self.kernel}__{dims_label(self.template)}__{dims_label(self.shape)}"

    @property
    def study_name(self) -> str:
        base = f"{self.slug}:{self.kernel}:{dims_label(self.template)}:{dims_label(self.shape)}"
        return f"{base}:{self.source_hash}" if self.source_hash else base

    def label(self) -> str:
        return f"{self.kernel} {dims_label(self.shape)}"

