"""PyCUDA faked for the library's core on the CPU: launches are recorded, allocations are
addresses from a counter (the ``fake_gpu`` fixture)."""
import itertools
import struct
import sys
import types

import numpy as np
import pytest

from pycuda_heads.core import arrays, compile as core_compile, deferred, device
from pycuda_heads.core.runtime import RUNTIME


class FakeGPUArray:
    """The attributes PyCUDA's GPUArray sets that the library reads."""

    def __init__(self, shape, dtype, allocator=None, base=None, gpudata=None, strides=None):
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)
        self.size = int(np.prod(self.shape, dtype=np.int64))
        self.nbytes = self.size * self.dtype.itemsize
        self.strides = strides or arrays._c_strides(self.shape, self.dtype.itemsize)
        self.allocator, self.base, self.gpudata = allocator, base, gpudata

    def fill(self, value):
        self.filled = value


class FakeFunction:
    def prepare(self, types):
        self.arg_format = "".join(types)

    def _launch_kernel(self, grid, block, args, shared, stream):
        pass

    def set_attribute(self, *args):
        pass


class FakeModule:
    def get_function(self, name):
        return FakeFunction()


class Counter:
    """The pool: consecutive addresses, restartable so two calls can get the same ones."""

    def __init__(self):
        self.restart()

    def restart(self):
        self._next = itertools.count(1 << 20, 4096)

    def __call__(self, nbytes):
        return next(self._next)


@pytest.fixture
def fake_gpu(monkeypatch):
    """PyCUDA replaced for the library's core; returns the allocation counter."""
    gpuarray = types.SimpleNamespace(GPUArray=FakeGPUArray,
                                     to_gpu=lambda a, allocator: FakeGPUArray(
                                         a.shape, a.dtype, gpudata=allocator(a.nbytes)))
    drv = types.SimpleNamespace(Error=RuntimeError, Context=types.SimpleNamespace(
        synchronize=lambda: None))
    monkeypatch.setitem(sys.modules, "pycuda", types.ModuleType("pycuda"))
    monkeypatch.setitem(sys.modules, "pycuda.gpuarray", gpuarray)
    monkeypatch.setitem(sys.modules, "pycuda._pvt_struct", types.SimpleNamespace(pack=struct.pack))
    counter = Counter()
    for module in (device, arrays, core_compile, deferred):
        monkeypatch.setattr(module, "cuda", lambda: drv)
    monkeypatch.setattr(device, "gpu_slug", lambda: "fake-gpu")
    monkeypatch.setattr(device, "max_shared_bytes", lambda: 232448)
    monkeypatch.setattr(arrays, "allocator", lambda: counter)
    monkeypatch.setattr(core_compile, "_module", lambda source, arch: FakeModule())
    monkeypatch.setattr(RUNTIME, "kernels", {})
    monkeypatch.setattr(RUNTIME, "reducer", None)
    monkeypatch.setattr(RUNTIME, "pdl", False)  # plain launches unless a test says so
    monkeypatch.setenv("PYCUDA_HEADS_SYNC", "0")
    caches = (arrays._gpuarray, arrays._array_fields, arrays._packed)
    for cache in caches:
        cache.cache_clear()
    yield counter
    for cache in caches:  # nothing fake may outlive the test
        cache.cache_clear()
