"""Host cost of op calls with PyCUDA faked (the launch and the pool cost nothing): what the
library's own Python adds per call. Run in each checkout to compare, e.g.

    git worktree add /tmp/base be51482
    PYTHONPATH=/tmp/base python probes/host_cost_ab.py base > base.json
    PYTHONPATH=. python probes/host_cost_ab.py head > head.json

Prints JSON: the fastest of 25 rounds of the per-call microseconds of each case."""
import itertools
import json
import struct
import sys
import time
import types

import numpy as np


class FakeGPUArray:
    def __init__(self, shape, dtype, allocator=None, base=None, gpudata=None, strides=None):
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)
        self.size = int(np.prod(self.shape, dtype=np.int64))
        self.nbytes = self.size * self.dtype.itemsize
        step, strides_ = self.dtype.itemsize, []
        for n in reversed(self.shape):
            strides_.append(step)
            step *= n
        self.strides = strides or tuple(reversed(strides_))
        self.allocator, self.base, self.gpudata = allocator, base, gpudata


class FakeFunction:
    def prepare(self, types_):
        self.arg_format = "".join(types_)

    def _launch_kernel(self, grid, block, args, shared, stream):
        pass

    def set_attribute(self, *args):
        pass


def fake() -> None:
    """PyCUDA replaced in whichever version of the library is on the path."""
    sys.modules["pycuda"] = types.ModuleType("pycuda")
    sys.modules["pycuda.gpuarray"] = types.SimpleNamespace(GPUArray=FakeGPUArray)
    sys.modules["pycuda._pvt_struct"] = types.SimpleNamespace(pack=struct.pack)
    from pycuda_heads.core import arrays, compile as core_compile, device
    drv = types.SimpleNamespace(Error=RuntimeError, Function=FakeFunction,
                                Context=types.SimpleNamespace(synchronize=lambda: None))
    counter = itertools.count(1 << 20, 4096)
    for module in (device, arrays, core_compile):
        module.cuda = lambda: drv
    device.gpu_slug = lambda: "fake-gpu"
    device.max_shared_bytes = lambda: 232448
    arrays.allocator = lambda: lambda nbytes: next(counter)
    core_compile._module = lambda source: types.SimpleNamespace(
        get_function=lambda name: FakeFunction())
    if hasattr(core_compile, "_PDL"):
        core_compile._PDL[:] = [False]
    else:
        from pycuda_heads.core.runtime import RUNTIME
        RUNTIME.pdl = False


def per_call_us(call, n: int = 5000, rounds: int = 25) -> float:
    call()
    out = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(n):
            call()
        out.append((time.perf_counter() - t0) / n * 1e6)
    return round(min(out), 3)  # the least disturbed round: this measures code, not the machine


def main(label: str) -> None:
    import os
    os.environ["PYCUDA_HEADS_SYNC"] = "0"
    fake()
    import pycuda_heads as ph
    h, d = 5, 128
    gpu = lambda *s: FakeGPUArray(s, np.float32, gpudata=1 << 30)  # noqa: E731
    rg, pool = ph.ResidualGate(h, d), ph.PerHorizonAttentionPool(h, d)
    x = (gpu(3, h, d), gpu(h, d), gpu(h), gpu(3, h), gpu(h))
    q, ln, attn, g = gpu(h, d), gpu(2, 8, d), gpu(2, h, 8), gpu(2, h, d)
    cases = {
        "resgate.forward B=3": lambda: rg.forward(*x),
        "resgate.backward B=3": lambda: rg.backward(x[0], x[1], x[4], x[3], x[3]),
        "pool.forward B=2,K=8": lambda: pool.forward(q, ln),
        "pool.backward B=2,K=8": lambda: pool.backward(q, ln, attn, g),
    }
    print(json.dumps({"label": label, "python": sys.version.split()[0],
                      "us_per_call": {k: per_call_us(c) for k, c in cases.items()}}, indent=1))


if __name__ == "__main__":
    main(sys.argv[1])
