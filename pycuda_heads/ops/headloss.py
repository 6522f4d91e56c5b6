"""The training loss of the multi-horizon head (cu/headloss.cu): the mean square error of the
gated output against its target plus ``frd_weight`` times the FRD cross-entropy,

    loss = mean_{b,h} (out - y)^2 + frd_weight * sum(ce) / B,

and the gradients it sends back: grad_out = 2 (out - y) / (B H) to the gate and
frd_weight * grad_logits to the FRD head. One kernel, plus one reduce_axis0 of the blocks' loss
partials when there is more than one block; the loss stays on the device (a [1] array)."""
from __future__ import annotations

from typing import Any, Callable, Mapping

import numpy as np

from .. import reference as ref
from ..core.arrays import Inputs, empty, empty_parts
from ..core.op import Op
from ..core.space import KernelSpace, by_role
from ..core.spec import KernelSpec, Tensor
from .reduce import reducer

#: the FRD loss's weight in the smoke model
FRD_WEIGHT = 0.5

SPACE = KernelSpace(
    kernel="headloss.grad",
    params={"BLOCK": (64, 128, 256, 512), "ROWS": (8, 32, 128, 512)},
    default={"BLOCK": 256, "ROWS": 32},
)

INPUTS = Inputs(out=("B", "H"), y=("B", "H"), ce=("B", "H"), grad_logits=("B", "H", "A"))


class HeadLoss(Op):
    """grad_out, grad_logits_w, loss = headloss.grad(out, y, ce, grad_logits)."""

    FAMILY = "headloss"
    SPACES = by_role(SPACE)
    PDL = True

    def __init__(self, n_horizons: int, n_atoms: int = 21, frd_weight: float = FRD_WEIGHT,
                 launch: Mapping[str, Mapping[str, Any]] | None = None):
        super().__init__({"N_HORIZONS": n_horizons, "N_ATOMS": n_atoms}, launch)
        self.n_horizons, self.n_atoms, self.frd_weight = n_horizons, n_atoms, frd_weight
        self.bound = {"H": n_horizons, "A": n_atoms}

    def grad(self, out: Any, y: Any, ce: Any, grad_logits: Any, *,
             stream: Any = None) -> tuple[Any, Any, Any]:
        """grad_out[B, H], grad_logits_w[B, H, A] and the loss [1] as GPUArrays (``ce`` and
        ``grad_logits`` are ``FrdSoftmaxCE``'s raw per-row loss and its gradient)."""
        (out, y, ce, grad_logits), dims = INPUTS.adapt(self._checked, self.bound,
                                                       out, y, ce, grad_logits)
        b, h = dims["B"], self.n_horizons
        plan = self.plan("grad", {"B": b}, lambda p: (
            (-(-b // p["ROWS"]), 1, 1), (p["BLOCK"], 1, 1), 0))
        blocks = plan.grid[0]
        grad_out, partial = empty_parts((b, h), (blocks,))
        grad_logits_w = empty((b, h, self.n_atoms))
        # Python floats: packed as float32 (2 / (B H) rounded once, as a float32 scale would be)
        plan.kernel(plan.grid, plan.block, out=out.gpudata, y=y.gpudata, ce=ce.gpudata,
                    grad_logits=grad_logits.gpudata, grad_out=grad_out.gpudata,
                    grad_logits_w=grad_logits_w.gpudata, partial=partial.gpudata, B=b,
                    grad_scale=2 / (b * h), frd_weight=self.frd_weight, inv_bh=1 / (b * h),
                    weight_over_b=self.frd_weight / b, stream=stream)
        loss = partial if blocks == 1 else reducer().sum_rows(partial, blocks, 1, stream)
        return grad_out, grad_logits_w, loss


def reference(out: np.ndarray, y: np.ndarray, ce: np.ndarray, grad_logits: np.ndarray,
              frd_weight: float = FRD_WEIGHT,
              dtype: type = np.float64) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """grad_out, grad_logits_w and the loss [1] in ``dtype``."""
    out, y, ce, grad_logits = (np.asarray(x, dtype) for x in (out, y, ce, grad_logits))
    b, h = out.shape
    d = out - y
    loss = np.mean(d * d) + frd_weight * ce.sum() / b
    return d * (2 / (b * h)), frd_weight * grad_logits, np.array([loss], dtype)


def torch_grad(torch: Any, out: Any, y: Any, ce: Any, grad_logits: Any) -> tuple[Any, Any, Any]:
    b, h = out.shape
    d = out - y
    loss = (d * d).mean() + FRD_WEIGHT * ce.sum() / b
    return d * (2 / (b * h)), FRD_WEIGHT * grad_logits, loss.reshape(1)


def oracles(make_op: Callable[[Mapping[str, int]], Any], template: Mapping[str, int]) -> dict:
    """Central differences of the loss in 8 entries of ``out`` (a quadratic: exact up to float32
    rounding) against grad_out, at B=3 and at B=700 (several blocks through the reduce)."""
    h, a = template["N_HORIZONS"], template["N_ATOMS"]
    rng = np.random.default_rng(2035)
    loss_op, worst = make_op(template), 0.0
    for b in (3, 700):
        x = {"out": rng.standard_normal((b, h), dtype=np.float32),
             "y": rng.standard_normal((b, h), dtype=np.float32),
             "ce": rng.random((b, h), dtype=np.float32),
             "grad_logits": rng.standard_normal((b, h, a), dtype=np.float32)}
        grad_out = loss_op.grad(**x)[0].get()

        def loss(out: np.ndarray, x: dict = x) -> float:
            return float(loss_op.grad(out, x["y"], x["ce"], x["grad_logits"])[2].get()[0])

        eps = 1e-2 * b * h / 15  # moves the loss by about as much at either B
        for i, j in ref.random_indices(rng, (b, h), 8):
            plus, minus = x["out"].copy(), x["out"].copy()
            plus[i, j] += np.float32(eps)
            minus[i, j] -= np.float32(eps)
            num = (loss(plus) - loss(minus)) / (float(plus[i, j]) - float(minus[i, j]))
            worst = max(worst, abs(num - float(grad_out[i, j])) / abs(float(grad_out[i, j])))
    return {"loss_numgrad": {"passed": worst <= 2e-2, "max_rel_err": worst}}


SPECS = (
    KernelSpec(op=HeadLoss, method="grad", space=SPACE, template_keys=("N_HORIZONS", "N_ATOMS"),
               tensors={"out": Tensor(("B", "H")), "y": Tensor(("B", "H")),
                        "ce": Tensor(("B", "H")), "grad_logits": Tensor(("B", "H", "A")),
                        "grad_out": Tensor(("B", "H")), "grad_logits_w": Tensor(("B", "H", "A")),
                        "loss": Tensor(("L",))},
               reads=("out", "y", "ce", "grad_logits"),
               writes=("grad_out", "grad_logits_w", "loss"), reference=reference,
               peer=torch_grad, oracles=oracles, bench_pass="fwd+bwd",
               suite=({"B": 2, "L": 1}, {"B": 256, "L": 1}, {"B": 4096, "L": 1}),
               grid=(({}, {"B": 1, "L": 1}), ({}, {"B": 33, "L": 1}),
                     ({}, {"B": 1000, "L": 1}), ({"N_HORIZONS": 1, "N_ATOMS": 11},
                                                 {"B": 70, "L": 1}))),
)
