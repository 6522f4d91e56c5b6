"""Per-horizon attention pool (cu/per_horizon_attention_pool.cu): N_HORIZONS learned queries
attend over a layer-normed sequence ln[B, K, HIDDEN_DIM]."""
from __future__ import annotations

import math
from typing import Any, Mapping

import numpy as np

from .arrays import as_device, check_aligned, empty
from .op import Op
from .reduce import reducer
from .space import KernelSpace

# Per-lane register rows: q (and acc, or grad_ctx/q/grad_q in the backward) for every horizon
# plus UNROLL rows of ln in flight; beyond this budget ptxas spills.
_ROW = "((HIDDEN_DIM + 32 * VEC - 1) // (32 * VEC) * VEC)"
# BLOCK stops at 512: at 1024 threads the 64-register cap spills the register rows.
_COMMON = {"BLOCK": (32, 64, 128, 256, 512), "VEC": (1, 2, 4), "UNROLL": (1, 2, 4)}


def _nwarps(p: Mapping[str, Any]) -> int:
    return p["BLOCK"] // 32


def forward_shared_bytes(p: Mapping[str, Any], env: Mapping[str, Any]) -> int:
    h, d, k = env["N_HORIZONS"], env["HIDDEN_DIM"], env["K"]
    return 4 * (h * k + 2 * _nwarps(p) * h + _nwarps(p) * h * d + 2 * h)


def backward_shared_bytes(p: Mapping[str, Any], env: Mapping[str, Any]) -> int:
    h, d, k = env["N_HORIZONS"], env["HIDDEN_DIM"], env["K"]
    return 4 * (2 * h * k + h + _nwarps(p) * h * d)


_LAUNCH = ("SHARED_BYTES <= MAX_SHARED_BYTES",)

FORWARD_SPACE = KernelSpace(
    kernel="pool.forward", params=_COMMON,
    default={"BLOCK": 128, "VEC": 4, "UNROLL": 2},
    restrictions=("HIDDEN_DIM % VEC == 0", f"(2 * N_HORIZONS + UNROLL) * {_ROW} <= 128"),
    launch_restrictions=_LAUNCH, shared_bytes=forward_shared_bytes)

BACKWARD_SPACE = KernelSpace(
    kernel="pool.backward", params=_COMMON,
    default={"BLOCK": 128, "VEC": 4, "UNROLL": 1},
    restrictions=("HIDDEN_DIM % VEC == 0", f"(3 * N_HORIZONS + UNROLL) * {_ROW} <= 128"),
    launch_restrictions=_LAUNCH, shared_bytes=backward_shared_bytes)


class PerHorizonAttentionPool(Op):
    """ctx, attn = pool.forward(q_h, ln); grad_q_h, grad_ln = pool.backward(q_h, ln, attn, grad_ctx).

    ``launch={"forward": {...}, "backward": {...}}`` overrides the tuned or default launch
    parameters; ``chosen`` tells which were used by the last call and where they came from.
    """

    FAMILY = "per_horizon_attention_pool"
    SPACES = {"forward": FORWARD_SPACE, "backward": BACKWARD_SPACE}
    ENTRIES = {"forward": ("pool_forward", "PPPPif"), "backward": ("pool_backward", "PPPPPPPif")}

    def __init__(self, n_horizons: int, hidden_dim: int,
                 launch: Mapping[str, Mapping[str, Any]] | None = None):
        super().__init__({"N_HORIZONS": n_horizons, "HIDDEN_DIM": hidden_dim}, launch)
        self.n_horizons, self.hidden_dim = n_horizons, hidden_dim
        self.scale = 1.0 / math.sqrt(hidden_dim)

    def _dims(self) -> dict[str, int]:
        return {"H": self.n_horizons, "D": self.hidden_dim}

    def forward(self, q_h: Any, ln: Any) -> tuple[Any, Any]:
        """ctx[B, H, D] and attn[B, H, K] as GPUArrays."""
        dims = self._dims()
        ln = as_device(ln, "ln", ("B", "K", "D"), dims)
        q_h = as_device(q_h, "q_h", ("H", "D"), dims)
        b, k, h, d = dims["B"], dims["K"], dims["H"], dims["D"]
        params = self.launch_params("forward", {"B": b, "K": k})
        check_aligned(params["VEC"], q_h=q_h, ln=ln)
        ctx, attn = empty((b, h, d)), empty((b, h, k))
        self.kernel("forward", params)(
            (b, 1, 1), (params["BLOCK"], 1, 1), q_h.gpudata, ln.gpudata, ctx.gpudata,
            attn.gpudata, np.int32(k), np.float32(self.scale),
            shared=forward_shared_bytes(params, {**self.template, "K": k}))
        return ctx, attn

    def backward(self, q_h: Any, ln: Any, attn: Any, grad_ctx: Any, *,
                 grad_attn: Any = None) -> tuple[Any, Any]:
        """grad_q_h[H, D] and grad_ln[B, K, D]; grad_attn[B, H, K] is optional (zero)."""
        dims = self._dims()
        ln = as_device(ln, "ln", ("B", "K", "D"), dims)
        q_h = as_device(q_h, "q_h", ("H", "D"), dims)
        attn = as_device(attn, "attn", ("B", "H", "K"), dims)
        grad_ctx = as_device(grad_ctx, "grad_ctx", ("B", "H", "D"), dims)
        if grad_attn is not None:
            grad_attn = as_device(grad_attn, "grad_attn", ("B", "H", "K"), dims)
        b, k, h, d = dims["B"], dims["K"], dims["H"], dims["D"]
        params = self.launch_params("backward", {"B": b, "K": k})
        check_aligned(params["VEC"], q_h=q_h, ln=ln, grad_ctx=grad_ctx)
        grad_ln, scratch = empty((b, k, d)), empty((b, h * d))
        self.kernel("backward", params)(
            (b, 1, 1), (params["BLOCK"], 1, 1), q_h.gpudata, ln.gpudata, attn.gpudata,
            grad_ctx.gpudata, np.intp(0) if grad_attn is None else grad_attn.gpudata,
            grad_ln.gpudata, scratch.gpudata, np.int32(k), np.float32(self.scale),
            shared=backward_shared_bytes(params, {**self.template, "K": k}))
        return reducer().sum_rows(scratch, b, h * d).reshape(h, d), grad_ln

