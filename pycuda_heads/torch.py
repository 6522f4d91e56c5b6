"""PyTorch integration: autograd Functions and nn.Modules over the library's kernels. The only
module of the runtime that imports torch (``import pycuda_heads.torch``).

Tensors are used in place (no copies) and must be on the device of PyCUDA's primary context
(a tensor on another device is refused, by name). Every output and scratch buffer is allocated
by torch's caching allocator, so torch's stream and CUDA-graph rules hold for them, and the
kernels run in the order of torch's current stream: directly on it when it is the default
stream, otherwise on a side stream joined to it by events before and after (the fork/join
pattern that ``torch.cuda.graph`` capture follows too).
"""
from __future__ import annotations

from contextlib import contextmanager, nullcontext
from functools import lru_cache
from typing import Any, Iterator

import numpy as np

try:
    import torch
except ImportError:  # one line for the user, not a chain of import frames
    raise ImportError('pycuda_heads.torch needs PyTorch: pip install "pycuda-heads[torch]"') \
        from None

from .core.arrays import memory_from, wrap
from .core.compile import capturing
from .core.device import cuda, thread_context
from .ops import resgate
from .ops.frd import FrdSoftmaxCE
from .ops.frdhead import FrdHead as FrdHeadOp
from .ops.pool import PerHorizonAttentionPool

_F32 = np.dtype(np.float32)
_I32 = np.dtype(np.int32)
_DTYPES = {torch.float32: _F32, torch.int32: _I32}
_CU_STREAM_NON_BLOCKING = 1  # the driver's flag; PyCUDA has no name for it


class _TorchMemory:
    """Hands out torch-allocated bytes to the library's ``empty``."""

    @staticmethod
    def allocate(nbytes: int) -> tuple[int, torch.Tensor]:
        # on the current device, which torch_order makes PyCUDA's
        t = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        return t.data_ptr(), t


@lru_cache(maxsize=None)
def _pycuda_device() -> int:
    """The index of the device PyCUDA's primary context is on, the one every kernel runs on.
    The driver numbers devices as the CUDA runtime (and so torch) does: both count the devices
    CUDA_VISIBLE_DEVICES leaves, in the order CUDA_DEVICE_ORDER sets."""
    drv = cuda()
    with thread_context():
        here = drv.Context.get_device()
    return next(i for i in range(drv.Device.count()) if drv.Device(i) == here)


def device_array(t: torch.Tensor, name: str) -> Any:
    """A CUDA tensor as a GPUArray over the same memory (the tensor kept alive by it)."""
    if not isinstance(t, torch.Tensor) or not t.is_cuda:
        raise TypeError(f"{name}: expected a CUDA tensor, got "
                        f"{type(t).__name__ if not isinstance(t, torch.Tensor) else t.device}")
    if t.device.index != _pycuda_device():
        raise ValueError(f"{name}: expected a tensor on cuda:{_pycuda_device()}, the device of "
                         f"PyCUDA's primary context that the kernels run on, got {t.device}")
    if t.dtype not in _DTYPES:
        raise TypeError(f"{name}: expected dtype float32 (int32 for labels), got {t.dtype}")
    if not t.is_contiguous():
        raise ValueError(f"{name}: expected a contiguous tensor, got strides {t.stride()}")
    return wrap(tuple(t.shape), _DTYPES[t.dtype], t.data_ptr(), t)


def device_arrays(**tensors: torch.Tensor) -> tuple[Any, ...]:
    """``device_array`` of each tensor, named by its keyword, in order."""
    return tuple(device_array(t, name) for name, t in tensors.items())


def as_tensor(arr: Any) -> torch.Tensor:
    """A library output as a tensor of its shape over the same memory: a slice of the torch
    bytes it was allocated in (``_TorchMemory``), or else through __cuda_array_interface__."""
    root = arr.base
    while root is not None and not isinstance(root, torch.Tensor):
        root = getattr(root, "base", None)  # a view of a view of torch's bytes
    if root is not None and root.dtype == torch.uint8:
        at = int(arr.gpudata) - root.data_ptr()
        return root[at: at + arr.nbytes].view(
            torch.float32 if arr.dtype == _F32 else torch.int32).view(arr.shape)
    # not torch's bytes: an op handing back an input
    return torch.as_tensor(arr, device=torch.device("cuda", _pycuda_device()))


@lru_cache(maxsize=None)
def _side_stream() -> tuple[Any, torch.cuda.ExternalStream]:
    """A PyCUDA stream for launches off torch's default stream, and torch's view of it (one:
    PyCUDA has one context, on ``_pycuda_device()``). Non-blocking: ordered only by the events
    that join it to torch's stream, never implicitly by the legacy default stream (which a graph
    capture forbids)."""
    stream = cuda().Stream(flags=_CU_STREAM_NON_BLOCKING)
    return stream, torch.cuda.ExternalStream(stream.handle, device=_pycuda_device())


