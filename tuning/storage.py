"""Where tuning data lives: the per-GPU folder, the cache files and the Optuna storage
(an embedded journal file by default, which needs no server; or any Optuna storage URL)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import optuna
from optuna.storages import BaseStorage, JournalStorage
from optuna.storages.journal import JournalFileBackend

from pycuda_heads import records

from .spaces import TuningTask


def tuning_dir(out: Path, slug: str) -> Path:
    """``<out>/<slug>/tuning``: caches, journal, efficiency data and the run log of one GPU."""
    return Path(out) / slug / records.TUNING_DIR


def cache_path(tdir: Path, task: TuningTask) -> Path:
    return tdir / f"{task.name}.json"


def cache_files(tdir: Path) -> list[Path]:
    """Every task cache in a tuning folder (their names hold two '__' separators)."""
    return sorted(p for p in Path(tdir).glob(records.CACHE_GLOB))


def open_storage(spec: str | BaseStorage | None, tdir: Path) -> str | BaseStorage:
    """None: the journal file in ``tdir``. A string with '://' is an Optuna storage URL
    (postgresql://..., mysql://..., sqlite:///...) shared by several machines; any other
    string is the path of a journal file."""
    if isinstance(spec, BaseStorage):
        return spec
    if spec and "://" in spec:
        return spec
    path = Path(spec) if spec else Path(tdir) / records.JOURNAL
    path.parent.mkdir(parents=True, exist_ok=True)
    return JournalStorage(JournalFileBackend(str(path)))


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
    records.write_json(Path(tdir) / records.RUNS_JSON, read_runs(tdir) + [record])
