"""Where tuning data lives: the per-GPU folder, the cache files and the Optuna storage
(an embedded journal file by default, which needs no server; a SQLite file; or a PostgreSQL
server shared by several machines, with heartbeats so that a dead worker's trial is retried)."""
from __future__ import annotations

import json
import logging
import os
import socket
import time
import warnings
from pathlib import Path
from typing import Any, Iterator

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
_SQLITE_HEADER = b"SQLite format 3\x00"
#: how every record of an Optuna journal begins (``json.dumps(..., separators=(",", ":"))``)
_RECORD = b'{"op_code":'
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
        path = Path(spec[len("sqlite:///"):])
        if not path.parent.is_dir():
            raise ValueError(f"--storage {spec}: folder {path.parent} does not exist")
        if path.is_file() and path.stat().st_size:
            with open(path, "rb") as f:
                if f.read(len(_SQLITE_HEADER)) != _SQLITE_HEADER:
                    raise ValueError(f"--storage {spec}: {path} is not a SQLite database")
    elif "://" in spec:
        raise ValueError(f"--storage {spec}: unsupported; use a journal file path, "
                         "sqlite:///FILE or postgresql://USER@HOST/DB")
    elif Path(spec).is_dir():
        raise ValueError(f"--storage {spec} is a folder; give a journal file path")
    elif Path(spec).is_file():
        _scan_journal(Path(spec), strict=False)  # unlocked: the final word is open_storage's


def open_storage(spec: str | BaseStorage | None, tdir: Path, heartbeat_s: int = HEARTBEAT_S,
                 grace_s: int = GRACE_S) -> BaseStorage:
    """None: the journal file in ``tdir``. 'sqlite:///...' and 'postgresql://...' are RDB
    storages (with heartbeats: a trial whose worker died is failed and retried); any other
    string is the path of a journal file."""
    if isinstance(spec, BaseStorage):
        return spec
    if spec and "://" in spec:
        check_storage(spec)
        return _rdb(spec, heartbeat_s, grace_s)
    path = Path(spec) if spec else Path(tdir) / records.JOURNAL
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = JournalLock(path)
    lock.acquire()
    try:
        repair_journal(path)
    finally:
        lock.release()
    return JournalStorage(TornTolerantJournal(path, lock))


# what a worker sees when another creates the same schema at the same moment
_SCHEMA_RACES = ("UNIQUE", "locked", "duplicate", "already exists")


def _rdb(url: str, heartbeat_s: int, grace_s: int) -> RDBStorage:
    if url.startswith("postgresql://"):  # SQLAlchemy's default driver is psycopg2
        url = "postgresql+psycopg://" + url[len("postgresql://"):]
    kwargs: dict[str, Any] = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") \
        else {"pool_pre_ping": True}
    from sqlalchemy.exc import (DatabaseError, IntegrityError, OperationalError,
                                ProgrammingError)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning,
                            message=".*(heartbeat|Heartbeat)")  # the documented way, flagged new
    for attempt in range(10):
        try:
            return RDBStorage(url, engine_kwargs=kwargs, heartbeat_interval=heartbeat_s,
                              grace_period=grace_s,
                              heartbeat_stale_trial_callback=optuna.storages.
                              RetryHeartbeatStaleTrialCallback())
        except DatabaseError as exc:  # also a file that is not a database
            # workers creating the schema at once: one wins, the others see its tables
            # (PostgreSQL reports a table created meanwhile as DuplicateTable, a ProgrammingError)
            races = (IntegrityError, OperationalError, ProgrammingError)
            if attempt == 9 or not isinstance(exc, races) or \
                    not any(race in str(exc) for race in _SCHEMA_RACES):
                raise ValueError(f"storage {url}: {str(exc).splitlines()[0]}") from None
            time.sleep(0.2 * (attempt + 1))
    raise AssertionError("unreachable")


def repair_journal(path: Path) -> None:
    """Refuse (ValueError naming the file) a file that is not an Optuna journal; cut the torn
    last line a killed writer left in one that is. Torn records inside the file are skipped as
    they are read (``TornTolerantJournal``). Call with the journal lock held."""
    if not path.is_file():
        return
    end = _scan_journal(path, strict=True)
    size = path.stat().st_size
    if end < size:
        log.warning("%s: dropped a torn last line (%d bytes) left by a killed run", path,
                    size - end)
        os.truncate(path, end)


