"""CPU: the journal's ``fcntl`` lock with Optuna's ``JournalFileBackend``. The lock has no Optuna
base class (the only one, ``BaseJournalFileLock``, is in the private ``journal._file`` module):
the backend calls ``acquire()`` and ``release()`` on it and nothing else, which these tests hold
Optuna to."""
import json
import multiprocessing
import re
from pathlib import Path

import pytest

optuna = pytest.importorskip(
    "optuna", reason="the tuner needs the tune extra: pip install -e '.[test]'")
from optuna.storages.journal import JournalFileBackend  # noqa: E402

from pycuda_heads.tuning.locks import JournalLock, Locked  # noqa: E402
from pycuda_heads.tuning.storage import open_storage  # noqa: E402

CHECKOUT = Path(__file__).resolve().parents[1]
PRIVATE_OPTUNA = re.compile(r"\boptuna(\.\w+)*\._\w+")
WRITERS, TRIALS = 4, 15


def test_the_backend_writes_through_the_lock(tmp_path: Path) -> None:
    journal = tmp_path / "optuna.journal"
    backend = JournalFileBackend(str(journal), lock_obj=JournalLock(journal, wait_s=0.2))
    held = JournalLock(journal)
    held.acquire()
    try:  # another holder blocks the backend's write: it took our lock, not a default of its own
        with pytest.raises(Locked, match="locked by pid"):
            backend.append_logs([{"op_code": 0}])
    finally:
        held.release()
    backend.append_logs([{"op_code": 1}])
    assert list(backend.read_logs(0)) == [{"op_code": 1}]


def _write_trials(journal: str) -> None:
    """Runs trials into the shared study; a directory made inside the lock proves no other
    process is inside it at the same time (mkdir fails if it exists)."""
    from pycuda_heads.tuning import locks
    inside = Path(f"{journal}.inside")
    acquire, release = locks.JournalLock.acquire, locks.JournalLock.release

    def guarded_acquire(self: locks.JournalLock) -> bool:
        acquire(self)
        inside.mkdir()
        return True

    def guarded_release(self: locks.JournalLock) -> None:
        inside.rmdir()
        release(self)

    locks.JournalLock.acquire, locks.JournalLock.release = guarded_acquire, guarded_release
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(study_name="s", storage=open_storage(journal, Path(journal).parent))
    study.optimize(lambda trial: trial.suggest_float("x", 0.0, 1.0), n_trials=TRIALS)


@pytest.mark.installed  # the writers are new processes
def test_processes_contending_for_the_journal_keep_every_trial(tmp_path: Path) -> None:
    journal = tmp_path / "optuna.journal"
    optuna.create_study(study_name="s", storage=open_storage(str(journal), tmp_path))
    ctx = multiprocessing.get_context("spawn")
    writers = [ctx.Process(target=_write_trials, args=(str(journal),)) for _ in range(WRITERS)]
    for w in writers:
        w.start()
    for w in writers:
        w.join(timeout=240)
        assert w.exitcode == 0
    for line in journal.read_bytes().splitlines():  # no write torn or interleaved
        json.loads(line)
    study = optuna.load_study(study_name="s", storage=open_storage(str(journal), tmp_path))
    states = [t.state for t in study.trials]
    assert states == [optuna.trial.TrialState.COMPLETE] * WRITERS * TRIALS


def test_no_module_imports_a_private_optuna_module() -> None:
    found = [f"{path.relative_to(CHECKOUT)}:{number}: {line.strip()}"
             for folder in ("tuning", "pycuda_heads")
             for path in sorted((CHECKOUT / folder).rglob("*.py"))
             for number, line in enumerate(path.read_text().splitlines(), start=1)
             if PRIVATE_OPTUNA.search(line)]
    assert not found
