"""reduce_axis0: deterministic column sums y[m] = sum_n x[n, m], no atomics. Used by every
backward to turn per-block scratch into weight gradients."""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from .arrays import as_device, empty
from .op import Op
from .space import KernelSpace

SPACE = KernelSpace(
    kernel="reduce_axis0",
    params={"TX": (32, 64, 128), "TY": (1, 2, 4, 8, 16, 32), "SPLIT_ROWS": (64, 256, 1024, 4096)},
    default={"TX": 32, "TY": 8, "SPLIT_ROWS": 1024},
    restrictions=("32 <= TX * TY <= 1024",),
    launch_restrictions=("(N + SPLIT_ROWS - 1) // SPLIT_ROWS <= 65535",),
)


class ReduceAxis0(Op):
    """``x[N, M] -> y[M]`` in a fixed order: bitwise reproducible for a fixed launch config."""

    FAMILY = "reduce_axis0"
    SPACES = {"reduce": SPACE}
    ENTRIES = {"reduce": ("reduce_axis0", "PPiii")}

    def __init__(self, launch: Mapping[str, Mapping[str, Any]] | None = None):
        super().__init__({}, launch)

    def __call__(self, x: Any) -> Any:
        dims: dict[str, int] = {}
        x = as_device(x, "x", ("N", "M"), dims)
        return self.sum_rows(x, dims["N"], dims["M"])

    def sum_rows(self, x: Any, n: int, m: int) -> Any:
        """Column sums of the device buffer ``x`` viewed as [n, m]; returns a GPUArray [m]."""
        params = self.launch_params("reduce", {"N": n, "M": m})
        kernel = self.kernel("reduce", params)
        tx, ty, rows_per_split = params["TX"], params["TY"], params["SPLIT_ROWS"]
        src, rows = x, n
        while True:
            splits = -(-rows // rows_per_split)
            dst = empty((splits, m))
            kernel((-(-m // tx), splits, 1), (tx, ty, 1), src.gpudata, dst.gpudata,
                   np.int32(rows), np.int32(m), np.int32(rows_per_split))
            if splits == 1:
                return dst.reshape(m)
            src, rows = dst, splits


_REDUCER: list[ReduceAxis0] = []


def reducer() -> ReduceAxis0:
    """The shared reducer the backward passes use (tuned-table launch parameters)."""
    if not _REDUCER:
        _REDUCER.append(ReduceAxis0())
    return _REDUCER[0]


def reduce_axis0(x: Any) -> Any:
    """``y[m] = sum_n x[n, m]`` for a float32 [N, M] array (NumPy, GPUArray or CUDA array)."""
    return reducer()(x)
