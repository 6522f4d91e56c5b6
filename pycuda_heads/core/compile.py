"""Compiled variants: rendered source -> SourceModule (cached in process) -> prepared kernel.

PyCUDA's own disk cache (keyed by source, options and nvcc version) keeps a repeat process from
recompiling; the in-process cache here keeps one loaded module per variant.
"""
from __future__ import annotations

import ctypes
import logging
import keyword
import os
import struct
import threading
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from .device import GpuUnavailableError, bindings, checked, compute_capability, cuda
from .runtime import QUIET, RUNTIME, scope, scoped
from .source import render, signature, variant_hash

log = logging.getLogger("pycuda_heads")

NVCC_OPTIONS: tuple[str, ...] = ("-O3",)
#: the knob whose variants use Hopper's warpgroup MMA, which builds for sm_90a alone
WGMMA_KNOB, WGMMA_ARCH = "WGMMA", "sm_90a"
STATIC_SHARED_LIMIT = 48 * 1024


def cache_dir(kind: str) -> Path:
    """The on-disk cache folder for ``kind`` (static checks, PTX digests, the C++ launcher),
    under $PYCUDA_HEADS_CACHE or ~/.cache/pycuda-heads."""
    root = os.environ.get("PYCUDA_HEADS_CACHE") or Path.home() / ".cache" / "pycuda-heads"
    path = Path(root) / kind
    path.mkdir(parents=True, exist_ok=True)
    return path


class LaunchError(RuntimeError):
    """A kernel launch failed; the message names the kernel and its launch configuration."""


def variant_arch(constants: Mapping[str, Any]) -> str | None:
    """The architecture a variant must be built for: ``WGMMA_ARCH`` where its ``WGMMA_KNOB`` is
    set, else None (the device's own, as PyCUDA picks it)."""
    return WGMMA_ARCH if constants.get(WGMMA_KNOB) else None


def _module(source: str, arch: str | None) -> Any:
    def compile_it() -> Any:
        cuda()
        from pycuda.compiler import SourceModule
        log.debug("compiling %s", source.splitlines()[0])
        return SourceModule(source, no_extern_c=True, options=list(NVCC_OPTIONS), arch=arch)
    return RUNTIME.cached(RUNTIME.modules, variant_hash(source, (*NVCC_OPTIONS, arch or "")),
                          compile_it)


def load_module(family: str, constants: Mapping[str, Any],
                source_dir: Path | None = None) -> Any:
    return _module(render(family, constants, source_dir), variant_arch(constants))


def get_kernel(family: str, entry: str, constants: Mapping[str, Any],
               source_dir: Path | None = None, pdl: bool = False) -> "Kernel":
    """The prepared kernel of one variant, shared by every op object that launches it; with
    ``pdl`` (the entry waits for the stream's previous kernel before it touches memory) a
    ``DriverKernel`` that launches with programmatic dependent launch, where the device and
    cuda-bindings allow it."""
    pdl = pdl and pdl_supported()
    key = (family, str(source_dir), entry, tuple(sorted(constants.items())), pdl)

    def make() -> Kernel:
        source = render(family, constants, source_dir)
        return _prepared(DriverKernel if pdl else Kernel, entry, constants, source, pdl)
    return RUNTIME.cached(RUNTIME.kernels, key, make)


def _prepared(base: type, entry: str, constants: Mapping[str, Any], source: str,
              pdl: bool) -> "Kernel":
    params = signature(source, entry)
    cls = _named_launch(base, tuple(n for n, _ in params))
    return cls(entry, constants, source, "".join(t for _, t in params), pdl)


def on_any_stream(kernel: "Kernel") -> "DriverKernel":
    """``kernel`` as a ``DriverKernel``, which launches on a raw stream handle (another
    framework's stream, a graph capture of it): the kernel itself when it is one already."""
    if isinstance(kernel, DriverKernel):
        return kernel
    key = ("driver", variant_hash(kernel.source, NVCC_OPTIONS), kernel.name)
    return RUNTIME.cached(RUNTIME.kernels, key, lambda: _prepared(
        DriverKernel, kernel.name, kernel.constants, kernel.source, False))


