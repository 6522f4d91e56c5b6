"""File locks shared by the processes that tune into one reports folder.

``fcntl`` locks belong to the process: the kernel drops them when it dies, even by SIGKILL, so
a killed run never leaves a lock that stalls the next one. The holder writes its pid into the
lock file, so a process that waits too long can say who holds it.
"""
from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path
from types import TracebackType

#: how long a process waits for a lock before it gives up with "locked by pid N"
WAIT_S = 120.0


class Locked(RuntimeError):
    """A lock stayed held by another live process for longer than the wait."""


def holder(path: Path) -> str:
    try:
        return Path(path).read_text().strip() or "?"
    except OSError:
        return "?"


class FileLock:
    """Exclusive lock on ``path`` (created if missing), reentrant within one object."""

    def __init__(self, path: Path | str, wait_s: float = WAIT_S):
        self.path = Path(path)
        self.wait_s = wait_s
        self._fd: int | None = None
        self._depth = 0

    def acquire(self) -> None:
        if self._depth:
            self._depth += 1
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)
        deadline = time.monotonic() + self.wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    os.close(fd)
                    raise Locked(f"{self.path} is locked by pid {holder(self.path)}; wait for "
                                 "that process to finish or stop it") from None
                time.sleep(0.01)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd, self._depth = fd, 1

    def release(self) -> None:
        self._depth -= 1
        if self._depth or self._fd is None:
            return
        fd, self._fd = self._fd, None
        os.ftruncate(fd, 0)
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)

    def __enter__(self) -> "FileLock":
        self.acquire()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.release()


class JournalLock:
    """Optuna's journal lock on ``fcntl``: a writer killed while holding it releases it, where
    Optuna's own file locks make the next run wait out a 30 s grace period.

    Passed as ``JournalFileBackend(path, lock_obj=...)``, which only calls ``acquire()`` and
    ``release()`` on it and checks no type, so it needs no base class (Optuna 5.0 defines its
    ``BaseJournalFileLock`` only in a private module); tests/test_tuning_locks.py holds Optuna
    to that."""

    def __init__(self, journal: Path | str, wait_s: float = WAIT_S):
        self._lock = FileLock(f"{journal}.fcntl-lock", wait_s)

    def acquire(self) -> bool:
        self._lock.acquire()
        return True

    def release(self) -> None:
        self._lock.release()
