"""Progress of long work (check, validate, bench, sweep, report): a bar on a terminal, a log line
per step anywhere else (a CI log, a file), where a bar's carriage returns would be noise."""
from __future__ import annotations

import importlib.util
import logging
import sys
from typing import Any

log = logging.getLogger("pycuda_heads.progress")


def on_terminal() -> bool:
    """Whether a bar can be drawn: stderr is a terminal and tqdm is installed."""
    return sys.stderr.isatty() and importlib.util.find_spec("tqdm") is not None


class Steps:
    """``total`` steps of ``what``; call ``step(label)`` as each one ends."""

    def __init__(self, total: int, what: str, unit: str = "step", enabled: bool = True) -> None:
        self.total, self.what, self.unit, self.enabled = total, what, unit, enabled
        self.done = 0
        self._bar: Any = None
        if enabled and on_terminal():
            from tqdm import tqdm
            self._bar = tqdm(total=total, desc=what, unit=unit, mininterval=1.0,
                             dynamic_ncols=True)

    def step(self, label: str = "") -> None:
        self.done += 1
        if self._bar is not None:
            self._bar.set_postfix_str(label, refresh=False)
            self._bar.update()
        elif self.enabled:
            log.info("%s: %d/%d %s%s", self.what, self.done, self.total, self.unit,
                     f" ({label})" if label else "")

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()

    def __enter__(self) -> "Steps":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
