"""nn.Modules over the operators, in PyTorch's conventions: ``device=`` and ``dtype=`` factory
arguments, ``reset_parameters()``, parameters as the whole ``state_dict``.

Names against the core API: ``AttentionPool`` runs ``ops.pool.PerHorizonAttentionPool``,
``ResidualGate`` ``ops.resgate.ResidualGate``, ``FrdHead`` ``ops.frdhead.FrdHead`` and
``FrdLoss`` ``ops.frd.FrdSoftmaxCE``; their tensors keep the core's names (q_h, w_res, bias_res,
alpha, w1, b1, w2, b2). A forward reads its parameters from ``_parameters`` itself: ``self.w1``
goes through ``Module.__getattr__``, a Python call per parameter per step."""
from __future__ import annotations

import math
from typing import Any, Mapping

import torch
from torch import Tensor

from ..ops.frd import FrdSoftmaxCE
from ..ops.frdhead import FrdHead as FrdHeadOp
from ..ops.frdsmall import FrdHeadSmall
from ..ops.pool import PerHorizonAttentionPool
from ..ops.resgate import ResidualGate as ResidualGateOp
from ..step import frd_head
from .ops import (
    configured,
    frd_loss,
    frdhead_forward,
    frdhead_loss,
    pool_forward,
    resgate_forward,
)

Launch = Mapping[str, Mapping[str, Any]] | None


def _factory(device: Any, dtype: Any) -> dict[str, Any]:
    """The factory arguments of the parameters: float32 (the kernels' only dtype) on
    ``device``, by default the current CUDA device."""
    if dtype is not None and dtype != torch.float32:
        raise TypeError(f"dtype: the kernels run float32 only, got {dtype}")
    if device is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return {"device": torch.device(device), "dtype": torch.float32}


class AttentionPool(torch.nn.Module):
    """N_HORIZONS learned queries attending over ln [B, K, D]: forward(ln) -> (ctx [B, H, D],
    attn [B, H, K])."""

    def __init__(self, n_horizons: int, hidden_dim: int, launch: Launch = None, *,
                 device: Any = None, dtype: Any = None) -> None:
        super().__init__()
        factory = _factory(device, dtype)
        self.n_horizons, self.hidden_dim = n_horizons, hidden_dim
        self.op, self.op_id = configured(PerHorizonAttentionPool, n_horizons, hidden_dim,
                                         launch=launch)
        self.q_h = torch.nn.Parameter(torch.empty(n_horizons, hidden_dim, **factory))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        with torch.no_grad():
            self.q_h.normal_(0.0, 1.0 / math.sqrt(self.hidden_dim))

    def forward(self, ln: Tensor) -> tuple[Tensor, Tensor]:
        return pool_forward(self._parameters["q_h"], ln, self.op_id)

    def extra_repr(self) -> str:
        return f"n_horizons={self.n_horizons}, hidden_dim={self.hidden_dim}"


class ResidualGate(torch.nn.Module):
    """head + tanh(alpha) * (per-horizon projection of ctx + bias): forward(ctx [B, H, D],
    head [B, H]) -> [B, H]. alpha starts at 0, so the module returns the head unchanged until
    training opens the gate."""

    def __init__(self, n_horizons: int, hidden_dim: int, launch: Launch = None, *,
                 device: Any = None, dtype: Any = None) -> None:
        super().__init__()
        factory = _factory(device, dtype)
        self.n_horizons, self.hidden_dim = n_horizons, hidden_dim
        self.op, self.op_id = configured(ResidualGateOp, n_horizons, hidden_dim, launch=launch)
        self.w_res = torch.nn.Parameter(torch.empty(n_horizons, hidden_dim, **factory))
        self.bias_res = torch.nn.Parameter(torch.empty(n_horizons, **factory))
        self.alpha = torch.nn.Parameter(torch.empty(n_horizons, **factory))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        with torch.no_grad():
            self.w_res.normal_(0.0, 1.0 / math.sqrt(self.hidden_dim))
            self.bias_res.zero_()
            self.alpha.zero_()

    def forward(self, ctx: Tensor, head: Tensor) -> Tensor:
        p = self._parameters
        out, _ = resgate_forward(ctx, p["w_res"], p["bias_res"], head, p["alpha"], self.op_id)
        return out

    def extra_repr(self) -> str:
        return f"n_horizons={self.n_horizons}, hidden_dim={self.hidden_dim}"


