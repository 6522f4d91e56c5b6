"""Where tuning data lives: the per-GPU folder, the cache files and the Optuna storage
(an embedded journal file by default, which needs no server; a SQLite file; or a PostgreSQL
server shared by several machines, with heartbeats so that a dead worker's trial is retried)."""
from __future__ import annotations

import json
import logging
import os
import time
import warnings
from pathlib import Path
from typing import Any

import optuna
from optuna.storages import BaseStorage, JournalStorage, RDBStorage
from optuna.storages.journal import JournalFileBackend

from pycuda_heads import records

from .locks import FileLock, JournalLock
from .spaces import TuningTask

log = logging.getLogger("pycuda_heads.tuning")

#: seconds between a running trial's heartbeats, and without one before it counts as dead
HEARTBEAT_S = 10
GRACE_S = 60
POSTGRES = ("postgresql://", "postgresql+psycopg://")
INSTALL_DISTRIBUTED = ("PostgreSQL storage needs psycopg: pip install '.[distributed]' from a "
                       "checkout of pycuda-heads")


def tuning_dir(out: Path, slug: str) -> Path:
    """``<out>/<slug>/tuning``: caches, journal, efficiency data and the run log of one GPU."""
    return Path(out) / slug / records.TUNING_DIR


def cache_path(tdir: Path, task: TuningTask) -> Path:
    return tdir / f"{task.name}.json"


def cache_files(tdir: Path) -> list[Path]:
    """Every task cache in a tuning folder (their names hold two '__' separators)."""
    return sorted(p for p in Path(tdir).glob(records.CACHE_GLOB))


def check_storage(spec: str | None) -> None:
    """ValueError with one line when ``spec`` cannot be a storage: an unknown URL scheme, a
    SQLite file in a missing folder, PostgreSQL without its driver."""
    if not spec:
        return
    if spec.startswith(POSTGRES):
        try:
            import psycopg  # noqa: F401
        except ImportError:
            raise ValueError(INSTALL_DISTRIBUTED) from None
    elif spec.startswith("sqlite:///"):
        folder = Path(spec[len("sqlite:///"):]).parent
        if not folder.is_dir():
            raise ValueError(f"--storage {spec}: folder {folder} does not exist")
    elif "://" in spec:
        raise ValueError(f"--storage {spec}: unsupported; use a journal file path, "
                         "sqlite:///FILE or postgresql://USER@HOST/DB")


def open_storage(spec: str | BaseStorage | None, tdir: Path, heartbeat_s: int = HEARTBEAT_S,
                 grace_s: int = GRACE_S) -> BaseStorage:
    """None: the journal file in ``tdir``. 'sqlite:///...' and 'postgresql://...' are RDB
    storages (with heartbeats: a trial whose worker died is failed and retried); any other
    string is the path of a journal file."""
    if isinstance(spec, BaseStorage):
        return spec
    check_storage(spec)
    if spec and "://" in spec:
        return _rdb(spec, heartbeat_s, grace_s)
    path = Path(spec) if spec else Path(tdir) / records.JOURNAL
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = JournalLock(path)
    lock.acquire()
    try:
        repair_journal(path)
    finally:
        lock.release()
    return JournalStorage(JournalFileBackend(str(path), lock_obj=lock))


# what a worker sees when another creates the same schema at the same moment
_SCHEMA_RACES = ("UNIQUE", "locked", "duplicate", "already exists")


def _rdb(url: str, heartbeat_s: int, grace_s: int) -> RDBStorage:
    if url.startswith("postgresql://"):  # SQLAlchemy's default driver is psycopg2
        url = "postgresql+psycopg://" + url[len("postgresql://"):]
    kwargs: dict[str, Any] = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") \
        else {"pool_pre_ping": True}
    from sqlalchemy.exc import IntegrityError, OperationalError, ProgrammingError
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning,
                            message=".*(heartbeat|Heartbeat)")  # the documented way, flagged new
    for attempt in range(10):
        try:
            return RDBStorage(url, engine_kwargs=kwargs, heartbeat_interval=heartbeat_s,
                              grace_period=grace_s,
                              heartbeat_stale_trial_callback=optuna.storages.
                              RetryHeartbeatStaleTrialCallback())
        except (IntegrityError, OperationalError, ProgrammingError) as exc:
            # workers creating the schema at once: one wins, the others see its tables
            # (PostgreSQL reports a table created meanwhile as DuplicateTable, a ProgrammingError)
            if attempt == 9 or not any(race in str(exc) for race in _SCHEMA_RACES):
                raise ValueError(f"storage {url}: {str(exc).splitlines()[0]}") from None
            time.sleep(0.2 * (attempt + 1))
    raise AssertionError("unreachable")


def repair_journal(path: Path) -> None:
    """Drop a last line that a killed writer left torn; a ValueError naming the file and the
    fix when an earlier line is corrupt. Call with the journal lock held."""
    if not path.is_file():
        return
    data = path.read_bytes()
    lines = data.split(b"\n")
    keep = len(data) - len(lines[-1])  # a tail without its newline was never finished
    for number, line in enumerate(lines[:-1], start=1):
        try:
            json.loads(line)
        except ValueError:
            if number < len(lines) - 1:
                raise ValueError(
                    f"Optuna journal {path} line {number} is corrupt; restore the file or delete "
                    "it to start the studies afresh (the tuning caches keep every timing, so "
                    "nothing is timed again)") from None
            keep -= len(line) + 1
    if keep < len(data):
        log.warning("%s: dropped a torn last line (%d bytes) left by a killed run", path,
                    len(data) - keep)
        os.truncate(path, keep)


def open_study(task: TuningTask, storage: str | BaseStorage,
               sampler: optuna.samplers.BaseSampler) -> optuna.Study:
    """The task's study, created on first use and resumed after."""
    return optuna.create_study(study_name=task.study_name, storage=storage, sampler=sampler,
                               direction="minimize", load_if_exists=True)


def read_runs(tdir: Path) -> list[dict[str, Any]]:
    """The log of tuning runs of one GPU (``runs.json`` next to the caches): when, how long,
    how much was tried. Export sums it into the table's provenance."""
    path = Path(tdir) / records.RUNS_JSON
    return records.read_json(path, "tuning run log") if path.is_file() else []


def append_run(tdir: Path, record: dict[str, Any]) -> None:
    path = Path(tdir) / records.RUNS_JSON
    with FileLock(f"{path}.lock"):
        records.write_json(path, read_runs(tdir) + [record])
