"""run.py's control flow on a machine without a GPU: PyCUDA, the device and the library's pool
faked (every kernel a no-op, every output zeros, so every point "FAILS"), to catch a Python
mistake before GPU time is spent. Prints each module's -D options and each shape's points.

    python probes/pool_wide/dry_run.py [first] [rows] [dsplit]
"""
from __future__ import annotations

import contextlib
import json
import sys
import tempfile
import types
from pathlib import Path
from typing import Any

import numpy as np


class Array:
    def __init__(self, a: Any) -> None:
        self.a, self.gpudata = np.asarray(a), 0

    def get(self) -> np.ndarray:
        return self.a.copy()


class Kernel:
    num_regs = 128

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def set_attribute(self, *args: Any) -> None:
        pass


class SourceModule:
    options: list[list[str]] = []

    def __init__(self, source: str, **kwargs: Any) -> None:
        SourceModule.options.append(kwargs["options"])

    def get_function(self, name: str) -> Kernel:
        return Kernel()


def main(versions: list[str]) -> None:
    gpuarray = types.ModuleType("pycuda.gpuarray")
    gpuarray.to_gpu = Array
    gpuarray.empty = lambda shape, dtype: Array(np.zeros(shape, dtype))
    compiler = types.ModuleType("pycuda.compiler")
    compiler.SourceModule = SourceModule
    pycuda = types.ModuleType("pycuda")
    pycuda.gpuarray, pycuda.compiler = gpuarray, compiler
    sys.modules.update({"pycuda": pycuda, "pycuda.gpuarray": gpuarray,
                        "pycuda.compiler": compiler})
    from pycuda_heads.core import device
    device.max_shared_bytes = lambda: 232448
    device.sm_count = lambda: 132
    device.gpu_name = lambda: "fake"
    device.cuda = lambda: types.SimpleNamespace(
        function_attribute=types.SimpleNamespace(MAX_DYNAMIC_SHARED_SIZE_BYTES=0))
    device.thread_context = contextlib.nullcontext
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import run

    class Pool:
        def __init__(self, h: int, d: int) -> None:
            self.chosen = {"forward": {"params": {}}}

        def forward(self, *args: Any) -> None:
            pass

        backward = forward

    run.SHAPES = tuple((h, d, min(b, 4), k) for h, d, b, k in run.SHAPES)  # small batches
    run.CudaHarness = lambda: types.SimpleNamespace(copy_bandwidth_gbps=lambda: 4000.0)
    run.gpu_time_us = lambda fn: (fn(), {"median_us": 1.0})[1]
    run.PerHorizonAttentionPool = Pool
    run.reducer = lambda: types.SimpleNamespace(
        sum_rows=lambda scratch, n, m, stream, shape: Array(np.zeros(shape)))
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.json"
        with contextlib.redirect_stdout(sys.stderr):
            run.main(str(out), set(versions) or set(run.VERSIONS))
        record = json.loads(out.read_text())
    for options in SourceModule.options:
        print("module", " ".join(options))
    for s in record["shapes"]:
        print(f"H={s['H']} D={s['D']} B={s['B']} K={s['K']}: {len(s['forward'])} forward, "
              f"{len(s['backward'])} backward points")


if __name__ == "__main__":
    main(sys.argv[1:])
