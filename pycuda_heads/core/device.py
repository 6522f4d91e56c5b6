"""The CUDA device, imported lazily: importing pycuda_heads needs no GPU, constructing an op does.

PyCUDA attaches to the device's primary context (``pycuda.autoprimaryctx``), the one the CUDA
runtime uses, so PyTorch or CuPy in the same process share it.
"""
from __future__ import annotations

from contextlib import contextmanager
from functools import lru_cache
from typing import Any, Iterator

from ..records import slug
from .runtime import RUNTIME


class GpuUnavailableError(RuntimeError):
    """PyCUDA or a CUDA device is missing."""


def cuda() -> Any:
    """The ``pycuda.driver`` module with the primary context current."""
    drv = RUNTIME.driver
    if drv is None:
        with RUNTIME.lock:
            drv = RUNTIME.driver = RUNTIME.driver or _attach()
    return drv


def _attach() -> Any:
    try:
        import pycuda.autoprimaryctx  # noqa: F401
        import pycuda.driver as drv
    except ImportError as exc:
        raise GpuUnavailableError(
            "pycuda-heads needs PyCUDA for GPU work: pip install '.[gpu]' in a checkout of "
            "pycuda-heads (PyCUDA builds from source: it needs the CUDA toolkit with nvcc and "
            "cuda.h, g++ and python3-dev)") from exc
    except Exception as exc:  # pycuda raises its own error types when no driver/device exists
        raise GpuUnavailableError(f"no usable CUDA device: {exc}") from exc
    return drv


@contextmanager
def thread_context() -> Iterator[None]:
    """The primary context current for PyCUDA in this thread for the block. PyCUDA keeps its
    context stack per thread, so a thread other than the one that first imported it (torch's
    autograd threads, for one) starts with none; it is popped again at the end, because PyCUDA
    aborts at exit when a context is left on any stack."""
    drv = cuda()
    if drv.Context.get_current() is not None:
        yield
        return
    import pycuda.autoprimaryctx as primary
    primary.context.push()
    try:
        yield
    finally:
        drv.Context.pop()


def bind_primary_context() -> None:
    """The primary context current in this thread for the driver's own calls (raw launches
    through cuda-bindings), once per thread. Threads PyCUDA has not seen, torch's autograd
    threads among them, start with none current. Unlike ``thread_context`` this leaves PyCUDA's
    context stack alone, so nothing is left on it at exit."""
    local = RUNTIME.local
    if getattr(local, "primary_bound", False):
        return
    cu = bindings()
    if not int(checked(cu.cuCtxGetCurrent(), "cuCtxGetCurrent")):
        with thread_context():  # pushed and popped again: read its handle meanwhile
            primary = checked(cu.cuCtxGetCurrent(), "cuCtxGetCurrent")
        checked(cu.cuCtxSetCurrent(primary), "cuCtxSetCurrent")
    local.primary_bound = True


@lru_cache(maxsize=None)
def bindings() -> Any:
    """NVIDIA's driver bindings (``cuda.bindings.driver``, the ``cuda-bindings`` package): the
    driver calls PyCUDA does not wrap (CUDA graphs, launches with attributes)."""
    try:
        from cuda.bindings import driver
    except ImportError as exc:
        raise GpuUnavailableError(
            "this needs NVIDIA's cuda-bindings: pip install cuda-bindings") from exc
    return driver


def checked(result: Any, what: str) -> Any:
    """The value of a cuda-bindings call, or RuntimeError naming the call and the error."""
    err, *value = result if isinstance(result, tuple) else (result,)
    if int(err) != 0:
        raise RuntimeError(f"{what} failed: {err!r}")
    return value[0] if len(value) == 1 else value


def driver_devices() -> int:
    """The CUDA devices the NVIDIA driver sees, asked through libcuda without PyCUDA, so that a
    machine is known to fit the GPU commands before PyCUDA is built for it."""
    import ctypes
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        raise GpuUnavailableError("no NVIDIA driver (libcuda.so.1 not found)") from exc
    count = ctypes.c_int(0)
    status = lib.cuInit(0) or lib.cuDeviceGetCount(ctypes.byref(count))
    if status or not count.value:
        name = ctypes.c_char_p()
        lib.cuGetErrorName(status, ctypes.byref(name))
        raise GpuUnavailableError(f"no CUDA device ({(name.value or b'no device').decode()})")
    return count.value


def gpu_available() -> bool:
    try:
        cuda()
    except GpuUnavailableError:
        return False
    return True


def allocator() -> Any:
    """The allocate method of this thread's device memory pool (cuMemAlloc per output would
    dominate small calls). A pool per thread: memory one thread frees may still be in use by
    kernels queued on its stream, so only that thread, whose launches follow on the same
    stream, may be handed it again."""
    try:
        return RUNTIME.local.allocate
    except AttributeError:
        cuda()
        from pycuda.tools import DeviceMemoryPool
        RUNTIME.local.allocate = DeviceMemoryPool().allocate
        return RUNTIME.local.allocate


def gpu_name() -> str:
    drv = cuda()
    return drv.Context.get_device().name()


def gpu_slug() -> str:
    return slug(gpu_name())


@lru_cache(maxsize=None)
def max_shared_bytes() -> int:
    """Largest dynamic shared memory one block may opt in to on this device."""
    drv = cuda()
    dev = drv.Context.get_device()
    return dev.get_attribute(drv.device_attribute.MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)


@lru_cache(maxsize=None)
def sm_count() -> int:
    """Streaming multiprocessors of the device (what a persistent grid is sized by)."""
    drv = cuda()
    return drv.Context.get_device().get_attribute(drv.device_attribute.MULTIPROCESSOR_COUNT)


def compute_capability() -> tuple[int, int]:
    return cuda().Context.get_device().compute_capability()