# A kernel's call, generated per C signature: the interpreter binds the named arguments (a
# ``**kwargs`` dict would cost about 1 us a launch), and the common case (no recording, capture
# or synchronisation in this thread) is one identity test before the launch itself.
_CALL = """\
def __call__(self, grid, block, /, *, {args}shared=0, stream=None):
    values = ({args})
    if self._sync or scope() is not QUIET:
        self._scoped(grid, block, values, shared, stream)
        return
    try:
        if shared > self._shared_optin:
            self._opt_in(shared)
            self._shared_optin = shared
        self._launch(grid, block, self._pack(self._format, *values), shared, stream)
    except Exception as exc:
        self._failed(exc, grid, block, values, shared)
"""


@lru_cache(maxsize=None)
def _named_launch(base: type, params: tuple[str, ...]) -> type:
    """``base`` whose call ``kernel(grid, block, name=value, ..., shared=, stream=)`` takes the
    C parameters ``params`` by name and launches them in the signature's order."""
    bad = [p for p in params if keyword.iskeyword(p) or p in ("self", "grid", "block", "shared",
                                                               "stream", "values", "exc")]
    if bad:
        raise ValueError(f"kernel parameters {bad} clash with Python or the launch's own names")
    code = _CALL.format(args="".join(f"{p}, " for p in params))
    namespace: dict[str, Any] = {"scope": scope, "QUIET": QUIET}
    exec(code, namespace)  # noqa: S102 - C identifiers read by ``signature``
    return type(base.__name__, (base,), {"__call__": namespace["__call__"], "params": params,
                                         "__doc__": base.__doc__})


def pdl_supported() -> bool:
    """Programmatic dependent launch: compute capability 9.0 or newer and cuda-bindings."""
    if RUNTIME.pdl is None:
        try:
            bindings()
            RUNTIME.pdl = compute_capability() >= (9, 0)
        except GpuUnavailableError:
            RUNTIME.pdl = False
    return RUNTIME.pdl


def _private_pack() -> Any:
    """PyCUDA's own argument packer of ``prepared_call`` (``pycuda._pvt_struct.pack``), or None
    where this PyCUDA lacks it. With ``Function._launch_kernel`` it launches for a fraction of
    the host time of the public ``prepared_call`` (keyword parsing) and of cuda-bindings'
    ``cuLaunchKernel`` (``reports/nvidia-h200/probes/pool_pdl_host.json``); setup.cfg pins
    PyCUDA to versions that have both, and without them launches take the public path."""
    try:
        from pycuda._pvt_struct import pack
    except ImportError:
        return None
    return pack if callable(pack) else None


