"""Compiled variants: rendered source -> SourceModule (cached in process) -> prepared kernel.

PyCUDA's own disk cache (keyed by source, options and nvcc version) keeps a repeat process from
recompiling; the in-process cache here keeps one loaded module per variant.
"""
from __future__ import annotations

import logging
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from .device import cuda
from .source import arg_types, render, variant_hash

log = logging.getLogger("pycuda_heads")

NVCC_OPTIONS: tuple[str, ...] = ("-O3",)
STATIC_SHARED_LIMIT = 48 * 1024
_MODULES: dict[str, Any] = {}


class LaunchError(RuntimeError):
    """A kernel launch failed; the message names the kernel and its launch configuration."""


def _module(source: str) -> Any:
    key = variant_hash(source, NVCC_OPTIONS)
    module = _MODULES.get(key)
    if module is None:
        cuda()
        from pycuda.compiler import SourceModule
        log.debug("compiling %s", source.splitlines()[0])
        module = _MODULES[key] = SourceModule(source, no_extern_c=True,
                                              options=list(NVCC_OPTIONS))
    return module


def load_module(family: str, constants: Mapping[str, Any],
                source_dir: Path | None = None) -> Any:
    return _module(render(family, constants, source_dir))


_KERNELS: dict[tuple, "Kernel"] = {}


def get_kernel(family: str, entry: str, constants: Mapping[str, Any],
               source_dir: Path | None = None) -> "Kernel":
    """The prepared kernel of one variant, shared by every op object that launches it."""
    key = (family, str(source_dir), entry, tuple(sorted(constants.items())))
    k = _KERNELS.get(key)
    if k is None:
        k = _KERNELS[key] = Kernel(family, entry, constants, source_dir)
    return k


class Kernel:
    """One prepared kernel entry of one variant (argument types read from its C signature);
    launches are checked."""

    def __init__(self, family: str, entry: str, constants: Mapping[str, Any],
                 source_dir: Path | None = None):
        from pycuda._pvt_struct import pack
        self.name = entry
        self.constants = dict(constants)
        source = render(family, constants, source_dir)
        self.function = _module(source).get_function(entry)
        self.function.prepare(arg_types(source, entry))
        self._pack, self._format = pack, self.function.arg_format
        self._launch = self.function._launch_kernel
        self._shared_optin = STATIC_SHARED_LIMIT
        self._sync = os.environ.get("PYCUDA_HEADS_SYNC", "") not in ("", "0")

    def __call__(self, grid: tuple[int, int, int], block: tuple[int, int, int], *args: Any,
                 shared: int = 0, stream: Any = None) -> None:
        """Launch on ``stream`` (a pycuda Stream; None: the legacy default stream). The
        arguments are packed by the prepared format and handed to the driver directly: this
        is the whole host cost of a launch beyond the driver's own."""
        try:
            if shared > self._shared_optin:
                self.function.set_attribute(
                    cuda().function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, int(shared))
                self._shared_optin = shared
            self._launch(grid, block, self._pack(self._format, *args), shared, stream)
            if _RECORDING:
                _RECORDING[-1].append((self, grid, block, args, shared, stream))
            if self._sync and not _CAPTURING:
                cuda().Context.synchronize()
        except cuda().Error as exc:
            raise LaunchError(f"launch of {self.name} failed: grid={grid} block={block} "
                              f"shared={shared} B constants={self.constants}: {exc}") from exc
        except Exception as exc:  # a wrong argument type: name the kernel, not pack()
            raise LaunchError(f"launch of {self.name} could not be made: grid={grid} "
                              f"block={block} shared={shared} B args={args}: {exc}") from exc

    def bare(self, grid: tuple[int, int, int], block: tuple[int, int, int], args: Sequence[Any],
             shared: int, stream: Any) -> None:
        """The same launch through PyCUDA's plain prepared call: the yardstick of host cost."""
        if stream is None:
            self.function.prepared_call(grid, block, *args, shared_size=shared)
        else:
            self.function.prepared_async_call(grid, block, stream, *args, shared_size=shared)


_RECORDING: list[list[tuple]] = []
_CAPTURING: list[bool] = []


@contextmanager
def capturing() -> Iterator[None]:
    """Launches inside are being captured into a CUDA graph: no synchronisation may happen."""
    _CAPTURING.append(True)
    try:
        yield
    finally:
        _CAPTURING.pop()


@contextmanager
def recorded_launches() -> Iterator[list[tuple]]:
    """Collect every launch made inside the block as (kernel, grid, block, args, shared,
    stream), so the same launches can be replayed bare."""
    _RECORDING.append([])
    try:
        yield _RECORDING[-1]
    finally:
        _RECORDING.pop()
