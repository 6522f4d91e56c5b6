"""Progress of a task's trials (or configurations timed), best time so far, current candidate:
a bar on a terminal, a log line per trial elsewhere."""
from __future__ import annotations

import logging
import time
from typing import Any, Mapping

from tqdm.auto import tqdm

from ..progress import on_terminal

log = logging.getLogger("pycuda_heads.tuning")


class Progress:
    """A bar per phase of a task; ``enabled=False`` shows nothing (tests)."""

    def __init__(self, enabled: bool = True):
        self.enabled = enabled

    def bar(self, total: int | None, desc: str, unit: str = "trial") -> "Bar":
        drawn = self.enabled and on_terminal()
        line = f"{desc}: {{}}/{'?' if total is None else total} {unit}"
        return Bar(tqdm(total=total, desc=desc, unit=unit, disable=not drawn,
                        dynamic_ncols=True, leave=True), line if self.enabled and not drawn
                   else None)


class Bar:
    def __init__(self, bar: Any, line: str | None = None):
        self._bar = bar
        self._line = line  # the log line of a step, where no bar is drawn
        self._done = 0
        self._best: float | None = None

    def candidate(self, params: Mapping[str, Any]) -> None:
        self._show(params)

    def done(self, best_us: float | None) -> None:
        self._best = best_us
        self._bar.update(1)
        self._show(None)
        self._done += 1
        if self._line is not None:
            log.info("%s, best %s", self._line.format(self._done),
                     "-" if best_us is None else f"{best_us:.2f} us")

    def _show(self, params: Mapping[str, Any] | None) -> None:
        best = "-" if self._best is None else f"{self._best:.2f}us"
        current = "" if params is None else " " + ",".join(f"{k}={v}" for k, v in params.items())
        self._bar.set_postfix_str(f"best {best}{current}", refresh=False)

    def close(self) -> None:
        self._bar.close()

    def __enter__(self) -> "Bar":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Budget:
    def __init__(self, seconds: float | None = None):
        self.seconds = seconds
        self.start = time.monotonic()

    def expired(self) -> bool:
        return self.seconds is not None and self.elapsed() >= self.seconds

    def elapsed(self) -> float:
        return time.monotonic() - self.start
