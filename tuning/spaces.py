"""Optuna's view of a kernel's launch-parameter space (one categorical per knob, the canonical
key of a point) and what one study tunes: a kernel, its template constants, a problem shape,
on one GPU."""
from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Callable, Mapping, Sequence

import optuna
from optuna.distributions import CategoricalDistribution

from pycuda_heads.core.op import op_source_hash
from pycuda_heads.core.space import SM90_MAX_SHARED_BYTES, KernelSpace, Point
from pycuda_heads.core.spec import KernelSpec
from pycuda_heads.core.tuned import load_table
from pycuda_heads.records import dims_label


def distributions(space: KernelSpace) -> dict[str, CategoricalDistribution]:
    return {knob: CategoricalDistribution(tuple(values)) for knob, values in space.params.items()}


def suggest(trial: optuna.Trial, space: KernelSpace) -> Point:
    """One point of ``space`` chosen by the trial's sampler."""
    return {knob: trial.suggest_categorical(knob, tuple(values))
            for knob, values in space.params.items()}


def takes(space: KernelSpace, partial: Mapping[str, Any]) -> bool:
    """Whether ``space`` has every knob of a partial point (a ``--try``)."""
    return set(partial) <= set(space.params)


def all_points(task: "TuningTask") -> list[Point]:
    """Every point the task's restrictions allow (launch restrictions aside), its baseline
    first (every table entry is compared with it), the rest in a fixed order."""
    first = dict(task.baseline)
    return [first] + [p for p in task.space.points(task.template) if p != first]


#: Trials TPE samples at random before it models the results. The tuner draws them itself
#: (seeded per task), so a sweep compiles them all in parallel before any timing.
STARTUP_TRIALS = 10
#: the most startup trials that ``transfer`` takes from the kernel's entries at other shapes
TRANSFER_POINTS = 4


def startup_points(task: "TuningTask", trials: int, seed: int, fresh: bool = False,
                   transfer: Sequence[Point] = ()) -> list[Point]:
    """The first trials of the task's TPE study (STARTUP_TRIALS, or more where the user's tries
    need them; never more than ``trials``): its baseline, the shipped table's point for the
    task (so a re-tune after a source change starts from what won before), the user's tries,
    up to TRANSFER_POINTS of ``transfer`` (the kernel's entries at its other shapes:
    ``task.transferred``), then valid points drawn at random with a seed of ``seed`` and the
    task's name, those bringing most knob values not drawn yet first (so a layout that few
    valid points take is still tried before TPE models the results). ``fresh``: neither the
    shipped point nor the tries (a measurement of the search must not be handed its answer;
    the other shapes' entries are knowledge a new task would have too)."""
    first = [dict(task.baseline)]
    known = [] if fresh else ([] if task.shipped is None else [task.shipped]) + task.tried
    known = known + list(transfer)[:TRANSFER_POINTS]
    for point in known:
        if point not in first:
            first.append(point)
    valid = [p for p in all_points(task)[1:]
             if p not in first and task.space.violated(p, task.template, task.launch_env) is None]
    random.Random(f"{seed}:{task.name}").shuffle(valid)
    # The order does not depend on trials, so it is a prefix for any number of them.
    order = first + greedy_cover(valid, first, limit=STARTUP_TRIALS - len(first))
    rest = [p for p in valid if p not in order]
    return (order + rest)[:max(1, min(trials, max(STARTUP_TRIALS, len(first))))]


