"""The kernels as PyTorch operators, ``torch.ops.pycuda_heads.<name>``: each with a fake
implementation (shapes only, for Dynamo and AOTAutograd), the differentiable ones with their
autograd formula, Adam with its in-place writes declared.

Every operator takes ``op``, the id ``register`` gave the configured op object (template
constants, launch parameters) it runs with; a module registers its own. The public functions
below (``pool_forward``, ...) are what the modules call: inside ``torch.compile`` they call the
operators, which the compiled graph holds as opaque nodes; in eager mode they call the same
implementations and formulas directly, without the dispatcher's round trips.
"""
from __future__ import annotations

import threading
from functools import lru_cache, partial
from types import SimpleNamespace
from typing import Any, Callable, NamedTuple, Sequence

import torch
from torch import Tensor

from ..core.op import Op
from .launch import Method
from .native import native

_ops: list[Op] = []
_methods: dict[tuple[int, str], Method] = {}
_lock = threading.Lock()


#: (op class, constructor arguments, launch) -> id of the op registered for that configuration
_configured: dict[tuple, int] = {}


def register(op: Op) -> int:
    """The id an operator's ``op`` argument names ``op`` by (an op object lives as long as
    the process: compiled graphs hold its id)."""
    with _lock:
        _ops.append(op)
        return len(_ops) - 1


def configured(cls: type, *args: Any, launch: Any = None) -> tuple[Op, int]:
    """``cls(*args, launch=launch)`` and its id, one per configuration: modules made again and
    again (a hyperparameter sweep) share their op instead of each registering one for good."""
    try:
        key = (cls, args, None if launch is None else
               tuple(sorted((role, tuple(sorted(p.items()))) for role, p in launch.items())))
        hash(key)
    except (AttributeError, TypeError):  # not a launch mapping: the op's constructor names it
        op = cls(*args, launch=launch)
        return op, register(op)
    op_id = _configured.get(key)
    if op_id is None:
        op = cls(*args, launch=launch)  # outside the lock: it may compile
        with _lock:
            op_id = _configured.get(key)
            if op_id is None:
                _ops.append(op)
                op_id = _configured[key] = len(_ops) - 1
    return _ops[op_id], op_id


def _op(op_id: int, kind: str) -> Op:
    """The registered op ``op_id``, which must be a ``kind`` (or of a subclass of it)."""
    op = _ops[op_id] if isinstance(op_id, int) and 0 <= op_id < len(_ops) else None
    if kind not in (c.__name__ for c in type(op).__mro__):  # FrdHeadSmall is a FrdHead
        raise ValueError(f"op: {op_id!r} names no registered {kind} (modules register theirs; "
                         "pycuda_heads.torch.register registers one)")
    return op


# What each operator runs: the op class it needs, its tensor arguments, the op method's call
# and which of its results come back (a tuple: a row of gradients in one buffer).
class _Spec(NamedTuple):
    kind: str
    names: tuple[str, ...]
    call: Callable[[Any, list], Any]
    outputs: Callable[[Any], tuple]
    dtypes: dict[str, torch.dtype] = {}


_SPECS = {
    "pool_forward": _Spec("PerHorizonAttentionPool", ("q_h", "ln"),
                          lambda op, a: op.forward(*a), lambda r: r),
    "pool_backward": _Spec("PerHorizonAttentionPool",
                           ("q_h", "ln", "attn", "grad_ctx", "ctx", "grad_attn"),
                           lambda op, a: op.backward(*a[:5], grad_attn=a[5]), lambda r: r),
    "resgate_forward": _Spec("ResidualGate", ("ctx", "w_res", "bias_res", "head", "alpha"),
                             lambda op, a: op.forward(*a), lambda r: r),
    # grad_head is grad_out itself: the caller passes it on
    "resgate_backward": _Spec("ResidualGate", ("ctx", "w_res", "alpha", "residual", "grad_out"),
                              lambda op, a: op.backward(*a),
                              lambda r: (r[2], (r[0], r[1], r[4]))),
    "frd_softmax_ce": _Spec("FrdSoftmaxCE", ("logits", "labels"),
                            lambda op, a: op.softmax_ce_grad(*a, check_labels=False),
                            lambda r: r, {"labels": torch.int32}),
    "frdhead_forward": _Spec("FrdHead", ("h_t", "w1", "b1", "w2", "b2"),
                             lambda op, a: op.forward(*a), lambda r: r),
    "frdhead_forward_loss": _Spec("FrdHead", ("h_t", "w1", "b1", "w2", "b2", "labels"),
                                  lambda op, a: op.forward_loss(*a), lambda r: r,
                                  {"labels": torch.int32}),
    "frdhead_grad_w2": _Spec("FrdHead", ("hidden", "w2", "grad_logits"),
                             lambda op, a: op.grad_w2(*a), lambda r: ((r[0], r[1]), r[2])),
    "frdhead_grad_w1": _Spec("FrdHead", ("h_t", "w1", "hidden", "dhidden"),
                             lambda op, a: op.grad_w1(*a), lambda r: ((r[0], r[1]), r[2])),
    "frdhead_backward": _Spec("FrdHead", ("h_t", "w1", "w2", "hidden", "grad_logits"),
                              lambda op, a: op.backward(*a),
                              lambda r: ((r[0], r[1]), (r[2], r[3]), r[4])),
}


