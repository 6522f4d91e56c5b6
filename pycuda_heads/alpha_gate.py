"""The learnable gate (cu/alpha_gate.cu): out = head + tanh(alpha) * residual, alpha init 0 so a
closed gate leaves the existing head bit-identical."""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from .arrays import as_device, empty
from .op import Op
from .reduce import reducer
from .space import KernelSpace

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

    FAMILY = "alpha_gate"
    SPACES = {"forward": FORWARD_SPACE, "backward": BACKWARD_SPACE}
    ENTRIES = {"forward": ("gate_forward", "PPPPi"), "backward": ("gate_backward", "PPPPPi")}

    def __init__(self, n_horizons: int, launch: Mapping[str, Mapping[str, Any]] | None = None):
        super().__init__({"N_HORIZONS": n_horizons}, launch)
        self.n_horizons = n_horizons

    def forward(self, head: Any, residual: Any, alpha: Any) -> Any:
        """out[B, H] as a GPUArray."""
        dims = {"H": self.n_horizons}
        head = as_device(head, "head", ("B", "H"), dims)
        residual = as_device(residual, "residual", ("B", "H"), dims)
        alpha = as_device(alpha, "alpha", ("H",), dims)
        n = dims["B"] * self.n_horizons
        params = self.launch_params("forward", {"B": dims["B"]})
        out = empty((dims["B"], self.n_horizons))
        per_block = params["BLOCK"] * params["ITEMS"]
        self.kernel("forward", params)(
            (-(-n // per_block), 1, 1), (params["BLOCK"], 1, 1), head.gpudata,
            residual.gpudata, alpha.gpudata, out.gpudata, np.int32(n))
        return out

    def backward(self, residual: Any, alpha: Any, grad_out: Any) -> tuple[Any, Any, Any]:
        """grad_head[B, H] (grad_out itself: the gate passes it through unchanged),
        grad_residual[B, H] and grad_alpha[H]."""
        dims = {"H": self.n_horizons}
        residual = as_device(residual, "residual", ("B", "H"), dims)
        alpha = as_device(alpha, "alpha", ("H",), dims)
        grad_out = as_device(grad_out, "grad_out", ("B", "H"), dims)
        b, h = dims["B"], self.n_horizons
        params = self.launch_params("backward", {"B": b})
        blocks = -(-b // params["ROWS"])
        grad_residual, scratch = empty((b, h)), empty((blocks, h))
        self.kernel("backward", params)(
            (blocks, 1, 1), (params["BLOCK"], 1, 1), residual.gpudata, alpha.gpudata,
            grad_out.gpudata, grad_residual.gpudata, scratch.gpudata, np.int32(b))
        return grad_out, grad_residual, reducer().sum_rows(scratch, blocks, h)