def greedy_cover(candidates: list[Point], seen_in: list[Point],
                 features: Callable[[Point], Any] = lambda p: p.items(),
                 limit: int | None = None) -> list[Point]:
    """Candidates in greedy order, each the first with the most features (by default its
    (knob, value) pairs) that neither ``seen_in`` nor the points before it have; stops when no
    candidate brings a new one, or after ``limit`` points."""
    seen = {f for p in seen_in for f in features(p)}
    left, order = list(candidates), []
    while left and (limit is None or len(order) < limit):
        gains = [len(set(features(p)) - seen) for p in left]
        best = max(range(len(left)), key=gains.__getitem__)
        if gains[best] == 0:
            break
        seen.update(features(left[best]))
        order.append(left.pop(best))
    return order


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
    #: the GPU's opt-in shared memory per block, as the op reads it (``device.max_shared_bytes``)
    max_shared_bytes: int = SM90_MAX_SHARED_BYTES
    #: partial points the user asked to try first (``--try``), as typed
    tries: tuple[Mapping[str, Any], ...] = field(default=(), compare=False)

    @classmethod
    def from_spec(cls, spec: KernelSpec, shape: Mapping[str, int], gpu: str, slug: str,
                  template: Mapping[str, int] | None = None,
                  max_shared_bytes: int = SM90_MAX_SHARED_BYTES,
                  tries: tuple[Mapping[str, Any], ...] = ()) -> "TuningTask":
        from pycuda_heads.catalog import SUITE_TEMPLATE
        return cls(kernel=spec.id, space=spec.space,
                   template=spec.template({**SUITE_TEMPLATE, **(template or {})}),
                   shape={k: int(v) for k, v in shape.items()}, gpu=gpu, slug=slug, spec=spec,
                   source_hash=op_source_hash(spec.op), max_shared_bytes=max_shared_bytes,
                   tries=tuple(tries))

    @property
    def launch_env(self) -> dict[str, int]:
        """The shape and device limit the launch restrictions are evaluated at."""
        return {**self.shape, "MAX_SHARED_BYTES": self.max_shared_bytes}

    @cached_property
    def baseline(self) -> Point:
        """The point the op runs here without a tuned entry (``Op._resolve``): the space's
        default, or the nearest valid point where the default cannot run (a wide template).
        Every tuned configuration is compared with it."""
        return self.space.nearest(self.space.default, self.template, self.launch_env)

    @cached_property
    def tried(self) -> list[Point]:
        """The ``tries`` that apply here, completed from the default: those naming only knobs of
        this space and valid at this template and shape (a value the space lacks is an error)."""
        out: list[Point] = []
        for partial in self.tries:
            if not takes(self.space, partial):
                continue
            point = self.space.complete(partial, self.template)
            if (self.space.violated(point, self.template, self.launch_env) is None
                    and point not in out):
                out.append(point)
        return out

    @cached_property
    def shipped(self) -> Point | None:
        """The exported table's point for this kernel, template and shape, whatever sources it
        was tuned with, completed for knobs added since; None when absent or no longer valid."""
        table = load_table(self.slug) or {}
        for entry in table.get("entries", ()):
            if (entry.get("kernel") == self.kernel and entry.get("shape") == dict(self.shape)
                    and entry.get("template", dict(self.template)) == dict(self.template)):
                return self._runnable(entry)
        return None

    def _runnable(self, entry: Mapping[str, Any]) -> Point | None:
        """A table entry's point completed for knobs added since, or None when one of its
        values left the space or the point breaks a restriction here."""
        try:
            point = self.space.complete(
                {k: v for k, v in entry["params"].items() if k in self.space.params},
                self.template)
        except ValueError:
            return None
        return point if self.space.violated(point, self.template,
                                            self.launch_env) is None else None

    @cached_property
    def transferred(self) -> list[Point]:
        """The exported table's points for this kernel at its other shapes and templates,
        completed for this template and valid here, each once, the nearest first: by the sum
        over the shape's and the template's axes of |log2| of their ratio (an axis the other
        entry lacks counts one)."""
        table = load_table(self.slug) or {}
        own = {**self.template, **self.shape}
        ranked: list[tuple[float, int, Point]] = []
        for i, entry in enumerate(table.get("entries", ())):
            there = {**entry.get("template", {}), **entry.get("shape", {})}
            point = None if entry.get("kernel") != self.kernel or there == own \
                else self._runnable(entry)
            if point is None:
                continue
            far = sum(abs(math.log2(own[a] / there[a])) if there.get(a, 0) > 0 else 1.0
                      for a in own)
            ranked.append((far, i, point))
        out: list[Point] = []
        for _, _, point in sorted(ranked, key=lambda r: r[:2]):
            if point not in out and point != self.baseline:
                out.append(point)
        return out

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

