"""A wall-clock budget for a sweep: work stops between configurations once it is spent."""
from __future__ import annotations

import time


class Budget:
    def __init__(self, seconds: float | None = None):
        self.seconds = seconds
        self.start = time.monotonic()

    def expired(self) -> bool:
        return self.seconds is not None and self.elapsed() >= self.seconds

    def elapsed(self) -> float:
        return time.monotonic() - self.start