def _scan_journal(path: Path, strict: bool) -> int:
    """The length of the complete lines of the journal ``path``, each a record or a torn one
    followed by a record; a ValueError naming the file when one is not. ``strict`` (the lock
    held, so no writer is mid-append): also refuse an unfinished tail unless complete lines
    precede it, so a file is never cut to nothing."""
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1
    for number, line in enumerate(data[:end].split(b"\n")[:-1], start=1):
        if _parse_line(line)[0] is None:
            raise ValueError(_not_journal(path, f"line {number} is not a journal record")
                             if number == 1 else _corrupt(path, number))
    tail = data[end:]
    if tail and not tail.startswith(b"{"):  # a record, torn or not, starts with '{'
        raise ValueError(_not_journal(path, "its last line is not a journal record")
                         if end == 0 else _corrupt(path, data.count(b"\n") + 1))
    if tail and strict and end == 0:
        raise ValueError(_not_journal(path, "it holds no complete journal record; delete it "
                                            "if a killed run left it so"))
    return end


def _not_journal(path: Path, why: str) -> str:
    return (f"{path} is not an Optuna journal ({why}); give a journal file (new or existing), "
            "sqlite:///FILE or postgresql://USER@HOST/DB")


def _corrupt(path: Path, number: int) -> str:
    return (f"Optuna journal {path} line {number} is corrupt; restore the file or delete it to "
            "start the studies afresh (the tuning caches keep every timing, so nothing is timed "
            "again)")


def _parse_line(line: bytes) -> tuple[dict[str, Any] | None, int]:
    """(record, bytes dropped before it) of one complete journal line; (None, ...) when it
    holds no record. A writer killed mid-append leaves a partial record without its newline,
    which the next writer's append continues on the same line: the record that ends the line
    is the whole one, found where a record begins."""
    start = 0
    while start >= 0:
        try:
            record = json.loads(line[start:])
        except ValueError:
            record = None
        if isinstance(record, dict) and isinstance(record.get("op_code"), int):
            return record, start
        start = line.find(_RECORD, start + 1)
    return None, len(line)


class TornTolerantJournal(JournalFileBackend):
    """Optuna's journal file whose reader skips the partial record of a writer killed
    mid-append, so the live workers and later resumes go on; Optuna's own reader stops at
    such a line for good ("Expecting ':' delimiter", no file named).

    Log numbers count records, each on one line; a line is read only once complete."""

    def __init__(self, path: Path, lock: JournalLock):
        super().__init__(str(path), lock_obj=lock)
        self._path = Path(path)
        self._offsets = {0: 0}  # record number -> byte offset of its line

    def read_logs(self, log_number_from: int) -> Iterator[dict[str, Any]]:
        number = log_number_from if log_number_from in self._offsets else 0
        offset = self._offsets[number]
        with open(self._path, "rb") as f:
            f.seek(offset)
            data = f.read()  # what is appended meanwhile is read by the next call
        pos = 0
        while (newline := data.find(b"\n", pos)) >= 0:
            record, dropped = _parse_line(data[pos:newline])
            if record is None:
                raise ValueError(_corrupt(self._path, number + 1))
            if dropped and number + 1 not in self._offsets:  # once per line and process
                log.warning("%s line %d: skipped the partial record (%d bytes) of a writer "
                            "killed mid-append", self._path, number + 1, dropped)
            offset += newline + 1 - pos
            pos = newline + 1
            number += 1
            self._offsets[number] = offset
            if number > log_number_from:
                yield record


def open_study(task: TuningTask, storage: str | BaseStorage,
               sampler: optuna.samplers.BaseSampler) -> optuna.Study:
    """The task's study, created on first use and resumed after."""
    return optuna.create_study(study_name=task.study_name, storage=storage, sampler=sampler,
                               direction="minimize", load_if_exists=True)


def read_runs(tdir: Path) -> list[dict[str, Any]]:
    """The log of tuning runs of one GPU (``runs.json`` next to the caches): when, how long,
    how much was tried. Export sums it into the table's provenance. A run that is logged as
    running while its process is gone from this machine was killed: it reads as such."""
    path = Path(tdir) / records.RUNS_JSON
    runs = records.read_json(path, "tuning run log") if path.is_file() else []
    return [{**r, "status": "killed"} if _killed(r) else r for r in runs]


def _killed(run: dict[str, Any]) -> bool:
    return (run.get("status") == "running" and run.get("host") == socket.gethostname()
            and isinstance(run.get("pid"), int) and not records.pid_alive(run["pid"]))


def log_run(tdir: Path, record: dict[str, Any]) -> None:
    """Write ``record`` into the run log: in place of the entry of the same run and worker (the
    one written when it started), else at the end."""
    path = Path(tdir) / records.RUNS_JSON
    key = (record.get("run_id"), record.get("worker"))
    with FileLock(f"{path}.lock"):
        runs = records.read_json(path, "tuning run log") if path.is_file() else []
        at = next((i for i, r in enumerate(runs) if (r.get("run_id"), r.get("worker")) == key),
                  None)
        if at is None:
            runs.append(record)
        else:
            runs[at] = record
        records.write_json(path, runs)