@contextmanager
def torch_order() -> Iterator[Any]:
    """The PyCUDA stream to launch on (None: the default stream) so that the launches run in
    the order of torch's current stream on PyCUDA's device, with torch allocating every buffer
    there."""
    # backward passes run in torch's autograd threads, which PyCUDA has not seen
    with thread_context(), memory_from(_TorchMemory), torch.cuda.device(_pycuda_device()):
        current = torch.cuda.current_stream()
        graph_capture = torch.cuda.is_current_stream_capturing()
        if current.cuda_stream == 0 and not graph_capture:
            yield None
            return
        stream, external = _side_stream()
        external.wait_stream(current)
        # no synchronisation may break a capture in progress (PYCUDA_HEADS_SYNC=1 still
        # synchronises after each launch on a side stream that is not capturing)
        with capturing() if graph_capture else nullcontext():
            yield stream
        current.wait_stream(external)


class AttentionPoolFunction(torch.autograd.Function):
    """(q_h [H, D], ln [B, K, D]) -> (ctx [B, H, D], attn [B, H, K])."""

    @staticmethod
    def forward(ctx: Any, q_h: torch.Tensor, ln: torch.Tensor,
                op: PerHorizonAttentionPool) -> tuple[torch.Tensor, torch.Tensor]:
        with torch_order() as s:
            out, attn = op.forward(*device_arrays(q_h=q_h, ln=ln), stream=s)
        out, attn = as_tensor(out), as_tensor(attn)
        ctx.op = op
        # an output whose gradient is not needed (attn, usually) comes to backward as None
        # instead of a zero-filled tensor that torch would allocate and the kernel would read
        ctx.set_materialize_grads(False)
        # the pooled output too: given it, the backward kernel reads ln once fewer
        ctx.save_for_backward(q_h, ln, attn, out)
        return out, attn

    @staticmethod
    def backward(ctx: Any, grad_ctx: torch.Tensor | None,
                 grad_attn: torch.Tensor | None) -> tuple:
        if grad_ctx is None and grad_attn is None:
            return None, None, None
        q_h, ln, attn, out = ctx.saved_tensors
        if grad_ctx is None:  # only attn reaches the loss
            grad_ctx = torch.zeros_like(out)
        with torch_order() as s:
            grad_q_h, grad_ln = ctx.op.backward(
                *device_arrays(q_h=q_h, ln=ln, attn=attn, grad_ctx=grad_ctx.contiguous()),
                grad_attn=None if grad_attn is None else device_array(
                    grad_attn.contiguous(), "grad_attn"), ctx=device_array(out, "ctx"),
                stream=s)
        return as_tensor(grad_q_h), as_tensor(grad_ln), None


class ResidualGateFunction(torch.autograd.Function):
    """(ctx [B, H, D], w_res [H, D], bias_res [H], head [B, H], alpha [H]) ->
    out = head + tanh(alpha) * (sum_d ctx * w_res + bias_res)."""

    @staticmethod
    def forward(ctx: Any, c: torch.Tensor, w_res: torch.Tensor, bias_res: torch.Tensor,
                head: torch.Tensor, alpha: torch.Tensor, op: resgate.ResidualGate) -> torch.Tensor:
        with torch_order() as s:
            out, residual = op.forward(*device_arrays(ctx=c, w_res=w_res, bias_res=bias_res,
                                                      head=head, alpha=alpha), stream=s)
        ctx.op = op
        ctx.save_for_backward(c, w_res, alpha, as_tensor(residual))
        return as_tensor(out)

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple:
        c, w_res, alpha, residual = ctx.saved_tensors
        grad_out = grad_out.contiguous()
        with torch_order() as s:
            grad_w_res, grad_bias_res, grad_c, _, grad_alpha = ctx.op.backward(
                *device_arrays(ctx=c, w_res=w_res, alpha=alpha, residual=residual,
                               grad_out=grad_out), stream=s)
        return (as_tensor(grad_c), as_tensor(grad_w_res), as_tensor(grad_bias_res), grad_out,
                as_tensor(grad_alpha), None)


class FrdLossFunction(torch.autograd.Function):
    """(logits [B, H, A], labels [B, H] int32) -> sum of the per-row cross-entropies / B; rows
    labelled -1 add nothing. The gradient comes from the same fused kernel pass."""

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, labels: torch.Tensor,
                op: FrdSoftmaxCE) -> torch.Tensor:
        # Under graph capture the device label check cannot be read back; a bad label still
        # shows as a NaN loss.
        check = not torch.cuda.is_current_stream_capturing()
        with torch_order() as s:
            grad, ce = op.softmax_ce_grad(*device_arrays(logits=logits, labels=labels),
                                          check_labels=check, stream=s)
        ctx.save_for_backward(as_tensor(grad))
        return as_tensor(ce).sum() / logits.shape[0]

    @staticmethod
    def backward(ctx: Any, grad_loss: torch.Tensor) -> tuple:
        (grad,) = ctx.saved_tensors
        return grad * grad_loss, None, None


