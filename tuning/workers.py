"""Several workers on one study: on one machine (processes sharing a reports folder) or on
several (a PostgreSQL storage).

Every decision about the study is taken in a worker's *turn*, which is exclusive across
workers: counting the trials, failing those of dead workers, asking for the next trial and
sampling its configuration. A RUNNING trial is the claim on its configuration: a worker that
samples a configuration another live worker is timing waits for that result instead of timing
it again. A turn is an ``fcntl`` lock next to the storage, or a PostgreSQL advisory lock; both
are released by the operating system or the server when their holder dies.
"""
from __future__ import annotations

import hashlib
import os
import socket
import threading
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import optuna
from optuna.exceptions import UpdateFinishedTrialError
from optuna.storages import BaseStorage, RDBStorage
from optuna.trial import FrozenTrial, TrialState

from pycuda_heads.records import pid_alive

from .locks import FileLock

#: seconds between looks at the study while waiting for another worker's trial
POLL_S = 0.05
HOST = socket.gethostname()


class Turns:
    """The exclusive turn of the workers of one study."""

    def __init__(self, storage: BaseStorage, study_name: str, lock_path: Path):
        self._pg = isinstance(storage, RDBStorage) and \
            storage.engine.dialect.name == "postgresql"
        self._storage = storage
        self._key = int.from_bytes(hashlib.sha256(study_name.encode()).digest()[:8], "big",
                                   signed=True)
        self._file = None if self._pg else FileLock(lock_path)

    @contextmanager
    def turn(self) -> Iterator[None]:
        if self._file is not None:
            with self._file:
                yield
            return
        from sqlalchemy import text
        with self._storage.engine.connect() as conn:  # type: ignore[attr-defined]
            conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": self._key})
            try:
                yield
            finally:
                conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": self._key})
                conn.commit()


def claim(study: optuna.Study, trial: optuna.Trial) -> None:
    """Mark ``trial`` as this process's (taken in the turn that asked for it)."""
    study._storage.set_trial_system_attr(trial._trial_id, "worker",
                                         {"host": HOST, "pid": os.getpid()})


def is_dead(t: FrozenTrial) -> bool:
    """A RUNNING trial whose worker is gone. Called in a turn: a trial is asked for and claimed
    in one turn, so an unclaimed RUNNING trial was left by a worker that died in between.
    Workers on other machines are judged by their heartbeat (``fail_stale``)."""
    owner = t.system_attrs.get("worker")
    return owner is None or (owner["host"] == HOST and not pid_alive(int(owner["pid"])))


def fail_stale(study: optuna.Study) -> int:
    """Fail the RUNNING trials of dead workers and queue their configurations again; the
    number failed. Storages with heartbeats also fail trials silent for the grace period."""
    with warnings.catch_warnings():  # experimental in Optuna, and the way to do this
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)  # a no-op without heartbeats
    failed = 0
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if not is_dead(t):
            continue
        try:
            study._storage.set_trial_state_values(t._trial_id, TrialState.FAIL)
        except UpdateFinishedTrialError:
            continue
        failed += 1
        if t.params:
            study.enqueue_trial(t.params)
    return failed


def running_elsewhere(study: optuna.Study, trial: optuna.Trial,
                      params: dict[str, Any]) -> FrozenTrial | None:
    """Another RUNNING trial on the same configuration (another worker's claim)."""
    return next((t for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
                 if t.number != trial.number and t.params == params), None)


@contextmanager
def heartbeat(study: optuna.Study, trial: optuna.Trial) -> Iterator[None]:
    """Beat for ``trial`` while it runs, on storages that watch heartbeats."""
    storage = getattr(study._storage, "_backend", study._storage)  # under Optuna's cache
    interval = storage.get_heartbeat_interval() if isinstance(storage, RDBStorage) else None
    if not interval:
        yield
        return
    stop = threading.Event()

    def beat() -> None:
        while True:
            storage.record_heartbeat(trial._trial_id)
            if stop.wait(interval):
                return

    thread = threading.Thread(target=beat, name="optuna-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