class Kernel:
    """One prepared kernel entry of one variant. Its parameters, in order and with their
    types, are read from its C signature; a launch names each argument, so the order is
    written in the ``.cu`` file alone. Launches are checked. Made by ``get_kernel``."""

    #: the C parameter names, in launch order
    params: tuple[str, ...] = ()

    def __init__(self, entry: str, constants: Mapping[str, Any], source: str, types: str,
                 pdl: bool = False):
        self.name = entry
        self.constants = dict(constants)
        #: the rendered source, and the prepared-call type letter of each parameter ("P": a
        #: device pointer)
        self.source, self.types = source, types
        self.pdl = pdl
        self._bind(source, types)
        self._shared_optin = STATIC_SHARED_LIMIT
        self._sync = os.environ.get("PYCUDA_HEADS_SYNC", "") not in ("", "0")

    def _bind(self, source: str, types: str) -> None:
        """``_launch(grid, block, _pack(_format, *args), shared, stream)`` enqueues a launch."""
        self.function = _module(source, variant_arch(self.constants)).get_function(self.name)
        self.function.prepare(types)
        pack = _private_pack()
        launch = getattr(self.function, "_launch_kernel", None)
        if pack is not None and callable(launch):
            self._pack, self._format, self._launch = pack, self.function.arg_format, launch
        else:
            self._pack, self._format, self._launch = _as_tuple, None, self._public_launch

    def _public_launch(self, grid: tuple, block: tuple, args: tuple, shared: int,
                       stream: Any) -> None:
        self.bare(grid, block, args, shared, stream)

    def opt_in(self, shared: int) -> None:
        """Allow ``shared`` bytes of dynamic shared memory (past the static 48 KB) from now on."""
        if shared > self._shared_optin:
            self._opt_in(shared)
            self._shared_optin = shared

    def _opt_in(self, shared: int) -> None:
        self.function.set_attribute(cuda().function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                    int(shared))

    def _failed(self, exc: Exception, grid: tuple, block: tuple, values: tuple,
                shared: int) -> None:
        if isinstance(exc, LaunchError):
            raise exc
        if isinstance(exc, cuda().Error):
            raise LaunchError(f"launch of {self.name} failed: grid={grid} block={block} "
                              f"shared={shared} B constants={self.constants}: {exc}") from exc
        # a wrong argument type: name the kernel and its arguments, not pack()
        raise LaunchError(f"launch of {self.name} could not be made: grid={grid} block={block} "
                          f"shared={shared} B args={dict(zip(self.params, values))}: "
                          f"{exc}") from exc

    def _scoped(self, grid: tuple, block: tuple, values: tuple, shared: int,
                stream: Any) -> None:
        """A launch inside a recording (``dry``: recorded, not made), a capture, or with
        synchronisation asked for."""
        now = scope()
        if now.recording is not None:
            now.recording.append((self, grid, block, values, shared, stream))
            if now.dry:
                return
        try:
            self.opt_in(shared)
            self._launch(grid, block, self._pack(self._format, *values), shared, stream)
        except Exception as exc:
            self._failed(exc, grid, block, values, shared)
        if self._sync and not now.capturing:
            try:
                cuda().Context.synchronize()
            except cuda().Error as exc:
                raise LaunchError(f"launch of {self.name} failed: grid={grid} block={block} "
                                  f"shared={shared} B constants={self.constants}: {exc}") from exc

    def bare(self, grid: tuple[int, int, int], block: tuple[int, int, int], args: Sequence[Any],
             shared: int, stream: Any) -> None:
        """The same launch through PyCUDA's plain prepared call: the yardstick of host cost."""
        if stream is None:
            self.function.prepared_call(grid, block, *args, shared_size=shared)
        else:
            self.function.prepared_async_call(grid, block, stream, *args, shared_size=shared)


def _as_tuple(fmt: Any, *args: Any) -> tuple:
    return args


# One 8-byte slot a kernel argument, by prepared-call type letter (struct format, padded).
_SLOTS = {"P": "Q", "i": "i4x", "f": "f4x", "q": "q", "I": "I4x", "d": "d"}


class _ArgumentSlots(threading.local):
    """A thread's slots for one kernel's arguments and the ``void**`` array over them. The
    driver copies the arguments during the launch call, which releases the GIL, so threads
    must not share them; one thread reuses its own for every launch."""

    def __init__(self, n: int):
        self.data = ctypes.create_string_buffer(8 * n)
        base = ctypes.addressof(self.data)
        self._array = (ctypes.c_void_p * n)(*(base + 8 * i for i in range(n)))
        self.address = ctypes.addressof(self._array)