class FrdHeadFunction(torch.autograd.Function):
    """(h_t [B, D_in], w1 [F, D_in], b1 [F], w2 [H, A, F], b2 [H, A]) ->
    logits = ReLU(h_t w1^T + b1) w2^T + b2, [B, H, A]."""

    @staticmethod
    def forward(ctx: Any, h_t: torch.Tensor, w1: torch.Tensor, b1: torch.Tensor,
                w2: torch.Tensor, b2: torch.Tensor, op: FrdHeadOp) -> torch.Tensor:
        with torch_order() as s:
            hidden, logits = op.forward(*device_arrays(h_t=h_t, w1=w1, b1=b1, w2=w2, b2=b2),
                                        stream=s)
        ctx.op = op
        ctx.save_for_backward(h_t, w1, w2, as_tensor(hidden))
        return as_tensor(logits)

    @staticmethod
    def backward(ctx: Any, grad_logits: torch.Tensor) -> tuple:
        h_t, w1, w2, hidden = ctx.saved_tensors
        with torch_order() as s:
            gw1, gb1, gw2, gb2, gh = ctx.op.backward(
                *device_arrays(h_t=h_t, w1=w1, w2=w2, hidden=hidden,
                               grad_logits=grad_logits.contiguous()), stream=s)
        return (as_tensor(gh), as_tensor(gw1), as_tensor(gb1), as_tensor(gw2), as_tensor(gb2),
                None)


class AttentionPool(torch.nn.Module):
    """N_HORIZONS learned queries attending over ln [B, K, D]: forward(ln) -> (ctx, attn)."""

    def __init__(self, n_horizons: int, hidden_dim: int, launch: Any = None) -> None:
        super().__init__()
        self.op = PerHorizonAttentionPool(n_horizons, hidden_dim, launch=launch)
        self.q_h = torch.nn.Parameter(torch.randn(n_horizons, hidden_dim, device="cuda")
                                      / hidden_dim ** 0.5)

    def forward(self, ln: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return AttentionPoolFunction.apply(self.q_h, ln.contiguous(), self.op)


class ResidualGate(torch.nn.Module):
    """head + tanh(alpha) * (per-horizon projection of ctx + bias); alpha starts at 0, so the
    module returns the head unchanged until training opens the gate."""

    def __init__(self, n_horizons: int, hidden_dim: int, launch: Any = None) -> None:
        super().__init__()
        self.op = resgate.ResidualGate(n_horizons, hidden_dim, launch=launch)
        self.w_res = torch.nn.Parameter(torch.randn(n_horizons, hidden_dim, device="cuda")
                                        / hidden_dim ** 0.5)
        self.bias_res = torch.nn.Parameter(torch.zeros(n_horizons, device="cuda"))
        self.alpha = torch.nn.Parameter(torch.zeros(n_horizons, device="cuda"))

    def forward(self, ctx: torch.Tensor, head: torch.Tensor) -> torch.Tensor:
        return ResidualGateFunction.apply(ctx.contiguous(), self.w_res, self.bias_res,
                                          head.contiguous(), self.alpha, self.op)


class FrdLoss(torch.nn.Module):
    """Mean over the batch of the FRD cross-entropy: forward(logits, labels) -> scalar."""

    def __init__(self, n_horizons: int, n_atoms: int = 21, launch: Any = None) -> None:
        super().__init__()
        self.op = FrdSoftmaxCE(n_horizons, n_atoms, launch=launch)

    def forward(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return FrdLossFunction.apply(logits.contiguous(), labels.to(torch.int32).contiguous(),
                                     self.op)


class FrdHead(torch.nn.Module):
    """The FRD MLP head: forward(h_t [B, D_in]) -> logits [B, N_HORIZONS, N_ATOMS], through
    one ReLU hidden layer of ``hidden`` units; pair it with ``FrdLoss``."""

    def __init__(self, d_in: int, hidden: int, n_horizons: int, n_atoms: int = 21,
                 launch: Any = None) -> None:
        super().__init__()
        self.op = FrdHeadOp(d_in, hidden, n_horizons, n_atoms, launch=launch)
        self.w1 = torch.nn.Parameter(torch.randn(hidden, d_in, device="cuda") / d_in ** 0.5)
        self.b1 = torch.nn.Parameter(torch.zeros(hidden, device="cuda"))
        self.w2 = torch.nn.Parameter(torch.randn(n_horizons, n_atoms, hidden, device="cuda")
                                     / hidden ** 0.5)
        self.b2 = torch.nn.Parameter(torch.zeros(n_horizons, n_atoms, device="cuda"))

    def forward(self, h_t: torch.Tensor) -> torch.Tensor:
        return FrdHeadFunction.apply(h_t.contiguous(), self.w1, self.b1, self.w2, self.b2,
                                     self.op)