def _class_indices(labels: Any) -> Tensor:
    """FRD labels as the kernels take them: int32 class indices (int64 converted)."""
    if not isinstance(labels, Tensor) or labels.dtype not in (torch.int32, torch.int64):
        got = labels.dtype if isinstance(labels, Tensor) else type(labels).__name__
        raise TypeError(f"labels: expected int32 or int64 class indices (they take no "
                        f"gradient), got {got}"
                        + (" that requires grad" if getattr(labels, "requires_grad", False)
                           else ""))
    return labels.to(torch.int32) if labels.dtype == torch.int64 else labels


class FrdLoss(torch.nn.Module):
    """Mean over the batch of the FRD cross-entropy: forward(logits [B, H, A], labels [B, H])
    -> scalar. Labels are class indices (int32, or int64, converted) in [-1, N_ATOMS); -1 marks
    a horizon not realised yet, which adds nothing. A label outside that range makes the loss
    NaN (no check reads the labels back: that would synchronise every step)."""

    def __init__(self, n_horizons: int, n_atoms: int = 21, launch: Launch = None) -> None:
        super().__init__()
        self.n_horizons, self.n_atoms = n_horizons, n_atoms
        self.op, self.op_id = configured(FrdSoftmaxCE, n_horizons, n_atoms, launch=launch)

    def forward(self, logits: Tensor, labels: Tensor) -> Tensor:
        return frd_loss(logits, _class_indices(labels), self.op_id)

    def extra_repr(self) -> str:
        return f"n_horizons={self.n_horizons}, n_atoms={self.n_atoms}"


class FrdHead(torch.nn.Module):
    """The FRD MLP head: forward(h_t [B, D_in]) -> logits [B, N_HORIZONS, N_ATOMS], through
    one ReLU hidden layer of ``hidden`` units; pair it with ``FrdLoss``.

    A batch runs the op ``pycuda_heads.step.frd_head`` names for it, as ``TrainStep`` does:
    ``FrdHeadSmall``'s kernels at B <= ``step.SMALL_BATCH``, ``FrdHead``'s above. ``launch=``
    names ``FrdHead``'s kernels' parameters, so with it every batch runs ``FrdHead``."""

    def __init__(self, d_in: int, hidden: int, n_horizons: int, n_atoms: int = 21,
                 launch: Launch = None, *, device: Any = None, dtype: Any = None) -> None:
        super().__init__()
        factory = _factory(device, dtype)
        self.d_in, self.hidden, self.n_horizons, self.n_atoms = d_in, hidden, n_horizons, n_atoms
        self.op, self.op_id = configured(FrdHeadOp, d_in, hidden, n_horizons, n_atoms,
                                         launch=launch)
        self._small_id = (configured(FrdHeadSmall, d_in, hidden, n_horizons, n_atoms)[1]
                          if launch is None and frd_head(1, d_in, hidden) is FrdHeadSmall
                          else None)
        self.w1 = torch.nn.Parameter(torch.empty(hidden, d_in, **factory))
        self.b1 = torch.nn.Parameter(torch.empty(hidden, **factory))
        self.w2 = torch.nn.Parameter(torch.empty(n_horizons, n_atoms, hidden, **factory))
        self.b2 = torch.nn.Parameter(torch.empty(n_horizons, n_atoms, **factory))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        with torch.no_grad():
            self.w1.normal_(0.0, 1.0 / math.sqrt(self.d_in))
            self.b1.zero_()
            self.w2.normal_(0.0, 1.0 / math.sqrt(self.hidden))
            self.b2.zero_()

    def op_id_for(self, batch: int) -> int:
        """The id of the op a batch of ``batch`` rows runs (forward and backward)."""
        small = self._small_id is not None and \
            frd_head(batch, self.d_in, self.hidden) is FrdHeadSmall
        return self._small_id if small else self.op_id

    def forward(self, h_t: Tensor) -> Tensor:
        p = self._parameters
        _, logits = frdhead_forward(h_t, p["w1"], p["b1"], p["w2"], p["b2"],
                                    self.op_id_for(h_t.shape[0]))
        return logits

    def forward_loss(self, h_t: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
        """logits [B, N_HORIZONS, N_ATOMS] and ``FrdLoss``'s loss of them against ``labels``
        [B, N_HORIZONS] in one launch (the op's ``forward_loss``): the same values and
        gradients as ``FrdLoss()(head(h_t), labels)``, without the logits' trip through
        memory and a second kernel. Labels as ``FrdLoss`` takes them."""
        p = self._parameters
        return frdhead_loss(h_t, p["w1"], p["b1"], p["w2"], p["b2"], _class_indices(labels),
                            self.op_id_for(h_t.shape[0]))

    def extra_repr(self) -> str:
        return (f"d_in={self.d_in}, hidden={self.hidden}, n_horizons={self.n_horizons}, "
                f"n_atoms={self.n_atoms}")
