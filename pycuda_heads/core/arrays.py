"""Input adaptation: NumPy arrays are copied to the device, PyCUDA GPUArrays are used in place,
anything with ``__cuda_array_interface__`` (CuPy, PyTorch CUDA tensors) is wrapped zero-copy.
Every check runs before anything is launched and names the argument, expected and actual value."""
from __future__ import annotations

from contextlib import contextmanager
from functools import lru_cache
from typing import Any, Iterator, Mapping, MutableMapping, Sequence

import numpy as np

from .device import allocator, cuda
from .runtime import QUIET, scope, scoped

# Kernels index elements with 32-bit ints.
MAX_ELEMENTS = 2**31 - 1


@lru_cache(maxsize=None)
def _gpuarray() -> Any:
    cuda()
    import pycuda.gpuarray as gpuarray
    return gpuarray


@lru_cache(maxsize=4096)
def _c_strides(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    strides, step = [], itemsize
    for n in reversed(shape):
        strides.append(step)
        step *= n
    return tuple(reversed(strides))


@lru_cache(maxsize=4096)
def _array_fields(shape: tuple[int, ...], dtype: np.dtype) -> tuple[type, dict[str, Any]]:
    """The GPUArray class and every attribute of one of this shape and dtype but its memory,
    from one built by PyCUDA's own constructor: a small call then wraps memory without
    re-deriving them."""
    cls = _gpuarray().GPUArray
    check_copyable(cls)
    fields = dict(vars(cls(shape, dtype, gpudata=0)))
    fields["gpudata"] = fields["base"] = None
    return cls, fields


@lru_cache(maxsize=None)
def check_copyable(cls: type) -> None:
    """``_new_array`` builds a GPUArray by copying a constructed one's attributes, several times
    cheaper than the constructor on every output. That holds while the constructor only sets
    attributes, of which only ``gpudata`` and ``base`` depend on the memory (PyCUDA 2024.1 to
    2026.1; setup.cfg pins that range). Checked once against the constructor itself."""
    a = vars(cls((3, 2), _F32, gpudata=256))
    b = vars(cls((3, 2), _F32, gpudata=512, base=a))
    differ = {k for k in a.keys() | b.keys() if k not in a or k not in b or not _same(a[k], b[k])}
    if hasattr(cls, "__slots__") or not differ <= {"gpudata", "base"}:
        raise RuntimeError(f"this PyCUDA's GPUArray keeps memory-dependent state in "
                           f"{sorted(differ - {'gpudata', 'base'}) or '__slots__'}, which "
                           "pycuda-heads cannot copy; install a supported PyCUDA: "
                           "pip install 'pycuda>=2024.1,<2026.2'")


def _same(x: Any, y: Any) -> bool:
    try:
        return x is y or bool(x == y)
    except (TypeError, ValueError):  # an array compared elementwise
        return False


def _new_array(cls: type, fields: dict[str, Any], gpudata: Any, base: Any) -> Any:
    # a copied dict is several times cheaper than filling an instance's own one by one
    arr = object.__new__(cls)
    arr.__dict__ = attrs = fields.copy()
    attrs["gpudata"], attrs["base"] = gpudata, base
    return arr


def wrap(shape: tuple[int, ...], dtype: np.dtype, gpudata: Any, base: Any = None) -> Any:
    """A C-contiguous GPUArray over ``gpudata`` (an allocation or a raw pointer); ``base``
    keeps the owner of borrowed memory alive."""
    return _new_array(*_array_fields(shape, dtype), gpudata, base)


@lru_cache(maxsize=1024)
def _packed(shapes: tuple[tuple[int, ...], ...], align: int) -> tuple[tuple[tuple, int], ...]:
    """((GPUArray class and fields, byte offset) per float32 shape, in order, each offset a
    multiple of ``align``), total bytes."""
    layout, at = [], 0
    for shape in shapes:
        cls, fields = _array_fields(shape, _F32)
        layout.append(((cls, fields), at))
        at += -(-fields["nbytes"] // align) * align
    return tuple(layout), at


def split(base: Any, *shapes: tuple[int, ...]) -> list[Any]:
    """C-contiguous float32 views of ``base``'s memory (a device array), laid back to back in
    ``shapes``' order; each keeps ``base`` alive."""
    layout, _ = _packed(shapes, 4)
    at = int(base.gpudata)
    return [_new_array(cls, fields, at + offset, base) for (cls, fields), offset in layout]


def check_shape(name: str, shape: Sequence[int], axes: Sequence[str],
                dims: MutableMapping[str, int]) -> None:
    """Bind named axes (B, K, ...) on first sight; later arguments must agree with them."""
    if len(shape) != len(axes):
        _shape_error(name, shape, axes, dims)
    for label, n in zip(axes, shape):
        bound = dims.setdefault(label, n)
        if n < 1 or bound != n:
            _shape_error(name, shape, axes, dims)
    if int(np.prod(shape, dtype=np.int64)) > MAX_ELEMENTS:
        raise ValueError(f"{name}: shape {tuple(shape)} has more than {MAX_ELEMENTS} elements, "
                         "the most the kernels index; split the batch")


def _shape_error(name: str, shape: Sequence[int], axes: Sequence[str],
                 dims: MutableMapping[str, int]) -> None:
    """Raise the ValueError that says what is wrong with ``shape`` (the slow, rare path)."""
    shape = tuple(int(n) for n in shape)
    spelled = "(" + ", ".join(axes) + ")"
    if len(shape) != len(axes):
        raise ValueError(f"{name}: expected a {len(axes)}-d array {spelled}, got shape {shape}")
    for axis, (label, n) in enumerate(zip(axes, shape)):
        if n < 1:
            raise ValueError(f"{name}: axis {axis} ({label}) must be >= 1, got shape {shape}")
        if dims[label] != n:
            want = tuple(dims.get(a, "?") for a in axes)
            raise ValueError(f"{name}: expected shape {spelled} = {want}, got {shape} "
                             f"({label} is {dims[label]}, axis {axis} has {n})")


_F32 = np.dtype(np.float32)


def as_device(x: Any, name: str, axes: Sequence[str], dims: MutableMapping[str, int],
              dtype: type = np.float32) -> Any:
    """``x`` as a C-contiguous GPUArray of ``dtype`` whose shape matches ``axes``."""
    dtype = _F32 if dtype is np.float32 else np.dtype(dtype)
    gpuarray = _gpuarray()
    if type(x) is gpuarray.GPUArray:  # the common case: checked inline, nothing built
        shape = x.shape
        # strides, not flags: GPUArray.flags is a memoized property, slower than a compare
        if (x.dtype is dtype or x.dtype == dtype) and len(shape) == len(axes) \
                and x.strides == _c_strides(shape, dtype.itemsize) and x.size <= MAX_ELEMENTS:
            for label, n in zip(axes, shape):
                if dims.setdefault(label, n) != n or n < 1:
                    _shape_error(name, shape, axes, dims)
            return x
        _check_meta(name, x.dtype, shape, x.strides == _c_strides(shape, x.dtype.itemsize),
                    dtype, axes, dims)
        return x
    if hasattr(x, "__cuda_array_interface__"):
        cai = x.__cuda_array_interface__
        shape = tuple(cai["shape"])
        got = np.dtype(cai["typestr"])
        strides = cai.get("strides")
        contiguous = strides is None or tuple(strides) == _c_strides(shape, got.itemsize)
        _check_meta(name, got, shape, contiguous, dtype, axes, dims)
        return wrap(shape, dtype, int(cai["data"][0]), x)  # a GPUArray subclass too
    if isinstance(x, np.ndarray):
        _check_meta(name, x.dtype, x.shape, x.flags.c_contiguous, dtype, axes, dims)
        return gpuarray.to_gpu(x, allocator=allocator())
    raise TypeError(f"{name}: expected a NumPy array, a PyCUDA GPUArray or an object with "
                    f"__cuda_array_interface__, got {type(x).__name__}")


class Inputs:
    """The array arguments of one op method in the order they are checked: ``name=axes``, or
    ``name=(axes, dtype)`` for one that is not float32.

    ``adapt`` passes each through ``as_device``. What those checks decide depends only on each
    array's type, shape, strides and dtype and on the dims the op binds itself, so a call whose
    arrays are all GPUArrays (or None, for optional ones) with a signature that passed before
    skips them and reuses the dims they bound: a different shape, dtype or layout is checked
    again and raises the same error as ever.
    """

    #: signatures remembered per op before the memo starts afresh (varying batch sizes)
    MEMO_SIZE = 1024

    def __init__(self, **args: Any) -> None:
        self.args = tuple((name, *((spec, np.float32) if isinstance(spec[0], str) else spec))
                          for name, spec in args.items())

    def adapt(self, memo: dict[tuple, dict[str, int]], bound: Mapping[str, int],
              *arrays: Any) -> tuple[tuple, dict[str, int]]:
        """(the arrays as device arrays, None left as None; every named axis -> its size).
        ``memo`` is the op's own (it holds results for the op's ``bound`` dims)."""
        key = self._signature(arrays)
        hit = memo.get(key) if key is not None else None
        if hit is not None:
            return arrays, dict(hit)
        dims = dict(bound)
        adapted = tuple(None if x is None else as_device(x, name, axes, dims, dtype)
                        for x, (name, axes, dtype) in zip(arrays, self.args))
        if key is not None:
            if len(memo) >= self.MEMO_SIZE:
                memo.clear()
            memo[key] = dict(dims)
        return adapted, dims

    def _signature(self, arrays: tuple) -> tuple | None:
        """What ``as_device`` checks of ``arrays``, or None when one is not a GPUArray (NumPy
        arrays are copied, CUDA arrays wrapped: each call adapts them anew)."""
        gpuarray = _gpuarray().GPUArray
        key: list[Any] = [self]
        for x in arrays:
            if type(x) is gpuarray:
                key += x.shape, x.strides, x.dtype
            elif x is None:
                key.append(None)
            else:
                return None
        return tuple(key)


def output_buffer(out: Any, accumulate: bool, name: str, axes: Sequence[str],
                  dims: MutableMapping[str, int]) -> Any:
    """The array a kernel writes its ``axes``-shaped result into: a new one, or the caller's
    device array ``out`` (in place; with ``accumulate`` the result is added to what it holds)."""
    if out is None:
        if accumulate:
            raise ValueError(f"accumulate=True needs out= (the {name} buffer to add into)")
        return empty(tuple(map(dims.__getitem__, axes)))
    if not hasattr(out, "gpudata") and not hasattr(out, "__cuda_array_interface__"):
        raise TypeError(f"out: expected a device array (GPUArray or CUDA array), got "
                        f"{type(out).__name__}; a NumPy array cannot receive the result")
    return as_device(out, "out", axes, dims)


def check_aligned(vec: int, **arrays: Any) -> None:
    """Vector loads of ``vec`` floats need 4*vec-byte aligned base pointers."""
    if vec == 1:
        return
    for name, arr in arrays.items():
        if int(arr.gpudata) % (4 * vec):
            raise ValueError(f"{name}: device pointer {int(arr.gpudata):#x} is not {4 * vec}-byte "
                             f"aligned, which the launch parameter VEC={vec} needs; pass an "
                             f"aligned array or launch with VEC=1")


def _check_meta(name: str, got_dtype: Any, shape: Sequence[int], contiguous: bool,
                dtype: np.dtype, axes: Sequence[str], dims: MutableMapping[str, int]) -> None:
    if got_dtype != dtype:
        raise TypeError(f"{name}: expected dtype {dtype}, got {np.dtype(got_dtype)}")
    if not contiguous:
        raise ValueError(f"{name}: expected a C-contiguous array, got a strided view of shape "
                         f"{tuple(shape)}")
    check_shape(name, shape, axes, dims)


@contextmanager
def poisoned_outputs() -> Iterator[None]:
    """Inside this block every output and scratch buffer this thread makes starts as NaN, so a
    test can prove each element was written (a kernel that skips one leaves a NaN behind)."""
    with scoped(poison=True):
        yield


def empty(shape: tuple[int, ...], dtype: type = np.float32) -> Any:
    """A pooled, uninitialised device array (NaN-filled inside ``poisoned_outputs``)."""
    if type(shape) is not tuple:
        shape = tuple(int(n) for n in shape)
    cls, fields = _array_fields(shape, _F32 if dtype is np.float32 else np.dtype(dtype))
    nbytes = fields["nbytes"]
    now = scope()
    if now is not QUIET or not nbytes:
        return _sourced(cls, fields, nbytes, now)
    return _new_array(cls, fields, allocator()(nbytes), None)


def empty_parts(*shapes: tuple[int, ...], align: int = 256) -> list[Any]:
    """Pooled float32 arrays of ``shapes`` carved from one allocation, in order, each starting at
    a multiple of ``align`` bytes (4: back to back, so that a kernel may write across them as
    one row): what a launch that needs several buffers pays one pool call for."""
    layout, nbytes = _packed(shapes, align)
    now = scope()
    if now is not QUIET:  # the memory source or the NaN fill sees one buffer
        block = empty((nbytes // 4,))
        at = int(block.gpudata)
    else:
        block = allocator()(nbytes)
        at = int(block)
    return [_new_array(cls, fields, at + offset, block) for (cls, fields), offset in layout]


def _sourced(cls: type, fields: dict[str, Any], nbytes: int, now: Any) -> Any:
    """``empty`` off the common path: memory from ``memory_from``'s source, none for no
    elements, NaN-filled inside ``poisoned_outputs``."""
    if not nbytes:
        arr = _new_array(cls, fields, None, None)
    elif now.source is not None:
        arr = _new_array(cls, fields, *now.source.allocate(nbytes))
    else:
        arr = _new_array(cls, fields, allocator()(nbytes), None)
    if now.poison:
        arr.fill(np.float32(np.nan))
    return arr


class Arena:
    """One device buffer that serves a fixed sequence of allocations at fixed addresses.

    The first pass through a piece of code (``measuring``) takes its memory from the pool and
    records the sizes; ``reserve`` then lays them out in one buffer, and every later pass gets
    the same addresses in the same order. A CUDA graph captured from such a pass replays
    correctly: nothing it touches moves, and nothing is allocated while it is captured.
    """

    _ALIGN = 256

    def __init__(self) -> None:
        self.sizes: list[int] = []
        self.offsets: list[int] = []
        self.buffer: Any = None
        self._next = 0

    @property
    def measuring(self) -> bool:
        return self.buffer is None

    def reserve(self) -> None:
        """Lay the recorded sizes out in one allocation."""
        total = 0
        for n in self.sizes:
            self.offsets.append(total)
            total += -(-n // self._ALIGN) * self._ALIGN
        self.buffer = cuda().mem_alloc(max(total, self._ALIGN))

    def rewind(self) -> None:
        self._next = 0

    def allocate(self, nbytes: int) -> tuple[Any, Any]:
        i = self._next
        self._next += 1
        if self.measuring:
            self.sizes.append(nbytes)
            return allocator()(nbytes), None
        if i >= len(self.sizes) or self.sizes[i] != nbytes:
            raise RuntimeError(f"allocation {i} of {nbytes} B departs from the recorded sequence "
                               f"{self.sizes}: the step's shapes or launch parameters changed")
        return int(self.buffer) + self.offsets[i], self


@contextmanager
def memory_from(source: Any) -> Iterator[Any]:
    """Inside this block every output and scratch buffer this thread makes comes from
    ``source``: an object with ``allocate(nbytes) -> (device pointer or allocation, owner to
    keep alive)`` (an ``Arena``, or another framework's allocator so that its stream and graph
    rules hold)."""
    if isinstance(source, Arena):
        source.rewind()
    with scoped(source=source):
        yield source
