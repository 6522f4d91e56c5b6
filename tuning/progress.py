"""Progress bars: trials (or configurations timed), best time so far, current candidate."""
from __future__ import annotations

import time
from typing import Any, Mapping

from tqdm.auto import tqdm


class Progress:
    """A bar per phase of a task; ``enabled=False`` draws nothing (tests, logs)."""

    def __init__(self, enabled: bool = True):
        self.enabled = enabled

    def bar(self, total: int | None, desc: str, unit: str = "trial") -> "Bar":
        return Bar(tqdm(total=total, desc=desc, unit=unit, disable=not self.enabled,
                        dynamic_ncols=True, leave=True))


class Bar:
    def __init__(self, bar: Any):
        self._bar = bar
        self._best: float | None = None

    def candidate(self, params: Mapping[str, Any]) -> None:
        self._show(params)

    def done(self, best_us: float | None) -> None:
        self._best = best_us
        self._bar.update(1)
        self._show(None)

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