class DriverKernel(Kernel):
    """A kernel entry loaded and launched through cuda-bindings (``cuLaunchKernelEx``), which
    takes any stream handle: another framework's stream, or one it is capturing into a graph.
    The compiled module is PyCUDA's cached cubin; the arguments are packed by one ``struct``
    call into slots the launch reads through a ``void**``.

    With ``pdl`` the entry waits for the stream's previous kernel before it touches memory
    (``griddepcontrol.wait``), and it launches with programmatic stream serialization:
    consecutive launches overlap their launch latency, while every kernel still sees all of its
    predecessor's writes. PyCUDA's launches cannot carry that attribute."""

    def _bind(self, source: str, types: str) -> None:
        from pycuda.compiler import compile as nvcc_compile
        cu = self._cu = bindings()
        image = nvcc_compile(source, no_extern_c=True, options=list(NVCC_OPTIONS),
                             arch=variant_arch(self.constants))
        self._module = checked(cu.cuModuleLoadData(image), "cuModuleLoadData")
        self._function = checked(cu.cuModuleGetFunction(self._module, self.name.encode()),
                                 f"cuModuleGetFunction({self.name})")
        self._format = struct.Struct("=" + "".join(_SLOTS[t] for t in types))
        self._pointers = tuple(t == "P" for t in types)
        self._slots = _ArgumentSlots(len(types))
        self._pack, self._launch = self._packed, self._launch_on
        self._configs: dict[tuple, Any] = {}

    def _packed(self, fmt: struct.Struct, *args: Any) -> int:
        """``args`` in this thread's slots (device pointers as ints); the ``void**`` address."""
        slots = self._slots
        fmt.pack_into(slots.data, 0, *(int(a) if p else a for p, a in zip(self._pointers, args)))
        return slots.address

    @property
    def handle(self) -> int:
        """The loaded entry's ``CUfunction`` handle, for a launcher outside Python."""
        return int(self._function)

    def slots(self, values: Sequence[Any]) -> bytes:
        """``values`` (a launch program's, pointers as ints) packed 8 bytes an argument, the
        layout the driver reads the arguments from."""
        return self._format.pack(*values)

    def launch_values(self, grid: tuple, block: tuple, values: Sequence[Any], shared: int,
                      handle: int) -> None:
        """Launch with ``values``, every C argument in the signature's order with device
        pointers as ints already (a launch program's), on the stream ``handle``."""
        slots = self._slots
        self._format.pack_into(slots.data, 0, *values)
        self.launch_raw(grid, block, slots.address, shared, handle)

    def _opt_in(self, shared: int) -> None:
        cu = self._cu
        checked(cu.cuFuncSetAttribute(
            self._function,
            cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, int(shared)),
            f"cuFuncSetAttribute({self.name})")

    def _config(self, key: tuple) -> Any:
        """The launch configuration of (grid, block, shared, stream handle), built once."""
        grid, block, shared, stream = key
        cu = self._cu
        config = cu.CUlaunchConfig()
        config.gridDimX, config.gridDimY, config.gridDimZ = grid
        config.blockDimX, config.blockDimY, config.blockDimZ = block
        config.sharedMemBytes = shared
        config.hStream = cu.CUstream(stream)
        if self.pdl:
            attribute = cu.CUlaunchAttribute()
            attribute.id = \
                cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
            attribute.value.programmaticStreamSerializationAllowed = 1
            config.attrs, config.numAttrs = [attribute], 1
        if len(self._configs) >= 256:  # many streams or shapes: start afresh
            self._configs.clear()
        self._configs[key] = config
        return config

    def _launch_on(self, grid: tuple, block: tuple, params: int, shared: int,
                   stream: Any) -> None:
        self.launch_raw(grid, block, params, shared, 0 if stream is None else stream.handle)

    def launch_raw(self, grid: tuple, block: tuple, params: int, shared: int,
                   handle: int) -> None:
        """Launch with packed ``params`` (a ``void**`` address) on the stream ``handle``."""
        key = (grid, block, shared, handle)
        config = self._configs.get(key) or self._config(key)
        err, = self._cu.cuLaunchKernelEx(config, self._function, params, 0)
        if err:
            raise LaunchError(f"launch of {self.name} failed: grid={grid} block={block} "
                              f"shared={shared} B constants={self.constants}: {err!r}")

    def bare(self, grid: tuple[int, int, int], block: tuple[int, int, int], args: Sequence[Any],
             shared: int, stream: Any) -> None:
        """The same launch with nothing around it: configuration built, arguments converted."""
        self._launch_on(grid, block, self._packed(self._format, *args), shared, stream)


@contextmanager
def capturing() -> Iterator[None]:
    """Launches of this thread inside are being captured into a CUDA graph: no
    synchronisation may happen."""
    with scoped(capturing=True):
        yield


@contextmanager
def recorded_launches() -> Iterator[list[tuple]]:
    """Collect every launch this thread makes inside the block as (kernel, grid, block, args,
    shared, stream), so the same launches can be replayed bare."""
    with scoped(recording=[]) as now:
        yield now.recording
