"""Tuning many tasks in one run (the ``sweep`` and ``tune`` commands): decide feasibility of
every point of every task first (static checks in parallel threads), let the caller compile
the variants that will be timed (in parallel processes), then tune task after task until the
time budget is spent. Finished tasks stay finished; a re-run resumes the rest."""
from __future__ import annotations

import datetime as dt
import json
import logging
import os
import socket
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable, Sequence

from optuna.storages import BaseStorage

from pycuda_heads.core.space import Point
from pycuda_heads.records import dims_label

from . import DEFAULT_SAMPLER, constraints
from .cache import TuningCache
from .constraints import Feasibility
from .progress import Budget, Progress
from .samplers import first_points
from .session import Evaluator
from .spaces import TuningTask, all_points
from .storage import cache_path, log_run, tuning_dir
from .tune import TuneOutcome, tune

log = logging.getLogger("pycuda_heads.tuning")

#: receives every (task, point) that is feasible and not timed yet, before any timing
Warm = Callable[[list[tuple[TuningTask, Point]]], None]

#: how a worker spawned by ``--workers N`` learns the run it belongs to (a ``WorkerRun`` as JSON)
RUN_ENV = "PYCUDA_HEADS_RUN"


@dataclass(frozen=True)
class WorkerRun:
    """The run a process takes part in. The workers spawned by one ``--workers N`` command
    share its ``run_id`` and ``command``, so the run log can group them; a plain run is worker 0
    of 1."""
    run_id: str
    command: str = ""
    worker: int = 0
    workers: int = 1

    @classmethod
    def new(cls, command: str) -> WorkerRun:
        # microseconds: two runs started by one process (a library caller) stay apart
        started = dt.datetime.now(dt.timezone.utc).isoformat(timespec="microseconds")
        return cls(f"{started}/{os.getpid()}", command)

    @classmethod
    def current(cls, command: str) -> WorkerRun:
        """The run this process was spawned into (``RUN_ENV``), else a new run of its own."""
        text = os.environ.get(RUN_ENV)
        return cls(**json.loads(text)) if text else cls.new(command)

    def spawn_env(self, worker: int, workers: int) -> dict[str, str]:
        """The environment entry that makes a spawned process worker ``worker`` of this run."""
        return {RUN_ENV: json.dumps(asdict(replace(self, worker=worker, workers=workers)))}


def run_sweep(tasks: Sequence[TuningTask], *, evaluator_for: Callable[[TuningTask], Evaluator],
              feasibility_for: Callable[[TuningTask], Feasibility], out: Path,
              mode: str = "exhaustive", trials: int = 40, seed: int = 0,
              storage: str | BaseStorage | None = None, budget: Budget | None = None,
              progress: Progress | None = None, warm: Warm | None = None, workers: int = 1,
              run: WorkerRun | None = None, sampler: str = DEFAULT_SAMPLER
              ) -> list[TuneOutcome]:
    budget = budget or Budget()
    run = run or WorkerRun.new("")
    started = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    plans = [(task, feasibility_for(task)) for task in tasks]
    # TPE compiles ahead only the points its studies will ask first; exhaustive, all of them
    pending = [(task, feas, p) for task, feas in plans
               for p in _untimed(task, feas, out, all_points(task) if mode != "tpe"
                                 else first_points(task, sampler, trials, seed))]
    constraints.warm([(feas, p) for _, feas, p in pending], workers)
    if warm is not None:
        warm([(task, p) for task, feas, p in pending if feas(p) is None])
    log.info("%d tasks: feasibility decided and variants prepared in %.1f s",
             len(tasks), budget.elapsed())
    outcomes: list[TuneOutcome] = []
    # logged as running now, so that a run killed before its end stays in the log
    _log_run(tasks, outcomes, out, run=run, started=started, mode=mode, trials=trials,
             seed=seed, budget=budget, status="running")
    try:
        for task, feas in plans:
            if budget.expired():
                break
            outcomes.append(tune(task, evaluator_for(task), feas, out=out, mode=mode,
                                 trials=trials, seed=seed, storage=storage, budget=budget,
                                 progress=progress, sampler=sampler))
    finally:  # an interrupted run is logged too: its time counts in the provenance
        _log_run(tasks, outcomes, out, run=run, started=started, mode=mode, trials=trials,
                 seed=seed, budget=budget,
                 status="done" if len(outcomes) == len(tasks) and not any(
                     o.stopped for o in outcomes) else "unfinished")
    return outcomes


def _log_run(tasks: Sequence[TuningTask], outcomes: list[TuneOutcome], out: Path, *,
             run: WorkerRun, started: str, mode: str, trials: int, seed: int,
             budget: Budget, status: str) -> None:
    finished = {o.task.name for o in outcomes if not o.stopped}
    done = len(finished)
    stopped = done < len(tasks)
    missing = [f"{t.kernel} {dims_label(t.shape)}" for t in tasks if t.name not in finished]
    for slug in sorted({t.slug for t in tasks}):
        log_run(tuning_dir(out, slug), {
            "command": run.command, "started": started, "wall_s": round(budget.elapsed(), 1),
            "status": status, "host": socket.gethostname(), "pid": os.getpid(),
            "run_id": run.run_id, "workers": run.workers, "worker": run.worker,
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "mode": mode, "seed": seed, "tasks": len(tasks), "tasks_done": done,
            **({"trials_per_task": trials} if mode == "tpe" else {}),
            "trials": sum(o.trials for o in outcomes), "timed": sum(o.timed for o in outcomes),
            # which configurations this worker timed: duplicates across workers show here
            "timed_points": {o.task.name: o.timed_points for o in outcomes if o.timed_points},
            "unfinished": stopped, "missing": missing})
    if stopped and status != "running":
        log.warning("stopped after %.0f s: %d of %d tasks done; re-run the same command to "
                    "resume", budget.elapsed(), done, len(tasks))


def _untimed(task: TuningTask, feas: Feasibility, out: Path,
             points: Sequence[Point]) -> list[Point]:
    """Those of ``points`` that pass the task's restrictions and have no cached result yet."""
    cache = TuningCache.load(task, cache_path(tuning_dir(out, task.slug), task))
    return [p for p in points if cache.get(p) is None and feas.restriction(p) is None]
