"""PyTorch peers of every op: the math of ``pycuda_heads.reference`` (DESIGN.md section 1) in
plain torch ops, as a PyTorch user would write it, run eagerly or through ``torch.compile``.

Only the bench imports this module, and only where torch is installed: the library itself never
needs torch. The functions take the library's arguments in the library's order (see
``bench.PRIMITIVES``) and return its outputs in its order.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import torch

CE_FLOOR = 1e-30


def pool_forward(q_h: torch.Tensor, ln: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    scale = 1.0 / math.sqrt(q_h.shape[1])
    attn = torch.softmax(scale * torch.matmul(q_h, ln.transpose(1, 2)), dim=-1)  # [B, H, K]
    return torch.matmul(attn, ln), attn


def pool_backward(q_h: torch.Tensor, ln: torch.Tensor, attn: torch.Tensor,
                  grad_ctx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    scale = 1.0 / math.sqrt(q_h.shape[1])
    dw = torch.matmul(grad_ctx, ln.transpose(1, 2))  # [B, H, K]
    ds = attn * (dw - (attn * dw).sum(dim=-1, keepdim=True))
    grad_q_h = scale * torch.einsum("bhk,bkd->hd", ds, ln)
    grad_ln = (torch.matmul(attn.transpose(1, 2), grad_ctx)
               + scale * torch.matmul(ds.transpose(1, 2), q_h))
    return grad_q_h, grad_ln


def residual_forward(ctx: torch.Tensor, w_res: torch.Tensor,
                     bias_res: torch.Tensor) -> torch.Tensor:
    return torch.einsum("bhd,hd->bh", ctx, w_res) + bias_res


def residual_backward(ctx: torch.Tensor, w_res: torch.Tensor,
                      grad_residual: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return (torch.einsum("bh,bhd->hd", grad_residual, ctx), grad_residual.sum(dim=0),
            grad_residual.unsqueeze(-1) * w_res)


def gate_forward(head: torch.Tensor, residual: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
    return head + torch.tanh(alpha) * residual


def gate_backward(residual: torch.Tensor, alpha: torch.Tensor,
                  grad_out: torch.Tensor) -> tuple[torch.Tensor, ...]:
    t = torch.tanh(alpha)
    return grad_out, t * grad_out, (1 - t * t) * (grad_out * residual).sum(dim=0)


def frd_softmax_ce_grad(logits: torch.Tensor,
                        labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # Rows flattened to [B*H, A]: the 3-d cross-entropy path of torch takes atomics (DESIGN.md 8).
    b, h, a = logits.shape
    flat, lab = logits.reshape(b * h, a), labels.reshape(b * h).long()
    live = lab >= 0
    safe = lab.clamp_min(0)
    p = torch.softmax(flat, dim=-1)
    p_label = p.gather(1, safe.unsqueeze(1)).squeeze(1)
    ce = torch.where(live, -torch.log(p_label.clamp_min(CE_FLOOR)), 0.0)
    onehot = torch.nn.functional.one_hot(safe, a).to(p.dtype)
    grad = torch.where(live.unsqueeze(1), (p - onehot) / b, 0.0)
    return grad.reshape(b, h, a), ce.reshape(b, h)


FUNCTIONS: dict[tuple[str, str], Callable[..., Any]] = {
    ("pool", "forward"): pool_forward, ("pool", "backward"): pool_backward,
    ("residual", "forward"): residual_forward, ("residual", "backward"): residual_backward,
    ("gate", "forward"): gate_forward, ("gate", "backward"): gate_backward,
    ("frd", "fwd+bwd"): frd_softmax_ce_grad,
}


def prepare(device: str) -> None:
    """Set torch up to be timed beside the library on ``device``."""
    torch.set_float32_matmul_precision("highest")  # float32 like the library: no TF32
    if device == "cuda":
        torch.cuda.init()
        # The bench's events and spin kernel are on the legacy default stream; torch must
        # launch there too or the events would not bracket its kernels.
        handle = torch.cuda.current_stream().cuda_stream
        if handle != 0:
            raise RuntimeError(f"torch's current CUDA stream is {handle:#x}, not the legacy "
                               f"default stream the bench times on")


def reset() -> None:
    """Forget compiled graphs, so each shape compiles afresh under no recompile limit."""
    torch._dynamo.reset()


def compiled(fn: Callable[..., Any]) -> Callable[..., Any]:
    return torch.compile(fn, dynamic=False)


def to_torch(x: Mapping[str, np.ndarray], device: str) -> dict[str, torch.Tensor]:
    return {name: torch.from_numpy(a).to(device) for name, a in x.items()}


def _as_tensor(arr: Any, device: torch.device) -> torch.Tensor:
    """A library output (a GPUArray, read in place through __cuda_array_interface__, or a
    host array) as a tensor on ``device``."""
    if isinstance(arr, torch.Tensor):
        return arr
    if hasattr(arr, "__cuda_array_interface__"):
        return torch.as_tensor(arr, device=device)
    return torch.as_tensor(np.asarray(arr), device=device)


def max_rel_err(library: Sequence[Any], peer: Sequence[torch.Tensor]) -> float:
    """Largest ||peer - library|| / ||library|| over the outputs of one call."""
    if len(library) != len(peer):
        raise ValueError(f"the library returned {len(library)} outputs, the peer {len(peer)}")
    worst = 0.0
    for lib, ref in zip(library, peer):
        got = _as_tensor(lib, ref.device).double()
        want = ref.double()
        if got.shape != want.shape:
            raise ValueError(f"output shapes differ: library {tuple(got.shape)}, "
                             f"peer {tuple(want.shape)}")
        scale = max(float(torch.linalg.vector_norm(got)), 1e-30)
        worst = max(worst, float(torch.linalg.vector_norm(want - got)) / scale)
    return worst
