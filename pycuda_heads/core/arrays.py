"""Input adaptation: NumPy arrays are copied to the device, PyCUDA GPUArrays are used in place,
anything with ``__cuda_array_interface__`` (CuPy, PyTorch CUDA tensors) is wrapped zero-copy.
Every check runs before anything is launched and names the argument, expected and actual value."""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator, MutableMapping, Sequence

import numpy as np

from .device import allocator, cuda

# Kernels index elements with 32-bit ints.
MAX_ELEMENTS = 2**31 - 1


def _gpuarray() -> Any:
    cuda()
    import pycuda.gpuarray as gpuarray
    return gpuarray


def _c_strides(shape: Sequence[int], itemsize: int) -> tuple[int, ...]:
    strides, step = [], itemsize
    for n in reversed(shape):
        strides.append(step)
        step *= n
    return tuple(reversed(strides))


def check_shape(name: str, shape: Sequence[int], axes: Sequence[str],
                dims: MutableMapping[str, int]) -> None:
    """Bind named axes (B, K, ...) on first sight; later arguments must agree with them."""
    shape = tuple(int(n) for n in shape)
    spelled = "(" + ", ".join(axes) + ")"
    if len(shape) != len(axes):
        raise ValueError(f"{name}: expected a {len(axes)}-d array {spelled}, got shape {shape}")
    for axis, (label, n) in enumerate(zip(axes, shape)):
        if n < 1:
            raise ValueError(f"{name}: axis {axis} ({label}) must be >= 1, got shape {shape}")
        if label in dims and dims[label] != n:
            want = tuple(dims.get(a, "?") for a in axes)
            raise ValueError(f"{name}: expected shape {spelled} = {want}, got {shape} "
                             f"({label} is {dims[label]}, axis {axis} has {n})")
        dims[label] = n
    if int(np.prod(shape, dtype=np.int64)) > MAX_ELEMENTS:
        raise ValueError(f"{name}: shape {shape} has more than {MAX_ELEMENTS} elements, the "
                         "most the kernels index; split the batch")


def as_device(x: Any, name: str, axes: Sequence[str], dims: MutableMapping[str, int],
              dtype: type = np.float32) -> Any:
    """``x`` as a C-contiguous GPUArray of ``dtype`` whose shape matches ``axes``."""
    dtype = np.dtype(dtype)
    gpuarray = _gpuarray()
    if isinstance(x, gpuarray.GPUArray):
        _check_meta(name, x.dtype, x.shape, x.flags.c_contiguous, dtype, axes, dims)
        arr = x
    elif hasattr(x, "__cuda_array_interface__"):
        cai = x.__cuda_array_interface__
        shape = tuple(cai["shape"])
        got = np.dtype(cai["typestr"])
        strides = cai.get("strides")
        contiguous = strides is None or tuple(strides) == _c_strides(shape, got.itemsize)
        _check_meta(name, got, shape, contiguous, dtype, axes, dims)
        arr = gpuarray.GPUArray(shape, dtype, gpudata=int(cai["data"][0]), base=x)
    elif isinstance(x, np.ndarray):
        _check_meta(name, x.dtype, x.shape, x.flags.c_contiguous, dtype, axes, dims)
        arr = gpuarray.to_gpu(x, allocator=allocator())
    else:
        raise TypeError(f"{name}: expected a NumPy array, a PyCUDA GPUArray or an object with "
                        f"__cuda_array_interface__, got {type(x).__name__}")
    return arr


def check_aligned(vec: int, **arrays: Any) -> None:
    """Vector loads of ``vec`` floats need 4*vec-byte aligned base pointers."""
    for name, arr in arrays.items():
        if int(arr.gpudata) % (4 * vec):
            raise ValueError(f"{name}: device pointer {int(arr.gpudata):#x} is not {4 * vec}-byte "
                             f"aligned, which the launch parameter VEC={vec} needs; pass an "
                             f"aligned array or launch with VEC=1")


def _check_meta(name: str, got_dtype: Any, shape: Sequence[int], contiguous: bool,
                dtype: np.dtype, axes: Sequence[str], dims: MutableMapping[str, int]) -> None:
    if np.dtype(got_dtype) != dtype:
        raise TypeError(f"{name}: expected dtype {dtype}, got {np.dtype(got_dtype)}")
    if not contiguous:
        raise ValueError(f"{name}: expected a C-contiguous array, got a strided view of shape "
                         f"{tuple(shape)}")
    check_shape(name, shape, axes, dims)


_POISON = [False]


@contextmanager
def poisoned_outputs() -> Iterator[None]:
    """Inside this block every output and scratch buffer starts as NaN, so a test can prove each
    element was written (a kernel that skips one leaves a NaN behind)."""
    _POISON[0] = True
    try:
        yield
    finally:
        _POISON[0] = False


def empty(shape: Sequence[int], dtype: type = np.float32) -> Any:
    """A pooled, uninitialised device array (NaN-filled inside ``poisoned_outputs``)."""
    arr = _gpuarray().empty(tuple(int(n) for n in shape), dtype, allocator=allocator())
    if _POISON[0]:
        arr.fill(np.float32(np.nan))
    return arr
