"""How good the search is, measured: a long reference search of a task on the GPU, and the
samplers' searches replayed from its timings on the CPU.

Chains. A chain is one sampler's search of one task with one seed, as the tuner runs it (its
startup points without the shipped table's point, then ``samplers.ask``), for up to
``max(BUDGETS)`` trials. Its proposals depend only on the seed and on the results it was told,
so a chain run over recorded results proposes exactly what it proposed when they were timed.

Measurement (``efficiency --measure``, GPU). Per task the chains of the reference search (the
``mixed`` sampler for ``reference_trials`` trials, or every point where the space is no larger)
and of each measured sampler and seed run in lock step: each round, every chain is replayed over
the record until it proposes a point the record lacks; those points are compiled in parallel,
timed, validated where they could be the best, and the round repeats. Everything lives in the
task's reference record (``reports/<gpu>/tuning/reference/<task>.json``: the timings in a tuning
cache's format, and each chain's points), saved after every timing: a later run, on any machine,
replays the record and goes on where it stopped. Once every chain is complete, the reference
best and the point the op runs today are timed interleaved in one run (the verdict).

Replay scheme: the curves show only chains whose every trial was timed in the measurement, so a
replayed sampler never meets a point without a timing; a chain that stops at such a point is
censored (its budgets past that trial are not drawn) and the point is what the next GPU round
times. The reference best is the fastest validated configuration of the whole record."""
from __future__ import annotations

import datetime as dt
import logging
import statistics
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import optuna

from pycuda_heads import records
from pycuda_heads.catalog import SUITE_TEMPLATE
from pycuda_heads.core.space import SM90_MAX_SHARED_BYTES, Point

from . import DEFAULT_SAMPLER
from .cache import P_VALUE, Evaluation, TuningCache
from .progress import Bar, Budget, Progress
from .samplers import SAMPLERS, ask, first_points, make
from .session import Evaluator, Session
from .spaces import TuningTask, all_points, point_key
from .storage import cache_path, tuning_dir
from .study import outcome
from .tune import compare_with_default, speedup_test

log = logging.getLogger("pycuda_heads.tuning")

#: trials at which the curves are read
BUDGETS = (12, 25, 50, 100)
REFERENCE_TRIALS = 300
REFERENCE_SAMPLER = "mixed"
#: the tasks measured unless told otherwise: (kernel, shape, template over the suite's); the
#: small spaces (timed whole in a minute or two) first, so a short first round finishes them
TASKS = (("frdhead.grad_w2", "B=65536", None), ("pool.forward", "B=512,K=64", "N_HORIZONS=32"),
         ("pool.forward", "B=4096,K=256", None), ("pool.backward", "B=4096,K=256", None))
SCHEME = ("Each curve point is the best time a sampler's search had found after that many "
          "trials, as a percentage of the reference best (100: as fast), per seed. Every "
          "trial of a drawn search was timed on the GPU in the reference measurement: the "
          "searches were run there and are replayed here exactly, never filled in; a budget "
          "that a search has not reached in the measurement yet is left out (censored). The "
          "reference best is the fastest validated configuration the measurement timed: "
          "every point where the space is small, else a mixed TPE and random search of "
          "reference_trials trials plus every sampler's searches. No search starts from the "
          "shipped table's point.")


class Record(TuningCache):
    """A task's reference record: its timings (a tuning cache) and each chain's points."""

    def __init__(self, task: TuningTask, path: Path | None = None):
        super().__init__(task, path)
        #: chain id -> the point keys of its trials, in order
        self.chains: dict[str, list[str]] = {}
        #: the reference best and the op's point timed interleaved
        self.verdict: dict[str, Any] | None = None
        #: the points a transferring sampler's searches started from (``task.transferred``
        #: when first measured: the table may change, the recorded searches must not)
        self.transferred: list[Point] | None = None

    def fill(self, data: dict[str, Any]) -> None:
        super().fill(data)
        for chain, keys in (data.get("chains") or {}).items():
            if len(keys) > len(self.chains.get(chain, ())):  # a chain only grows
                self.chains[chain] = list(keys)
        self.verdict = self.verdict or data.get("verdict")
        if self.transferred is None and data.get("transferred") is not None:
            self.transferred = [dict(p) for p in data["transferred"]]

    def to_json(self) -> dict[str, Any]:
        return {**super().to_json(), "max_shared_bytes": self.task.max_shared_bytes,
                "chains": self.chains, "verdict": self.verdict,
                **({} if self.transferred is None else {"transferred": self.transferred})}


def reference_path(out: Path, task: TuningTask) -> Path:
    return tuning_dir(out, task.slug) / records.REFERENCE_DIR / f"{task.name}.json"


