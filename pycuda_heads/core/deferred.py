"""Checks the GPU makes on device data, read by the host without a synchronisation.

A check kernel writes its findings into host-mapped pinned memory and an event marks its end.
The findings are read once that event has completed: by the next check of the same kind
(``poll``), or at the latest by ``synchronize`` (which waits). A failure raises there, naming what
was wrong; meanwhile the op's outputs at the bad positions hold NaN, never plausible numbers.
"""
from __future__ import annotations

from collections import deque
from typing import Any, Callable

import numpy as np

from .device import cuda
from .runtime import RUNTIME


def _checks() -> tuple[deque, list]:
    """This thread's unread checks and reusable slots: a check's failure is raised to the
    thread whose call launched it."""
    local = RUNTIME.local
    try:
        return local.pending, local.free
    except AttributeError:
        local.pending, local.free = deque(), []
        return local.pending, local.free


def slots(n: int) -> tuple[Any, np.ndarray, Any]:
    """(event, host int32 buffer of at least ``n`` entries, its device pointer) for one check."""
    drv = cuda()
    free = _checks()[1]
    for i, (event, host) in enumerate(free):
        if host.size >= n:
            del free[i]
            break
    else:
        event = drv.Event(drv.event_flags.DISABLE_TIMING)
        host = drv.pagelocked_empty(max(n, 2048), np.int32,
                                    mem_flags=drv.host_alloc_flags.DEVICEMAP)
    return event, host, np.intp(host.base.get_device_pointer())


def submit(event: Any, host: np.ndarray, n: int, stream: Any,
           describe: Callable[[np.ndarray], str | None]) -> None:
    """The check kernel is enqueued on ``stream``: mark its end and keep it for reading."""
    event.record(stream)
    _checks()[0].append((event, host, n, describe))


def pending() -> bool:
    """Whether any check has not been read yet (cheap: every checked call asks)."""
    return bool(_checks()[0])


def poll(wait: bool = False) -> None:
    """Read every finished check in launch order (with ``wait``, every check); raise ValueError
    for the first that failed."""
    todo, free = _checks()
    while todo:
        event, host, n, describe = todo[0]
        if wait:
            event.synchronize()
        elif not event.query():
            return
        todo.popleft()
        error = describe(host[:n])
        free.append((event, host))
        if error:
            raise ValueError(error)


def synchronize() -> None:
    """Wait for the GPU, then raise any failed device-side check."""
    cuda().Context.synchronize()
    poll(wait=True)
