"""Bias-corrected Adam (cu/adam.cu): one elementwise, deterministic update of a parameter array
and its two moments; in place (training) or into new arrays (validation)."""
from __future__ import annotations

import functools
from typing import Any, Callable, Mapping

import numpy as np

from .. import reference as ref
from ..core.arrays import Inputs, empty
from ..core.op import Op
from ..core.space import KernelSpace, by_role
from ..core.spec import KernelSpec, Tensor

SPACE = KernelSpace(
    kernel="adam.step",
    params={"BLOCK": (64, 128, 256, 512, 1024), "ITEMS": (1, 2, 4, 8)},
    default={"BLOCK": 256, "ITEMS": 1},
)


@functools.lru_cache(maxsize=None)
def _inputs(rank: int) -> Inputs:
    """Any shape, the same for all four arrays: axes N0, N1, ... bound by param."""
    axes = tuple(f"N{i}" for i in range(rank))
    return Inputs(param=axes, grad=axes, m=axes, v=axes)


class Adam(Op):
    """param, m, v = adam.step(param, grad, m, v, t): step ``t`` (from 1) of Adam."""

    FAMILY = "adam"
    SPACES = by_role(SPACE)

    def __init__(self, lr: float = ref.ADAM_LR, beta1: float = ref.ADAM_BETA1,
                 beta2: float = ref.ADAM_BETA2, eps: float = ref.ADAM_EPS,
                 launch: Mapping[str, Mapping[str, Any]] | None = None):
        super().__init__({}, launch)
        self.lr, self.beta1, self.beta2, self.eps = lr, beta1, beta2, eps

    def step(self, param: Any, grad: Any, m: Any, v: Any, t: int, *,
             inplace: bool = False, stream: Any = None) -> tuple[Any, Any, Any]:
        """The new param, m and v (all float32 of one shape). ``inplace=True`` overwrites the
        given device arrays and returns them; otherwise the inputs are left untouched."""
        if not isinstance(t, (int, np.integer)) or t < 1:
            raise ValueError(f"t: expected the step number, an int >= 1, got {t!r}")
        shape = getattr(param, "shape", None)
        inputs = _inputs(len(np.shape(param) if shape is None else shape))
        (param_d, grad_d, m_d, v_d), _ = inputs.adapt(self._checked, {}, param, grad, m, v)
        if inplace:
            if not all(hasattr(x, "gpudata") or hasattr(x, "__cuda_array_interface__")
                       for x in (param, m, v)):
                raise TypeError("inplace=True needs device arrays for param, m and v")
            out = (param_d, m_d, v_d)
        else:
            out = (empty(param_d.shape), empty(param_d.shape), empty(param_d.shape))
        n = param_d.size
        plan = self.plan("step", {"N": n}, lambda p: (
            (-(-n // (p["BLOCK"] * p["ITEMS"])), 1, 1), (p["BLOCK"], 1, 1), 0))
        b1, b2, t = self.beta1, self.beta2, int(t)
        # Python floats: the launch packs them as float32, as the kernel's signature says
        plan.kernel(plan.grid, plan.block, param=param_d.gpudata, grad=grad_d.gpudata,
                    m=m_d.gpudata, v=v_d.gpudata, param_out=out[0].gpudata,
                    m_out=out[1].gpudata, v_out=out[2].gpudata, n=n, lr=self.lr, beta1=b1,
                    beta2=b2, one_minus_beta1=1 - b1, one_minus_beta2=1 - b2, eps=self.eps,
                    bc1=1 - b1 ** t, bc2=1 - b2 ** t, stream=stream)
        return out


def draw_second_moment(rng: np.random.Generator, shape: tuple,
                       dims: Mapping[str, int]) -> np.ndarray:
    """A running mean of squared gradients: positive."""
    return (rng.standard_normal(shape, dtype=np.float32) ** 2 * np.float32(1e-2))


def torch_step(torch: Any, param: Any, grad: Any, m: Any, v: Any, t: int) -> tuple[Any, ...]:
    b1, b2 = ref.ADAM_BETA1, ref.ADAM_BETA2
    m = b1 * m + (1 - b1) * grad
    v = b2 * v + (1 - b2) * grad * grad
    return (param - ref.ADAM_LR * (m / (1 - b1 ** t)) / (torch.sqrt(v / (1 - b2 ** t))
                                                          + ref.ADAM_EPS), m, v)


# Validation runs step _T: far enough from 1 that neither bias correction is trivial.
_T = 3


def oracles(make_op: Callable[[Mapping[str, int]], Any], template: Mapping[str, int]) -> dict:
    """Steps 1..5 in place match the float64 reference run alongside, and a second run of the
    same steps is bitwise identical."""
    import pycuda.gpuarray as gpuarray
    rng = np.random.default_rng(2032)
    n = 3001
    p0 = rng.standard_normal(n, dtype=np.float32)
    grads = [rng.standard_normal(n, dtype=np.float32) for _ in range(5)]
    adam = make_op(template)
    runs = []
    for _ in range(2):
        p, m, v = (gpuarray.to_gpu(a) for a in (p0, np.zeros(n, np.float32),
                                                np.zeros(n, np.float32)))
        for t, g in enumerate(grads, 1):
            adam.step(p, g, m, v, t, inplace=True)
        runs.append(p.get())
    want, m64, v64 = p0.astype(np.float64), np.zeros(n), np.zeros(n)
    for t, g in enumerate(grads, 1):
        want, m64, v64 = ref.adam_step(want, g, m64, v64, t)
    err = float(np.abs(runs[0] - want).max() / np.abs(want).max())
    return {"steps_in_place": {"passed": err <= 1e-6 and runs[0].tobytes() == runs[1].tobytes(),
                               "max_rel_err": err}}


SPECS = (
    KernelSpec(op=Adam, method="step", space=SPACE, template_keys=(),
               tensors={"param": Tensor(("N",)), "grad": Tensor(("N",)), "m": Tensor(("N",)),
                        "v": Tensor(("N",), draw=draw_second_moment),
                        "param_out": Tensor(("N",)), "m_out": Tensor(("N",)),
                        "v_out": Tensor(("N",))},
               reads=("param", "grad", "m", "v"), writes=("param_out", "m_out", "v_out"),
               reference=functools.partial(ref.adam_step, t=_T),
               peer=functools.partial(torch_step, t=_T), oracles=oracles,
               call_kwargs={"t": _T},
               # the FRD head's parameters at the suite template, and a whole model's
               suite=({"N": 128 * 128}, {"N": 1 << 20}),
               grid=(({}, {"N": 1}), ({}, {"N": 7}), ({}, {"N": 1000}), ({}, {"N": 100003}))),
)
