"""The library's process state, in one object, and the launch scope of each thread.

``RUNTIME`` holds what every op shares: the CUDA driver module, compiled modules and prepared
kernels by variant, whether programmatic dependent launch is available, the shared reducer,
and per thread (``local``) the memory pool and the device checks not read yet. Its caches are filled on
slow paths under one lock, so threads launching ops at once compile a variant once.

``scope()`` is what the calling thread's launches and allocations are inside of (a CUDA graph
capture, a launch recording, poisoned outputs, a memory source). It is a ``contextvars`` value:
one thread's capture or test fixture never reaches another thread's launches.
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Iterator, NamedTuple


class Scope(NamedTuple):
    """Launch and allocation state of one thread (or task)."""

    #: launches are being captured into a CUDA graph: nothing may synchronise
    capturing: bool = False
    #: every launch is appended here as (kernel, grid, block, args, shared, stream)
    recording: list | None = None
    #: with a recording: launches are recorded, not made (a launch program being worked out)
    dry: bool = False
    #: outputs and scratch start as NaN, so a test can prove each element was written
    poison: bool = False
    #: where ``empty`` takes memory from instead of the pool: ``allocate(nbytes) -> (device
    #: pointer or allocation, owner to keep alive)`` (an ``Arena``, another framework's allocator)
    source: Any = None


#: the scope of a thread that is inside none of them
QUIET = Scope()
_SCOPE: ContextVar[Scope] = ContextVar("pycuda_heads_scope", default=QUIET)


#: this thread's ``Scope`` (the variable's own getter: it is on every launch's path)
scope = _SCOPE.get


@contextmanager
def scoped(**changes: Any) -> Iterator[Scope]:
    """This thread's scope with ``changes`` for the block; the outer one again after it."""
    token = _SCOPE.set(_SCOPE.get()._replace(**changes))
    try:
        yield _SCOPE.get()
    finally:
        _SCOPE.reset(token)


class Runtime:
    """Process-wide state shared by every op and thread."""

    def __init__(self) -> None:
        #: held while a cache below is filled (a compile, a pool, the driver import)
        self.lock = threading.RLock()
        self.driver: Any = None
        #: per thread: ``allocate`` (its device memory pool's), ``pending`` and ``free``
        #: (its device checks not read yet, and the slots of those read, ``deferred``)
        self.local = threading.local()
        #: loaded modules by variant hash, prepared kernels by (family, folder, entry, constants)
        self.modules: dict[str, Any] = {}
        self.kernels: dict[tuple, Any] = {}
        #: programmatic dependent launch possible here (None: not asked yet)
        self.pdl: bool | None = None
        self.reducer: Any = None

    def cached(self, table: dict, key: Any, make: Any) -> Any:
        """``table[key]``, made by ``make()`` once even when threads ask at the same time."""
        hit = table.get(key)
        if hit is None:
            with self.lock:
                hit = table.get(key)
                if hit is None:
                    hit = table[key] = make()
        return hit


RUNTIME = Runtime()