def stale_record(path: Path, task: TuningTask) -> bool:
    """Whether ``path`` holds a record of other kernel sources (measuring would replace it)."""
    if not path.is_file():
        return False
    return records.read_json(path, "reference record").get("source_hash") != task.source_hash


def running_point(task: TuningTask) -> Point:
    """The point the op runs today: the shipped table's, else the baseline."""
    return dict(task.shipped if task.shipped is not None else task.baseline)


class Chain:
    """One sampler's search of one task with one seed: ``next()`` is its next trial's point
    (asked once), ``tell`` that point's result."""

    def __init__(self, task: TuningTask, sampler: str, seed: int, trials: int,
                 transferred: Sequence[Point] | None = None):
        self.task, self.sampler, self.seed, self.trials = task, sampler, seed, trials
        self.id = f"{sampler}:{seed}"
        self.study = optuna.create_study(storage=optuna.storages.InMemoryStorage(),
                                         sampler=make(sampler, task, seed))
        first = first_points(task, sampler, trials, seed, fresh=True, transferred=transferred)
        for point in first:
            self.study.enqueue_trial(point)
        self.points: list[Point] = []
        self._asked: tuple[optuna.Trial, Point] | None = None

    def next(self) -> Point | None:
        """The point of the next trial; None once ``trials`` were told."""
        if len(self.points) >= self.trials:
            return None
        if self._asked is None:
            self._asked = ask(self.study, self.task, self.sampler)
        return self._asked[1]

    def tell(self, ev: Evaluation) -> None:
        assert self._asked is not None
        trial, point = self._asked
        told = outcome(ev, self.sampler, self.seed)
        for key, value in told["constraints"].items():
            trial.set_constraint(key, value)
        self.study.tell(trial, told["value"], state=told["state"])
        self.points.append(point)
        self._asked = None

    def advance(self, lookup: Callable[[Point], Evaluation | None]) -> Point | None:
        """Tell recorded results until a point has none: that point, or None when done."""
        while (point := self.next()) is not None and (ev := lookup(point)) is not None:
            self.tell(ev)
        return point


def chains_of(task: TuningTask, samplers: Sequence[str], seeds: Sequence[int],
              reference_trials: int, chain_trials: int | None = None,
              transferred: Sequence[Point] | None = None) -> list[Chain]:
    """The reference chain (none where the space has no more points than ``reference_trials``:
    then every point is timed) and one chain of ``chain_trials`` (default: the largest budget)
    per sampler and seed."""
    out = [] if len(all_points(task)) <= reference_trials else \
        [Chain(task, REFERENCE_SAMPLER, 0, reference_trials)]
    return out + [Chain(task, s, seed, chain_trials or max(BUDGETS), transferred)
                  for s in samplers for seed in seeds]


def _note(record: Record, chain: Chain) -> None:
    """Store the chain's points; a ValueError when they contradict the stored ones (the
    sampler or Optuna changed since: the record no longer replays)."""
    keys = [point_key(p) for p in chain.points]
    stored = record.chains.get(chain.id, [])
    n = min(len(keys), len(stored))
    if keys[:n] != stored[:n]:
        at = next(i for i in range(n) if keys[i] != stored[i])
        raise ValueError(f"reference record {record.path}: chain {chain.id} proposed another "
                         f"point at trial {at + 1} than it did when measured (the sampler or "
                         "Optuna changed); measure again with --replace")
    if len(keys) > len(stored):
        record.chains[chain.id] = keys


Warm = Callable[[list[Point]], None]


def measure(task: TuningTask, evaluator: Evaluator, feasibility: Callable[[Point], str | None],
            record: Record, *, samplers: Sequence[str], seeds: Sequence[int],
            reference_trials: int = REFERENCE_TRIALS, chain_trials: int | None = None,
            budget: Budget | None = None, progress: Progress | None = None,
            warm: Warm | None = None) -> bool:
    """Run the task's measurement until every chain is complete (True; the samplers' chains
    at ``chain_trials``) or ``budget`` is spent (False; a re-run resumes), then its
    verdict."""
    budget = budget or Budget()
    progress = progress or Progress(enabled=False)
    session = Session(task, feasibility, evaluator, record)
    if record.transferred is None and any(SAMPLERS[s].transfer for s in samplers):
        record.transferred = task.transferred
    chains = chains_of(task, samplers, seeds, reference_trials, chain_trials,
                       record.transferred)
    everything = all_points(task) if not chains or chains[0].sampler != REFERENCE_SAMPLER \
        else []
    with progress.bar(None, f"{task.label()} reference", unit="config") as bar:
        while True:
            wanted = [running_point(task), *everything, *(c.advance(record.get) for c in chains)]
            for chain in chains:
                _note(record, chain)
            pending = list({point_key(p): p for p in wanted
                            if p is not None and record.get(p) is None}.values())
            record.save()
            if not pending:
                break
            if budget.expired():
                return False
            if warm is not None:
                warm(pending)
            for point in pending:
                if budget.expired():
                    break
                bar.candidate(point)
                session.evaluate(point)
                best = record.best()
                bar.done(best.time_us if best else None)
            session.settle()  # before any chain is told: a told result never changes after
    judge(task, evaluator, record)
    record.save()
    return True


