"""reduce_axis0: deterministic column sums y[m] = sum_n x[n, m], no atomics. Used by every
backward to turn per-block scratch into weight gradients."""
from __future__ import annotations

from typing import Any, Callable, Mapping

import numpy as np

from .. import reference as ref
from ..core.arrays import as_device, empty
from ..core.op import Op
from ..core.runtime import RUNTIME
from ..core.space import KernelSpace, by_role
from ..core.spec import KernelSpec, Tensor

SPACE = KernelSpace(
    kernel="reduce.axis0",
    params={"TX": (32, 64, 128), "TY": (1, 2, 4, 8, 16, 32), "SPLIT_ROWS": (64, 256, 1024, 4096)},
    default={"TX": 32, "TY": 8, "SPLIT_ROWS": 1024},
    restrictions=("32 <= TX * TY <= 1024",),
    launch_restrictions=("(N + SPLIT_ROWS - 1) // SPLIT_ROWS <= 65535",),
)


class ReduceAxis0(Op):
    """``x[N, M] -> y[M]`` in a fixed order: bitwise reproducible for a fixed launch config."""

    FAMILY = "reduce"
    SPACES = by_role(SPACE)
    PDL = True  # it follows the backward that wrote its rows

    def __init__(self, launch: Mapping[str, Mapping[str, Any]] | None = None):
        super().__init__({}, launch)

    def axis0(self, x: Any, *, stream: Any = None) -> Any:
        """``y[m] = sum_n x[n, m]`` of a float32 [N, M] array; a GPUArray [M]."""
        dims: dict[str, int] = {}
        x = as_device(x, "x", ("N", "M"), dims)
        return self.sum_rows(x, dims["N"], dims["M"], stream)

    def sum_rows(self, x: Any, n: int, m: int, stream: Any = None,
                 shape: tuple[int, ...] | None = None) -> Any:
        """Column sums of the device buffer ``x`` viewed as [n, m]; returns a GPUArray [m]
        (or of ``shape``, m elements seen as, say, [H, D])."""
        plan = self.plan("axis0", {"N": n, "M": m}, lambda p: (
            (-(-m // p["TX"]), 1, 1), (p["TX"], p["TY"], 1), 0))
        rows_per_split = plan.params["SPLIT_ROWS"]
        if n <= rows_per_split:  # one level: the common case of the backward passes
            dst = empty(shape or (m,))
            plan.kernel(plan.grid, plan.block, x=x.gpudata, y=dst.gpudata, N=n, M=m,
                        rows_per_split=rows_per_split, stream=stream)
            return dst
        src, rows = x, n
        while True:
            splits = -(-rows // rows_per_split)
            dst = empty((shape or (m,)) if splits == 1 else (splits, m))
            plan.kernel((plan.grid[0], splits, 1), plan.block, x=src.gpudata, y=dst.gpudata,
                        N=rows, M=m, rows_per_split=rows_per_split, stream=stream)
            if splits == 1:
                return dst
            src, rows = dst, splits


def reducer() -> ReduceAxis0:
    """The shared reducer the backward passes use (tuned-table launch parameters)."""
    red = RUNTIME.reducer
    if red is None:
        with RUNTIME.lock:
            red = RUNTIME.reducer = RUNTIME.reducer or ReduceAxis0()
    return red


def reduce_axis0(x: Any) -> Any:
    """``y[m] = sum_n x[n, m]`` for a float32 [N, M] array (NumPy, GPUArray or CUDA array)."""
    return reducer().axis0(x)


def torch_axis0(torch: Any, x: Any) -> Any:
    return x.sum(dim=0)


def exact_integer_sum(make_op: Callable[[Mapping[str, int]], Any],
                      template: Mapping[str, int]) -> dict:
    """Small integers sum exactly in float32: the result must equal the integer sum."""
    rng = np.random.default_rng(2028)
    op, ok = make_op(template), True
    for n, m in ((5000, 33), (300000, 5)):  # one and several reduction levels
        x = rng.integers(-8, 9, size=(n, m)).astype(np.float32)
        ok &= bool((op.axis0(x).get() == x.astype(np.int64).sum(axis=0)).all())
    return {"exact_integer_sum": {"passed": ok}}


# reduce.axis0 as the backward passes call it: [B, H*D] scratch rows at the suite's batch sizes,
# and the pool's wide heads' rows (H=2, D=1024: 128 blocks; H=32, D=128: 512).
_HD = 5 * 128
SPECS = (
    KernelSpec(op=ReduceAxis0, method="axis0", space=SPACE, template_keys=(),
               tensors={"x": Tensor(("N", "M")), "y": Tensor(("M",))}, reads=("x",),
               writes=("y",), reference=ref.reduce_axis0, peer=torch_axis0,
               oracles=exact_integer_sum,
               suite=({"N": 256, "M": _HD}, {"N": 4096, "M": _HD}, {"N": 65536, "M": _HD},
                      {"N": 128, "M": 2048}, {"N": 512, "M": 4096}),
               grid=(({}, {"N": 1, "M": 1}), ({}, {"N": 1, "M": 640}), ({}, {"N": 7, "M": 3}),
                     ({}, {"N": 5000, "M": 33}), ({}, {"N": 300000, "M": 5}))),
)
