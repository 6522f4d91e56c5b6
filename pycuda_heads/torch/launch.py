"""From torch tensors to kernel launches: each op method's launch program per signature, run
with the tensors' addresses on torch's current stream, every buffer from torch's caching
allocator. A repeat signature costs a key of tensor properties, one lookup, one allocation per
output (and one for scratch, where the op needs it) and the launches: in C++ where the
launcher in ``native.py`` is built, else here in Python."""
from __future__ import annotations

from functools import lru_cache
from typing import Any, Callable, Sequence

import numpy as np
import torch

from ..core.device import cuda, thread_context
from ..core.op import Op
from ..core.program import ArraySpec, Program, record
from .native import native as _native

#: the dtypes the kernels take: float32, and int32 for labels
DTYPES = {torch.float32: np.dtype(np.float32), torch.int32: np.dtype(np.int32)}
#: alignment the ops' checks can ask of an address (float4 loads)
_ALIGN = 16

try:  # the raw handle without building a Stream object (what inductor's own code calls)
    raw_stream: Callable[[int], int] = torch._C._cuda_getCurrentRawStream
except AttributeError:  # a build without it: the public, slower way
    def raw_stream(index: int) -> int:
        return torch.cuda.current_stream(index).cuda_stream


@lru_cache(maxsize=None)
def pycuda_device() -> int:
    """The index of the device PyCUDA's primary context is on, the one every kernel runs on.
    The driver numbers devices as the CUDA runtime (and so torch) does: both count the devices
    CUDA_VISIBLE_DEVICES leaves, in the order CUDA_DEVICE_ORDER sets."""
    drv = cuda()
    with thread_context():
        here = drv.Context.get_device()
    return next(i for i in range(drv.Device.count()) if drv.Device(i) == here)


def check_tensor(t: Any, name: str, dtype: torch.dtype = torch.float32) -> None:
    """TypeError or ValueError naming ``name`` unless ``t`` is a contiguous ``dtype`` tensor on
    the kernels' device."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if not t.is_cuda:
        raise TypeError(f"{name}: expected a CUDA tensor, got one on {t.device}")
    if t.get_device() != pycuda_device():
        raise ValueError(f"{name}: expected a tensor on cuda:{pycuda_device()}, the device of "
                         f"PyCUDA's primary context that the kernels run on, got {t.device}")
    if t.dtype != dtype:
        raise TypeError(f"{name}: expected dtype {dtype}, got {t.dtype}")
    if not t.is_contiguous():
        raise ValueError(f"{name}: expected a contiguous tensor, got shape {tuple(t.shape)} with "
                         f"strides {t.stride()}")


class Method:
    """One op method driven with torch tensors: ``method(*tensors)`` -> its output tensors.

    ``names`` are the tensor arguments in the method's order (None where an optional one is
    absent), ``dtypes`` the dtype of each that is not float32, ``call(op, arrays)`` the method's
    call and ``outputs(result)`` what it hands back (``core.program.record``). ``native``
    False keeps it on the Python launcher: a method made for one call (its launch constants
    change every call) takes it, as the C++ launcher keeps every method it is given."""

    def __init__(self, op: Op, names: Sequence[str], call: Callable[[Op, list], Any],
                 outputs: Callable[[Any], Sequence[Any]],
                 dtypes: dict[str, torch.dtype] | None = None, native: bool = True) -> None:
        self.op, self.names, self.call, self.outputs = op, tuple(names), call, outputs
        self.dtypes = [(dtypes or {}).get(n, torch.float32) for n in self.names]
        #: signature -> (its program, the tensors' device), for the Python launcher
        self.programs: dict[tuple, tuple[Program, torch.device]] = {}
        self.lib = _native() if native else None
        #: this method's handle in the C++ launcher, which asks ``_describe`` for a program
        self.handle = None if self.lib is None else self.lib.method(self._describe)

    def __call__(self, *tensors: torch.Tensor | None) -> Sequence[torch.Tensor]:
        if self.lib is not None:  # it refuses a non-tensor through ``_describe``'s checks
            return self.lib.run(self.handle, *tensors)
        try:
            pointers = [0 if t is None else t.data_ptr() for t in tensors]
            key = tuple([None if t is None else
                         (t.shape, t.dtype, t.get_device(), t.is_contiguous(), p % _ALIGN)
                         for t, p in zip(tensors, pointers)])  # a list: no generator frames
            hit = self.programs.get(key)
        except (AttributeError, RuntimeError):  # no tensor, no storage: the checks name it
            key, hit, pointers = None, None, None
        program, device = hit or self._record(tensors, key)
        outs = [torch.empty(shape, device=device) for shape, _ in program.outputs]
        scratch = torch.empty(program.scratch_bytes, dtype=torch.uint8, device=device) \
            if program.scratch_bytes else None
        program.run(pointers or [0 if t is None else t.data_ptr() for t in tensors],
                    [o.data_ptr() for o in outs],
                    0 if scratch is None else scratch.data_ptr(), raw_stream(device.index))
        return outs

    def _describe(self, tensors: Sequence[torch.Tensor | None]) -> tuple:
        """The program at these tensors' signature, as the C++ launcher takes it."""
        program, device = self._record(tensors, None)
        return program.describe(device.index)

    def _record(self, tensors: Sequence[torch.Tensor | None],
                key: tuple | None) -> tuple[Program, torch.device]:
        """Check every tensor, then work out the launches at this signature (the op's own
        shape checks raise here, naming the argument, before anything is launched)."""
        if len(tensors) != len(self.names):
            raise TypeError(f"expected {len(self.names)} tensors ({', '.join(self.names)}), "
                            f"got {len(tensors)}")
        for t, name, dtype in zip(tensors, self.names, self.dtypes):
            if t is not None:
                check_tensor(t, name, dtype)
        specs = [None if t is None else
                 ArraySpec(tuple(t.shape), DTYPES[t.dtype], t.data_ptr() % _ALIGN)
                 for t in tensors]
        hit = (record(lambda arrays: self.call(self.op, arrays), specs, self.outputs),
               tensors[0].device)
        if key is not None:
            if len(self.programs) >= 1024:  # many batch sizes: start afresh
                self.programs.clear()
            self.programs[key] = hit
        return hit