def judge(task: TuningTask, evaluator: Evaluator, record: Record) -> None:
    """Time the reference best and the op's point interleaved, in this run, into the record's
    verdict (kept while both are the same points); skipped without an interleaving evaluator."""
    best, running = record.best(), running_point(task)
    if best is None or not hasattr(evaluator, "interleaved"):
        return
    pair = {"reference_params": best.params, "running_params": running}
    if record.verdict is not None and all(record.verdict.get(k) == v for k, v in pair.items()):
        return
    made = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "commit": records.git_state()["describe"]}
    if best.params == running:
        record.verdict = {**pair, **made, "speedup": 1.0, "ci": [1.0, 1.0], "p_value": 1.0,
                          "samples": 0}
        return
    t_best, t_running = evaluator.interleaved(best.params, running)
    verdict = speedup_test(t_best, t_running)  # speedup: the op's point / the reference best
    verdict.pop("significant")  # that is the ship-over-default rule; ``replaceable`` is this one
    record.verdict = {**pair, **made, **verdict}


def replaceable(verdict: Mapping[str, Any] | None, within: float) -> bool:
    """Whether a verdict says the op's point is more than ``within`` slower than the reference
    best, beyond noise."""
    return bool(verdict) and verdict["speedup"] > 1 + within \
        and verdict["p_value"] < P_VALUE


def adopt(task: TuningTask, evaluator: Evaluator, record: Record, out: Path) -> str:
    """Put the reference best into the task's tuning cache and compare it with the baseline
    there (GPU), so that ``export`` ships it; what happened, in words."""
    best = record.best()
    assert best is not None
    cache = TuningCache.load(task, cache_path(tuning_dir(out, task.slug), task))
    cache.put(replace(best, trial_numbers=[]))
    baseline = record.get(task.baseline)  # every search starts there: the record has it
    if cache.default() is None and baseline is not None:
        cache.put(replace(baseline, trial_numbers=[]))
    if cache.best() is None or cache.best().params != best.params:
        return (f"kept: the tuning cache's best {cache.best().params} is faster on record "
                f"({cache.best().time_us:.2f} us, an earlier run); re-tune the task")
    compare_with_default(task, evaluator, cache)
    cache.save()
    return f"adopted {best.params} into {cache.path.name}; run export to ship it"


def curves(task: TuningTask, record: Record, samplers: Sequence[str], seeds: Sequence[int],
           within: float, progress: Progress | None = None) -> dict[str, Any] | None:
    """The task's entry of quality.json from its record; None without a validated best."""
    best = record.best()
    if best is None:
        return None
    running = record.get(running_point(task))
    out: dict[str, Any] = {}
    with (progress or Progress(enabled=False)).bar(len(samplers) * len(seeds),
                                                   f"{task.label()} replay", unit="search") as bar:
        for sampler in samplers:
            out[sampler] = _curve(task, record, sampler, seeds, best.time_us, within, bar)
    n_points = len(all_points(task))
    return {"kernel": task.kernel, "template": dict(task.template), "shape": dict(task.shape),
            "source_hash": task.source_hash, "n_points": n_points,
            "n_timed": sum(e.time_us is not None for e in record.evaluations),
            "exhaustive": all(record.get(p) is not None for p in all_points(task)),
            "reference": {"params": best.params, "time_us": best.time_us},
            "running": {"params": running_point(task),
                        "time_us": running.time_us if running is not None else None,
                        "percent": round(100 * best.time_us / running.time_us, 2)
                        if running is not None and running.counts else None},
            "verdict": record.verdict, "budgets": list(BUDGETS), "seeds": list(seeds),
            "within": within, "samplers": out}


def _curve(task: TuningTask, record: Record, sampler: str, seeds: Sequence[int],
           reference_us: float, within: float, bar: Bar) -> dict[str, Any]:
    """One sampler's curves: each seed's search replayed over the record."""
    rows, pending = [], set()
    for seed in seeds:
        chain = Chain(task, sampler, seed, max(BUDGETS), record.transferred)
        stop = chain.advance(record.get)
        bar.done(None)
        if stop is not None:
            pending.add(point_key(stop))
        times = [record.get(p) for p in chain.points]
        rows.append([_best_of(times[:b]) if len(times) >= b else None for b in BUDGETS])
    percent = [[None if t is None else round(100 * reference_us / t, 2) for t in row]
               for row in rows]
    return {"best_us": rows, "percent": percent,
            "complete": [sum(row[i] is not None for row in rows) for i in range(len(BUDGETS))],
            "within": [sum(t is not None and t <= reference_us * (1 + within) for t in col)
                       for col in zip(*rows)],
            "median_percent": [_median([p for p in col if p is not None])
                               for col in zip(*percent)],
            "pending": len(pending)}