def _method(name: str, op_id: int) -> Method:
    method = _methods.get((op_id, name))
    if method is None:
        spec = _SPECS[name]
        op = _op(op_id, spec.kind)
        with _lock:
            method = _methods.setdefault((op_id, name), Method(op, spec.names, spec.call,
                                                               spec.outputs, spec.dtypes))
    return method


def _run(name: str, op_id: int, *tensors: Tensor | None) -> Sequence[Tensor]:
    return _method(name, op_id)(*tensors)


# ---- the kernels' implementations (on every device torch dispatches to: they refuse any
# tensor that is not a CUDA tensor on PyCUDA's device, naming it) ----

_DEVICES = ("cuda", "cpu")


@torch.library.custom_op("pycuda_heads::pool_forward", mutates_args=(), device_types=_DEVICES)
def _pool_forward(q_h: Tensor, ln: Tensor, op: int) -> tuple[Tensor, Tensor]:
    ctx, attn = _run("pool_forward", op, q_h, ln)
    return ctx, attn


@torch.library.custom_op("pycuda_heads::pool_backward", mutates_args=(), device_types=_DEVICES)
def _pool_backward(q_h: Tensor, ln: Tensor, attn: Tensor, grad_ctx: Tensor, ctx: Tensor,
                   grad_attn: Tensor | None, op: int) -> tuple[Tensor, Tensor]:
    grad_q_h, grad_ln = _run("pool_backward", op, q_h, ln, attn, grad_ctx, ctx, grad_attn)
    return grad_q_h, grad_ln


@torch.library.custom_op("pycuda_heads::resgate_forward", mutates_args=(),
                         device_types=_DEVICES)
def _resgate_forward(ctx: Tensor, w_res: Tensor, bias_res: Tensor, head: Tensor, alpha: Tensor,
                     op: int) -> tuple[Tensor, Tensor]:
    out, residual = _run("resgate_forward", op, ctx, w_res, bias_res, head, alpha)
    return out, residual


@torch.library.custom_op("pycuda_heads::resgate_backward", mutates_args=(),
                         device_types=_DEVICES)
def _resgate_backward(ctx: Tensor, w_res: Tensor, alpha: Tensor, residual: Tensor,
                      grad_out: Tensor, op: int) -> tuple[Tensor, Tensor]:
    """grad_ctx and one row [grad_w_res | grad_bias_res | grad_alpha]."""
    grad_ctx, row = _run("resgate_backward", op, ctx, w_res, alpha, residual, grad_out)
    return grad_ctx, row


@torch.library.custom_op("pycuda_heads::frd_softmax_ce", mutates_args=(),
                         device_types=_DEVICES)
def _frd_softmax_ce(logits: Tensor, labels: Tensor, op: int) -> tuple[Tensor, Tensor]:
    """(softmax - onehot) / B and the per-row cross-entropy; a row labelled -1 gives 0 in both,
    a label outside [-1, N_ATOMS) NaN in both."""
    grad, ce = _run("frd_softmax_ce", op, logits, labels)
    return grad, ce


@torch.library.custom_op("pycuda_heads::frdhead_forward", mutates_args=(),
                         device_types=_DEVICES)
def _frdhead_forward(h_t: Tensor, w1: Tensor, b1: Tensor, w2: Tensor, b2: Tensor,
                     op: int) -> tuple[Tensor, Tensor]:
    hidden, logits = _run("frdhead_forward", op, h_t, w1, b1, w2, b2)
    return hidden, logits


