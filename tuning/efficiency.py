"""Tuner efficiency, on the CPU: replay TPE (as the tuner configures it) against each
exhaustive cache over a few seeds and count the trials it needs to come within 3% of the
exhaustive best. Written to ``reports/<slug>/tuning/efficiency.json`` for the reports."""
from __future__ import annotations

import json
import logging
import statistics
from pathlib import Path
from typing import Any, Mapping, Sequence

import optuna

from pycuda_heads import records
from pycuda_heads.core.space import Point

from .cache import (
    COMPLETE,
    ERROR,
    FAILED_VALIDATION,
    INFEASIBLE,
    Evaluation,
    TuningCache,
)
from .progress import Budget, Progress
from .session import Session
from .spaces import TuningTask, all_points, point_key
from .export import read_cache
from .storage import cache_files, tuning_dir
from .samplers import make
from .study import run_tpe

log = logging.getLogger("pycuda_heads.tuning")


def trials_to_within(task: TuningTask, replay: Replay, target_us: float, seed: int,
                     max_trials: int) -> tuple[int | None, int | None]:
    """(trials, distinct configurations) TPE took until its best validated time was at most
    ``target_us``; (None, None) if it did not get there in ``max_trials``. The shipped table's
    point is not among its first trials: that would hand the search its answer."""
    cache = TuningCache(task)  # in memory: the replay must not touch the real record
    session = Session(task, replay, replay, cache)
    study = optuna.create_study(storage=optuna.storages.InMemoryStorage(),
                                sampler=make("tpe", task, seed))

    def reached() -> bool:
        best = cache.best()
        return best is not None and best.time_us <= target_us

    run_tpe(session, study, seed=seed, trials=max_trials, budget=Budget(),
            progress=Progress(enabled=False), stop=reached, fresh=True)
    point_of = {n: point_key(e.params) for e in cache.evaluations for n in e.trial_numbers}
    seen: set[str] = set()
    for n, h in enumerate(cache.history, start=1):
        seen.add(point_of[h["trial"]])
        if h["best_so_far_us"] is not None and h["best_so_far_us"] <= target_us:
            return n, len(seen)
    return None, None


def efficiency_of(data: dict[str, Any], seeds: Sequence[int], within: float = 0.03
                  ) -> dict[str, Any] | None:
    """The efficiency record of one cache file's JSON; None when it is not exhaustive (some
    point was never evaluated) or has no validated best."""
    from pycuda_heads.catalog import catalog
    if data["kernel"] not in catalog():
        return None
    task = TuningTask.from_spec(catalog()[data["kernel"]], data["shape"], data["gpu"],
                                data["gpu_slug"], data["template"])
    recorded = TuningCache(task)
    recorded.fill(data)
    points = all_points(task)
    replay = Replay(recorded.evaluations)
    best = recorded.best()
    if best is None or not replay.covers(points):
        return None
    runs = [trials_to_within(task, replay, best.time_us * (1 + within), seed, 2 * len(points))
            for seed in seeds]
    trials = [r[0] for r in runs]
    return {"kernel": task.kernel, "template": dict(task.template), "shape": dict(task.shape),
            "n_points": len(points),
            "n_timed": sum(e.time_us is not None for e in recorded.evaluations),
            "exhaustive_best_us": best.time_us, "exhaustive_best_params": best.params,
            "within": within, "seeds": list(seeds), "trials_to_3pct": trials,
            "configurations_to_3pct": [r[1] for r in runs],
            "median_trials_to_3pct": _median(trials)}


def run_efficiency(reports: Path, slug: str, seeds: Sequence[int] = range(5),
                   within: float = 0.03, replace: bool = False) -> Path:
    """Add the records of the exhaustive caches of ``slug`` to its efficiency.json. The
    entries already there are kept, and their tasks not replayed again, unless ``replace``:
    the file ships with the reports, and one run may see only some of the caches."""
    tdir = tuning_dir(reports, slug)
    out = tdir / records.EFFICIENCY_JSON
    old = records.read_json(out, "tuner efficiency table") if out.is_file() else []
    if not isinstance(old, list) or not all(isinstance(r, dict) for r in old):
        raise ValueError(f"tuner efficiency table {out} is not a list of records; delete or "
                         "restore it")
    rows = {_key(r): r for r in old}
    for path in cache_files(tdir):
        data = read_cache(path)
        if _key(data) in rows and not replace:
            log.info("%s: already in %s; kept (--replace to replay it)", path.name, out.name)
            continue
        record = efficiency_of(data, list(seeds), within)
        if record is None:
            log.info("%s: not an exhaustive cache with a validated best; skipped", path.name)
        else:
            rows[_key(record)] = record
            log.info("%s %s: trials to within %.0f%%: %s", record["kernel"], record["shape"],
                     100 * within, record["trials_to_3pct"])
    records.write_json(out, list(rows.values()))
    return out


def _key(record: Mapping[str, Any]) -> tuple[str, str, str]:
    """What a record is of: kernel, template, shape. Records written before they named their
    template were of the suite template."""
    from pycuda_heads.catalog import SUITE_TEMPLATE, catalog
    kernel, template = record.get("kernel"), record.get("template")
    if template is None and isinstance(kernel, str) and kernel in catalog():
        template = catalog()[kernel].template(SUITE_TEMPLATE)
    return (str(kernel), json.dumps(template, sort_keys=True),
            json.dumps(record.get("shape"), sort_keys=True))


def _median(values: list[int | None]) -> float | None:
    """Median with 'never' counted as worse than any count; None when that is the median."""
    ranked = sorted(values, key=lambda v: float("inf") if v is None else v)
    if not ranked:
        return None
    lo, hi = ranked[(len(ranked) - 1) // 2], ranked[len(ranked) // 2]
    return None if lo is None or hi is None else float(statistics.mean((lo, hi)))


class Replay:
    """Feasibility (``replay(point)``) and evaluator (``time``/``validate``) from recorded
    evaluations. A timed configuration that was never validated (it was slower than a
    validated one) is taken to pass."""

    def __init__(self, evaluations: list[Evaluation]):
        self._evals = {point_key(e.params): e for e in evaluations}

    def covers(self, points: list[Point]) -> bool:
        return all(point_key(p) in self._evals for p in points)

    def _get(self, params: Point) -> Evaluation:
        return self._evals[point_key(params)]

    def __call__(self, params: Point) -> str | None:
        ev = self._get(params)
        return ev.reason if ev.state == INFEASIBLE else None

    def time(self, params: Point) -> Mapping[str, float]:
        ev = self._get(params)
        if ev.state == ERROR:
            raise RuntimeError(ev.reason or "recorded error")
        return {"median_us": ev.time_us, "p20_us": ev.p20_us, "p80_us": ev.p80_us}

    def validate(self, params: Point) -> tuple[bool, str | None]:
        ev = self._get(params)
        if ev.state == FAILED_VALIDATION:
            return False, ev.reason
        return ev.state == COMPLETE, None