def _best_of(evaluations: list[Evaluation | None]) -> float | None:
    times = [e.time_us for e in evaluations if e is not None and e.counts]
    return min(times) if times else None


def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 2) if values else None


def winner(entries: Sequence[Mapping[str, Any]], budget: int = 25) -> str | None:
    """The sampler whose searches came within each entry's ``within`` at ``budget`` trials in
    most (task, seed) pairs, then with the highest median percentage; only samplers complete
    at that budget on every entry compete. A tie keeps the tuner's sampler: a challenger has to
    beat it. None when none is."""
    if not entries or any(budget not in e["budgets"] for e in entries):
        return None
    names = set.intersection(*(set(e["samplers"]) for e in entries))
    scores = {}
    for name in names:
        at = [(e["samplers"][name], e["budgets"].index(budget), len(e["seeds"]))
              for e in entries]
        if all(curve["complete"][i] == seeds for curve, i, seeds in at):
            scores[name] = (sum(curve["within"][i] for curve, i, _ in at),
                            statistics.mean(curve["median_percent"][i] for curve, i, _ in at))
    if not scores:
        return None
    best = max(scores.values())
    tied = sorted(name for name, score in scores.items() if score == best)
    return DEFAULT_SAMPLER if DEFAULT_SAMPLER in tied else tied[0]


def write_quality(reports: Path, slug: str, entries: Sequence[dict[str, Any]],
                  replace_all: bool) -> Path:
    """Merge ``entries`` into the GPU's quality.json: an entry of the same task is replaced,
    the others are kept (unless ``replace_all``); the winner is decided again."""
    path = tuning_dir(reports, slug) / records.QUALITY_JSON
    old = records.read_json(path, "search quality record") if path.is_file() else {}
    if not isinstance(old, dict) or not isinstance(old.get("tasks", []), list):
        raise ValueError(f"search quality record {path} is not an object with a task list; "
                         "delete or restore it")
    rows = {} if replace_all else {_key(e): e for e in old.get("tasks", [])}
    rows.update({_key(e): e for e in entries})
    tasks = list(rows.values())
    records.write_json(path, {"scheme": SCHEME, "winner_at_25": winner(tasks), "tasks": tasks})
    return path


def _key(entry: Mapping[str, Any]) -> tuple[str, str, str]:
    return (entry["kernel"], records.dims_label(entry["template"]),
            records.dims_label(entry["shape"]))


def replay_all(reports: Path, slug: str, specs: Sequence[tuple[str, dict, dict | None]],
               samplers: Sequence[str] | None, seeds: Sequence[int], within: float,
               replace: bool = False, progress: Progress | None = None) -> Path | None:
    """Draw the curves of the GPU's reference records (those of ``specs`` when given) into
    its quality.json, on the CPU. Tasks it already holds are kept unless ``replace``; a
    record of other kernel sources than the installed ones is skipped. None: no record."""
    from pycuda_heads.catalog import catalog

    from .export import read_cache
    folder = tuning_dir(reports, slug) / records.REFERENCE_DIR
    path = tuning_dir(reports, slug) / records.QUALITY_JSON
    held = set() if replace or not path.is_file() else \
        {_key(e) for e in records.read_json(path, "search quality record").get("tasks", [])}
    entries = []
    for file in sorted(folder.glob(records.CACHE_GLOB)):
        data = read_cache(file)
        if data["kernel"] not in catalog():
            continue
        task = TuningTask.from_spec(catalog()[data["kernel"]], data["shape"], data["gpu"], slug,
                                    data["template"], data.get("max_shared_bytes",
                                                               SM90_MAX_SHARED_BYTES))
        wanted = not specs or any((k, s, task.spec.template({**SUITE_TEMPLATE, **(t or {})}))
                                  == (task.kernel, dict(task.shape), dict(task.template))
                                  for k, s, t in specs)
        if not wanted or (_key(data) in held):
            continue
        if data.get("source_hash") != task.source_hash:
            log.warning("%s: measured for other kernel sources; not replayed", file.name)
            continue
        record = Record(task)
        record.fill(data)
        entry = curves(task, record, samplers or list(SAMPLERS), seeds, within, progress)
        if entry is not None:
            entries.append(entry)
    if not entries and not path.is_file():
        return None
    return write_quality(reports, slug, entries, replace_all=replace and not specs)
