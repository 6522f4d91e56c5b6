"""The learnable gate (cu/gate.cu): out = head + tanh(alpha) * residual, alpha init 0 so a
closed gate leaves the existing head bit-identical."""
from __future__ import annotations

from typing import Any, Callable, Mapping

import numpy as np

from .. import reference as ref
from ..core.arrays import as_device, empty
from ..core.op import Op
from ..core.space import KernelSpace, by_role
from ..core.spec import KernelSpec, Tensor, uniform2
from .reduce import reducer

_POW2 = (32, 64, 128, 256, 512, 1024)

FORWARD_SPACE = KernelSpace(
    kernel="gate.forward",
    params={"BLOCK": _POW2[1:], "ITEMS": (1, 2, 4, 8)},
    default={"BLOCK": 256, "ITEMS": 1},
)

BACKWARD_SPACE = KernelSpace(
    kernel="gate.backward",
    params={"BLOCK": _POW2, "ROWS": (256, 1024, 4096, 16384)},
    default={"BLOCK": 256, "ROWS": 1024},
    restrictions=("N_HORIZONS * BLOCK * 4 <= 48 * 1024", "ROWS >= BLOCK"),
)


class AlphaGate(Op):
    """out = gate.forward(head, residual, alpha);
    grad_head, grad_residual, grad_alpha = gate.backward(residual, alpha, grad_out)."""

    FAMILY = "gate"
    SPACES = by_role(FORWARD_SPACE, BACKWARD_SPACE)

    def __init__(self, n_horizons: int, launch: Mapping[str, Mapping[str, Any]] | None = None):
        super().__init__({"N_HORIZONS": n_horizons}, launch)
        self.n_horizons = n_horizons

    def forward(self, head: Any, residual: Any, alpha: Any, *, stream: Any = None) -> Any:
        """out[B, H] as a GPUArray."""
        dims = {"H": self.n_horizons}
        head = as_device(head, "head", ("B", "H"), dims)
        residual = as_device(residual, "residual", ("B", "H"), dims)
        alpha = as_device(alpha, "alpha", ("H",), dims)
        n = dims["B"] * self.n_horizons
        plan = self.plan("forward", {"B": dims["B"]}, lambda p: (
            (-(-n // (p["BLOCK"] * p["ITEMS"])), 1, 1), (p["BLOCK"], 1, 1), 0))
        out = empty((dims["B"], self.n_horizons))
        plan.kernel(plan.grid, plan.block, head=head.gpudata, residual=residual.gpudata,
                    alpha=alpha.gpudata, out=out.gpudata, n=n, stream=stream)
        return out

    def backward(self, residual: Any, alpha: Any, grad_out: Any, *,
                 stream: Any = None) -> tuple[Any, Any, Any]:
        """grad_head[B, H] (grad_out itself: the gate passes it through unchanged),
        grad_residual[B, H] and grad_alpha[H]."""
        dims = {"H": self.n_horizons}
        residual = as_device(residual, "residual", ("B", "H"), dims)
        alpha = as_device(alpha, "alpha", ("H",), dims)
        grad_out = as_device(grad_out, "grad_out", ("B", "H"), dims)
        b, h = dims["B"], self.n_horizons
        plan = self.plan("backward", {"B": b}, lambda p: (
            (-(-b // p["ROWS"]), 1, 1), (p["BLOCK"], 1, 1), 0))
        blocks = plan.grid[0]
        grad_residual, scratch = empty((b, h)), empty((blocks, h))
        plan.kernel(plan.grid, plan.block, residual=residual.gpudata, alpha=alpha.gpudata,
                    grad_out=grad_out.gpudata, grad_residual=grad_residual.gpudata,
                    ga_scratch=scratch.gpudata, B=b, stream=stream)
        return grad_out, grad_residual, reducer().sum_rows(scratch, blocks, h, stream)


def torch_forward(torch: Any, head: Any, residual: Any, alpha: Any) -> Any:
    return head + torch.tanh(alpha) * residual


def torch_backward(torch: Any, residual: Any, alpha: Any, grad_out: Any) -> tuple[Any, ...]:
    t = torch.tanh(alpha)
    return grad_out, t * grad_out, (1 - t * t) * (grad_out * residual).sum(dim=0)


def oracles(make_op: Callable[[Mapping[str, int]], Any], template: Mapping[str, int]) -> dict:
    """A closed gate (alpha = 0) returns the head bitwise; central differences of the forward
    match grad_head, grad_residual and grad_alpha for alpha in [-2, 2]."""
    h, b = template["N_HORIZONS"], 64
    rng = np.random.default_rng(2026)
    x = {"head": rng.standard_normal((b, h), dtype=np.float32),
         "residual": rng.standard_normal((b, h), dtype=np.float32),
         "alpha": rng.uniform(-2, 2, h).astype(np.float32)}
    g = rng.standard_normal((b, h), dtype=np.float32)
    gate = make_op(template)
    closed = gate.forward(x["head"], x["residual"], np.zeros(h, np.float32)).get()

    def loss() -> float:
        out = gate.forward(x["head"], x["residual"], x["alpha"]).get().astype(np.float64)
        return float((g * out).sum())

    gh, gr, ga = (a.get() for a in gate.backward(x["residual"], x["alpha"], g))
    probes = {"head": ref.random_indices(rng, (b, h), 8),
              "residual": ref.random_indices(rng, (b, h), 8), "alpha": [(i,) for i in range(h)]}
    return {"closed_gate_bitwise": {"passed": closed.tobytes() == x["head"].tobytes()},
            "parity_numgrad": ref.central_differences(
                loss, x, {"head": gh, "residual": gr, "alpha": ga}, probes)}


TENSORS = {"head": Tensor(("B", "H")), "residual": Tensor(("B", "H")),
           "alpha": Tensor(("H",), draw=uniform2), "grad_out": Tensor(("B", "H")),
           "out": Tensor(("B", "H")), "grad_head": Tensor(("B", "H")),
           "grad_residual": Tensor(("B", "H")), "grad_alpha": Tensor(("H",))}
SUITE = ({"B": 3}, {"B": 4096}, {"B": 65536})
_COMMON_SPEC = dict(op=AlphaGate, template_keys=("N_HORIZONS",), tensors=TENSORS, suite=SUITE,
                    oracles=oracles)

SPECS = (
    KernelSpec(method="forward", space=FORWARD_SPACE,
               reads=("head", "residual", "alpha"), writes=("out",),
               reference=ref.gate_forward, peer=torch_forward,
               grid=(({}, {"B": 1}), ({}, {"B": 1000}), ({"N_HORIZONS": 1}, {"B": 7})),
               **_COMMON_SPEC),
    # grad_head is grad_out itself: the gate passes it through unchanged.
    KernelSpec(method="backward", space=BACKWARD_SPACE,
               reads=("residual", "alpha", "grad_out"),
               writes=("grad_head", "grad_residual", "grad_alpha"),
               passthrough={"grad_head": "grad_out"}, reference=ref.gate_backward,
               peer=torch_backward,
               grid=(({}, {"B": 1}), ({}, {"B": 1000}), ({"N_HORIZONS": 1}, {"B": 7}),
                     ({}, {"B": 100000})),
               **_COMMON_SPEC),
)