@torch.library.custom_op("pycuda_heads::frdhead_forward_loss", mutates_args=(),
                         device_types=_DEVICES)
def _frdhead_forward_loss(h_t: Tensor, w1: Tensor, b1: Tensor, w2: Tensor, b2: Tensor,
                          labels: Tensor, op: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """hidden, logits, and frd_softmax_ce's (softmax - onehot) / B and per-row cross-entropy of
    those logits, in one launch."""
    hidden, logits, grad, ce = _run("frdhead_forward_loss", op, h_t, w1, b1, w2, b2, labels)
    return hidden, logits, grad, ce


@torch.library.custom_op("pycuda_heads::frdhead_grad_w2", mutates_args=(),
                         device_types=_DEVICES)
def _frdhead_grad_w2(hidden: Tensor, w2: Tensor, grad_logits: Tensor,
                     op: int) -> tuple[Tensor, Tensor]:
    """One row [grad_w2 | grad_b2] and dhidden."""
    row, dhidden = _run("frdhead_grad_w2", op, hidden, w2, grad_logits)
    return row, dhidden


@torch.library.custom_op("pycuda_heads::frdhead_grad_w1", mutates_args=(),
                         device_types=_DEVICES)
def _frdhead_grad_w1(h_t: Tensor, w1: Tensor, hidden: Tensor, dhidden: Tensor,
                     op: int) -> tuple[Tensor, Tensor]:
    """One row [grad_w1 | grad_b1] and grad_h_t."""
    row, grad_h_t = _run("frdhead_grad_w1", op, h_t, w1, hidden, dhidden)
    return row, grad_h_t


@torch.library.custom_op("pycuda_heads::frdhead_backward", mutates_args=(),
                         device_types=_DEVICES)
def _frdhead_backward(h_t: Tensor, w1: Tensor, w2: Tensor, hidden: Tensor, grad_logits: Tensor,
                      op: int) -> tuple[Tensor, Tensor, Tensor]:
    """Both stages: rows [grad_w1 | grad_b1] and [grad_w2 | grad_b2], and grad_h_t."""
    row1, row2, grad_h_t = _run("frdhead_backward", op, h_t, w1, w2, hidden, grad_logits)
    return row1, row2, grad_h_t


@torch.library.custom_op("pycuda_heads::adam_step", mutates_args=("param", "m", "v"),
                         device_types=_DEVICES)
def _adam_step(param: Tensor, grad: Tensor, m: Tensor, v: Tensor, t: int, op: int) -> None:
    """Step ``t`` (from 1) of Adam, in place on param, m and v. The step's bias corrections
    are launch arguments, so each call works its launch out anew."""
    adam = _op(op, "Adam")
    if not isinstance(t, int) or t < 1:
        raise ValueError(f"t: expected the step number, an int >= 1, got {t!r}")
    names = ("param", "grad", "m", "v")
    Method(adam, names, lambda o, a: o.step(*a, t, inplace=True), lambda r: (), native=False)(
        param, grad, m, v)


# ---- fake implementations: output shapes from input shapes ----

@_pool_forward.register_fake
def _(q_h: Tensor, ln: Tensor, op: int) -> tuple[Tensor, Tensor]:
    b, k, d = ln.shape
    h = q_h.shape[0]
    return ln.new_empty((b, h, d)), ln.new_empty((b, h, k))


@_pool_backward.register_fake
def _(q_h: Tensor, ln: Tensor, attn: Tensor, grad_ctx: Tensor, ctx: Tensor,
      grad_attn: Tensor | None, op: int) -> tuple[Tensor, Tensor]:
    return q_h.new_empty(q_h.shape), ln.new_empty(ln.shape)


@_resgate_forward.register_fake
def _(ctx: Tensor, w_res: Tensor, bias_res: Tensor, head: Tensor, alpha: Tensor,
      op: int) -> tuple[Tensor, Tensor]:
    return head.new_empty(head.shape), head.new_empty(head.shape)


@_resgate_backward.register_fake
def _(ctx: Tensor, w_res: Tensor, alpha: Tensor, residual: Tensor, grad_out: Tensor,
      op: int) -> tuple[Tensor, Tensor]:
    h, d = w_res.shape
    return ctx.new_empty(ctx.shape), ctx.new_empty((h * d + 2 * h,))


@_frd_softmax_ce.register_fake
def _(logits: Tensor, labels: Tensor, op: int) -> tuple[Tensor, Tensor]:
    return logits.new_empty(logits.shape), logits.new_empty(logits.shape[:2])


@_frdhead_forward.register_fake
def _(h_t: Tensor, w1: Tensor, b1: Tensor, w2: Tensor, b2: Tensor,
      op: int) -> tuple[Tensor, Tensor]:
    return h_t.new_empty((h_t.shape[0], w1.shape[0])), h_t.new_empty((h_t.shape[0],
                                                                       *b2.shape))


@_frdhead_forward_loss.register_fake
def _(h_t: Tensor, w1: Tensor, b1: Tensor, w2: Tensor, b2: Tensor, labels: Tensor,
      op: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    b = h_t.shape[0]
    return (h_t.new_empty((b, w1.shape[0])), h_t.new_empty((b, *b2.shape)),
            h_t.new_empty((b, *b2.shape)), h_t.new_empty((b, b2.shape[0])))


@_frdhead_grad_w2.register_fake
def _(hidden: Tensor, w2: Tensor, grad_logits: Tensor, op: int) -> tuple[Tensor, Tensor]:
    h, a, f = w2.shape
    return hidden.new_empty((h * a * f + h * a,)), hidden.new_empty(hidden.shape)


@_frdhead_grad_w1.register_fake
def _(h_t: Tensor, w1: Tensor, hidden: Tensor, dhidden: Tensor,
      op: int) -> tuple[Tensor, Tensor]:
    f, d = w1.shape
    return h_t.new_empty((f * d + f,)), h_t.new_empty(h_t.shape)


@_frdhead_backward.register_fake
def _(h_t: Tensor, w1: Tensor, w2: Tensor, hidden: Tensor, grad_logits: Tensor,
      op: int) -> tuple[Tensor, Tensor, Tensor]:
    (f, d), (h, a, _) = w1.shape, w2.shape
    return (h_t.new_empty((f * d + f,)), h_t.new_empty((h * a * f + h * a,)),
            h_t.new_empty(h_t.shape))


@_adam_step.register_fake
def _(param: Tensor, grad: Tensor, m: Tensor, v: Tensor, t: int, op: int) -> None:
    return None


# ---- autograd: one formula per differentiable operator, for both paths. ``ctx.kernels`` is
# what the backward calls: the operators (a compiled backward holds them as nodes) or the
# implementations themselves (eager). ----

_BACKWARDS = ("pool_backward", "resgate_backward", "frdhead_backward")
_OPERATORS = SimpleNamespace(**{n: getattr(torch.ops.pycuda_heads, n) for n in _BACKWARDS})


def _direct(name: str) -> Callable[..., tuple]:
    """The operator ``name``'s implementation, called without the dispatcher."""
    return lambda *args: tuple(_run(name, args[-1], *args[:-1]))


_DIRECT = SimpleNamespace(**{n: _direct(n) for n in _BACKWARDS})


def _pool_grads(ctx: Any, grad_ctx: Tensor | None, grad_attn: Tensor | None) -> tuple:
    if grad_ctx is None and grad_attn is None:
        return None, None, None
    q_h, ln, attn, out = ctx.saved_tensors
    if grad_ctx is None:  # only attn reaches the loss
        grad_ctx = torch.zeros_like(out)
    grad_q_h, grad_ln = ctx.kernels.pool_backward(
        q_h, ln, attn, grad_ctx.contiguous(), out,
        None if grad_attn is None else grad_attn.contiguous(), ctx.op)
    return grad_q_h, grad_ln, None


def _resgate_grads(ctx: Any, grad_out: Tensor | None, _: Tensor | None) -> tuple:
    if grad_out is None:
        return (None,) * 6
    c, w_res, alpha, residual = ctx.saved_tensors
    grad_out = grad_out.contiguous()
    grad_c, row = ctx.kernels.resgate_backward(c, w_res, alpha, residual, grad_out, ctx.op)
    h, d = w_res.shape
    return (grad_c, row[:h * d].view(h, d), row[h * d:h * d + h], grad_out, row[h * d + h:],
            None)


def _frd_grads(ctx: Any, _: Tensor | None, grad_ce: Tensor | None) -> tuple:
    if grad_ce is None:
        return None, None, None
    (grad,) = ctx.saved_tensors
    # the kernel's grad is d(sum of ce / B)/d logits
    return grad * (grad_ce * grad.shape[0]).unsqueeze(-1), None, None


def _head_backward(ctx: Any, h_t: Tensor, w1: Tensor, w2: Tensor, hidden: Tensor,
                   grad_logits: Tensor) -> tuple:
    """The head's backward (both stages): grad_h_t, grad_w1, grad_b1, grad_w2, grad_b2."""
    row1, row2, grad_h_t = ctx.kernels.frdhead_backward(h_t, w1, w2, hidden,
                                                        grad_logits.contiguous(), ctx.op)
    f, d = w1.shape
    h, a, _ = w2.shape
    return (grad_h_t, row1[:f * d].view(f, d), row1[f * d:], row2[:h * a * f].view(w2.shape),
            row2[h * a * f:].view(h, a))


def _frdhead_grads(ctx: Any, _: Tensor | None, grad_logits: Tensor | None) -> tuple:
    if grad_logits is None:
        return (None,) * 6
    return (*_head_backward(ctx, *ctx.saved_tensors, grad_logits), None)


def _frdhead_loss_grads(ctx: Any, _: Tensor | None, grad_logits: Tensor | None,
                        __: Tensor | None, grad_ce: Tensor | None) -> tuple:
    """ce's gradient through the saved softmax gradient (as frd_softmax_ce's), plus any that
    reaches the logits themselves, then the head's backward; labels and op take none."""
    if grad_logits is None and grad_ce is None:
        return (None,) * 7
    h_t, w1, w2, hidden, grad = ctx.saved_tensors
    g = None if grad_ce is None else grad * (grad_ce * grad.shape[0]).unsqueeze(-1)
    if grad_logits is not None:
        g = grad_logits if g is None else g + grad_logits
    return (*_head_backward(ctx, h_t, w1, w2, hidden, g), None, None)


class _Rule(NamedTuple):
    """A differentiable operator's autograd: the inputs and outputs its backward reads (saved
    in that order: the listed inputs, then the listed outputs), the outputs that take no
    gradient, and ``grads(ctx, *output grads)``, one gradient per input, ``op`` last. Grads of
    outputs that reach no loss come as None."""
    name: str
    save_inputs: tuple[int, ...]
    save_outputs: tuple[int, ...]
    non_differentiable: tuple[int, ...]
    grads: Callable[..., tuple]

    def setup(self, ctx: Any, inputs: tuple, output: tuple) -> None:
        ctx.op = inputs[-1]
        ctx.set_materialize_grads(False)
        for i in self.non_differentiable:
            ctx.mark_non_differentiable(output[i])
        ctx.save_for_backward(*(inputs[i] for i in self.save_inputs),
                              *(output[i] for i in self.save_outputs))


_RULES = {rule.name: rule for rule in (
    # the pooled output too: given it, the backward kernel reads ln once fewer
    _Rule("pool_forward", (0, 1), (1, 0), (), _pool_grads),
    # residual is saved for the backward, not a result to train on
    _Rule("resgate_forward", (0, 1, 4), (1,), (1,), _resgate_grads),
    _Rule("frd_softmax_ce", (), (0,), (0,), _frd_grads),
    _Rule("frdhead_forward", (0, 1, 3), (0,), (0,), _frdhead_grads),
    # hidden and the softmax gradient are saved for the backward, not results to train on
    _Rule("frdhead_forward_loss", (0, 1, 3), (0, 2), (0, 2), _frdhead_loss_grads))}


def _registered_setup(rule: _Rule) -> Callable[[Any, tuple, tuple], None]:
    def setup(ctx: Any, inputs: tuple, output: tuple) -> None:
        ctx.kernels = _OPERATORS
        rule.setup(ctx, inputs, output)
    return setup


for _rule in _RULES.values():
    torch.library.register_autograd(f"pycuda_heads::{_rule.name}", _rule.grads,
                                    setup_context=_registered_setup(_rule))


class _Eager(torch.autograd.Function):
    """A differentiable operator's implementation and formula without the dispatcher, where
    the C++ launcher (whose node does the same) could not be built."""

    @staticmethod
    def forward(ctx: Any, rule: _Rule, *args: Any) -> tuple:
        out = tuple(_run(rule.name, args[-1], *args[:-1]))
        ctx.kernels, ctx.rule = _DIRECT, rule
        rule.setup(ctx, args, out)
        return out

    @staticmethod
    def backward(ctx: Any, *grads: Tensor | None) -> tuple:
        return (None, *ctx.rule.grads(ctx, *grads))


@lru_cache(maxsize=None)
def _native_rule(name: str) -> tuple[Any, int] | None:
    """(the C++ launcher, the id of ``name``'s autograd rule in it), or None without it."""
    lib = native()
    if lib is None:
        return None
    rule = _RULES[name]

    def backward(op: int, saved: list[Tensor], *grads: Tensor | None) -> tuple:
        ctx = SimpleNamespace(saved_tensors=tuple(saved), op=op, kernels=_DIRECT)
        return rule.grads(ctx, *grads)[:-1]  # the last is op's
    return lib, lib.rule(name, list(rule.save_inputs), list(rule.save_outputs),
                         list(rule.non_differentiable), backward)


def _eager(name: str, op_id: int) -> Callable[..., tuple]:
    """``name``'s eager call, with ``op_id``'s launches bound: the C++ launcher's ``apply``
    (which refuses an argument that is not a tensor through the method's checks, naming it),
    or the Python autograd Function where the launcher could not be built."""
    native_rule = _native_rule(name)
    if native_rule is None:
        return partial(_Eager.apply, _RULES[name])
    lib, rule_id = native_rule
    return partial(lib.apply, rule_id, _method(name, op_id).handle)


def _differentiable(name: str) -> Callable[..., tuple]:
    operator = getattr(torch.ops.pycuda_heads, name)
    bound: dict[int, Callable[..., tuple]] = {}  # op id -> its eager call

    def call(*args: Any) -> tuple:
        # a tensor elsewhere than on a GPU takes the dispatcher, whose kernel for it refuses
        # it by name (or runs a test's)
        if torch.compiler.is_compiling() or not getattr(args[0], "is_cuda", False):
            return operator(*args)
        eager = bound.get(args[-1])
        if eager is None:
            eager = bound.setdefault(args[-1], _eager(name, args[-1]))
        return eager(*args)
    call.__name__ = name
    call.__doc__ = f"``torch.ops.pycuda_heads.{name}`` (eager: without the dispatcher)."
    return call


def frd_loss(logits: Tensor, labels: Tensor, op: int) -> Tensor:
    """The mean over the batch of the FRD cross-entropy (rows labelled -1 add nothing): the
    operator ``frd_softmax_ce``'s ce summed over B and H, divided by B."""
    _, ce = frd_softmax_ce(logits, labels, op)
    return ce.sum() / logits.shape[0]


def frdhead_loss(h_t: Tensor, w1: Tensor, b1: Tensor, w2: Tensor, b2: Tensor, labels: Tensor,
                 op: int) -> tuple[Tensor, Tensor]:
    """The head's logits and ``frd_loss`` of them, from the operator ``frdhead_forward_loss``
    (one launch: the loss is computed from logits the kernel still holds)."""
    _, logits, _, ce = frdhead_forward_loss(h_t, w1, b1, w2, b2, labels, op)
    return logits, ce.sum() / h_t.shape[0]


pool_forward = _differentiable("pool_forward")
resgate_forward = _differentiable("resgate_forward")
frd_softmax_ce = _differentiable("frd_softmax_ce")
frdhead_forward = _differentiable("frdhead_forward")
frdhead_forward_loss = _differentiable("frdhead_forward_loss")
adam_step = torch.ops.pycuda_heads.adam_step
#: every operator this module registers, by name (``torch.ops.pycuda_heads.<name>``)
DEFINITIONS = {"pool_forward": _pool_forward, "pool_backward": _pool_backward,
               "resgate_forward": _resgate_forward, "resgate_backward": _resgate_backward,
               "frd_softmax_ce": _frd_softmax_ce, "frdhead_forward": _frdhead_forward,
               "frdhead_forward_loss": _frdhead_forward_loss,
               "frdhead_grad_w2": _frdhead_grad_w2, "frdhead_grad_w1": _frdhead_grad_w1,
               "frdhead_backward": _frdhead_backward, "adam_step": _adam_step}
OPERATORS = tuple(f"pycuda_heads::{name}" for name in DEFINITIONS)
