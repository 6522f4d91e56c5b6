"""NumPy references of every op: the contract kernels are tested against. Computed in float64
by default; ``dtype=np.float32`` gives the same math in the working precision, whose own error
against float64 sets the scale of the kernels' tolerances. Also the central-difference gradient
check every op's parity test uses. No GPU involved; imports nothing of the package."""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import numpy as np

ArrayLike = np.ndarray
CE_FLOOR = 1e-30


def _cast(dtype: type, *xs: ArrayLike) -> list[np.ndarray]:
    return [np.asarray(x, dtype=dtype) for x in xs]


def _softmax(s: np.ndarray) -> np.ndarray:
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def pool_forward(q_h: ArrayLike, ln: ArrayLike, dtype: type = np.float64) -> tuple[np.ndarray, np.ndarray]:
    """ctx[B,H,D], attn[B,H,K] of the per-horizon attention pool."""
    q_h, ln = _cast(dtype, q_h, ln)
    scale = dtype(1.0 / np.sqrt(q_h.shape[1]))
    attn = _softmax(scale * np.matmul(q_h, ln.transpose(0, 2, 1)))
    return np.matmul(attn, ln), attn


def pool_backward(q_h: ArrayLike, ln: ArrayLike, attn: ArrayLike, grad_ctx: ArrayLike,
                  ctx: ArrayLike | None = None, grad_attn: ArrayLike | None = None,
                  dtype: type = np.float64) -> tuple[np.ndarray, np.ndarray]:
    """grad_q_h[H,D], grad_ln[B,K,D] given the forward's attn and grad_ctx (and grad_attn).
    The forward's ctx (= attn @ ln) changes no result: a kernel given it skips a pass over ln."""
    q_h, ln, attn, grad_ctx = _cast(dtype, q_h, ln, attn, grad_ctx)
    scale = dtype(1.0 / np.sqrt(q_h.shape[1]))
    dw = np.matmul(grad_ctx, ln.transpose(0, 2, 1))
    if grad_attn is not None:
        dw = dw + np.asarray(grad_attn, dtype=dtype)
    ds = attn * (dw - (attn * dw).sum(axis=-1, keepdims=True))
    grad_q_h = scale * np.matmul(ds, ln).sum(axis=0)
    grad_ln = np.matmul(attn.transpose(0, 2, 1), grad_ctx) + scale * np.matmul(ds.transpose(0, 2, 1), q_h)
    return grad_q_h, grad_ln


def residual_forward(ctx: ArrayLike, w_res: ArrayLike, bias_res: ArrayLike,
                     dtype: type = np.float64) -> np.ndarray:
    """residual[B,H] = sum_d w_res[h,d] ctx[b,h,d] + bias_res[h]."""
    ctx, w_res, bias_res = _cast(dtype, ctx, w_res, bias_res)
    return (ctx * w_res).sum(axis=-1) + bias_res


def residual_backward(ctx: ArrayLike, w_res: ArrayLike, grad_residual: ArrayLike,
                      dtype: type = np.float64) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """grad_w_res[H,D], grad_bias_res[H], grad_ctx[B,H,D]."""
    ctx, w_res, g = _cast(dtype, ctx, w_res, grad_residual)
    return (g[:, :, None] * ctx).sum(axis=0), g.sum(axis=0), g[:, :, None] * w_res[None]


def gate_forward(head: ArrayLike, residual: ArrayLike, alpha: ArrayLike,
                 dtype: type = np.float64) -> np.ndarray:
    """out[B,H] = head + tanh(alpha) * residual."""
    head, residual, alpha = _cast(dtype, head, residual, alpha)
    return head + np.tanh(alpha) * residual


def gate_backward(residual: ArrayLike, alpha: ArrayLike, grad_out: ArrayLike,
                  dtype: type = np.float64) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """grad_head[B,H], grad_residual[B,H], grad_alpha[H]."""
    residual, alpha, g = _cast(dtype, residual, alpha, grad_out)
    t = np.tanh(alpha)
    return g.copy(), t * g, (1.0 - t * t) * (g * residual).sum(axis=0)


def frd_softmax_ce_grad(logits: ArrayLike, labels: ArrayLike,
                        dtype: type = np.float64) -> tuple[np.ndarray, np.ndarray]:
    """grad_logits[B,H,A] = (p - onehot)/B and ce[B,H] = -log(max(p[label], 1e-30)); label -1 rows
    are zero in both. Labels outside [-1, A) raise ValueError."""
    (logits,) = _cast(dtype, logits)
    labels = np.asarray(labels)
    n_atoms = logits.shape[-1]
    bad = (labels < -1) | (labels >= n_atoms)
    if bad.any():
        pos = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ValueError(f"labels{list(pos)} = {int(labels[pos])} is outside [-1, {n_atoms})")
    p = _softmax(logits)
    live = labels >= 0
    safe = np.where(live, labels, 0)
    onehot = np.zeros_like(p)
    np.put_along_axis(onehot, safe[..., None], 1.0, axis=-1)
    grad = np.where(live[..., None], (p - onehot) / logits.shape[0], 0.0)
    p_label = np.take_along_axis(p, safe[..., None], axis=-1)[..., 0]
    ce = np.where(live, -np.log(np.maximum(p_label, CE_FLOOR)), 0.0)
    return grad, ce


def frd_loss(logits: ArrayLike, labels: ArrayLike) -> float:
    """The scalar whose gradient grad_logits is: sum(ce) / B."""
    return float(frd_softmax_ce_grad(logits, labels)[1].sum() / np.shape(logits)[0])


def reduce_axis0(x: ArrayLike, dtype: type = np.float64) -> np.ndarray:
    (x,) = _cast(dtype, x)
    return x.sum(axis=0)


# The parity tests: central differences at +-1e-2 of a float32 forward, passing within 5e-2
# relative or 5e-3 absolute.
PARITY_EPS, PARITY_RTOL, PARITY_ATOL = 1e-2, 5e-2, 5e-3


def random_indices(rng: np.random.Generator, shape: Sequence[int], n: int) -> list[tuple]:
    return [tuple(int(rng.integers(s)) for s in shape) for _ in range(n)]


def central_differences(loss: Callable[[], float], arrays: Mapping[str, np.ndarray],
                        analytic: Mapping[str, np.ndarray], probes: Mapping[str, list[tuple]],
                        eps: float = PARITY_EPS, rtol: float = PARITY_RTOL,
                        atol: float = PARITY_ATOL) -> dict[str, Any]:
    """Central differences of ``loss`` (which reads ``arrays``, perturbed in place and
    restored) at ``probes``, against the ``analytic`` gradients."""
    worst_rel, worst_abs, ok = 0.0, 0.0, True
    for name, idxs in probes.items():
        x = arrays[name]
        for i in idxs:
            old = x[i]
            x[i] = old + x.dtype.type(eps)
            hi = loss()
            x[i] = old - x.dtype.type(eps)
            lo = loss()
            x[i] = old
            num, ana = (hi - lo) / (2 * eps), float(analytic[name][i])
            err = abs(num - ana)
            rel = err / max(abs(num), 1e-30)
            ok &= err <= atol or rel <= rtol
            worst_rel, worst_abs = max(worst_rel, min(rel, 1e30)), max(worst_abs, err)
    return {"passed": bool(ok), "max_rel_err_numgrad": worst_rel, "max_abs_err_numgrad": worst_abs,
            "probes": sum(len(v) for v in probes.values())}


def resgate_forward(ctx: ArrayLike, w_res: ArrayLike, bias_res: ArrayLike, head: ArrayLike,
                    alpha: ArrayLike, dtype: type = np.float64) -> tuple[np.ndarray, np.ndarray]:
    """out[B,H] = head + tanh(alpha) * residual and residual[B,H], the residual and the gate
    fused."""
    residual = residual_forward(ctx, w_res, bias_res, dtype=dtype)
    return gate_forward(head, residual, alpha, dtype=dtype), residual


def resgate_backward(ctx: ArrayLike, w_res: ArrayLike, alpha: ArrayLike, residual: ArrayLike,
                     grad_out: ArrayLike, dtype: type = np.float64
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """grad_w_res[H,D], grad_bias_res[H], grad_ctx[B,H,D], grad_head[B,H], grad_alpha[H]: the
    gate's backward, then the residual's on its grad_residual."""
    grad_head, grad_residual, grad_alpha = gate_backward(residual, alpha, grad_out, dtype=dtype)
    grad_w_res, grad_bias_res, grad_ctx = residual_backward(ctx, w_res, grad_residual, dtype=dtype)
    return grad_w_res, grad_bias_res, grad_ctx, grad_head, grad_alpha


def frdhead_forward(h_t: ArrayLike, w1: ArrayLike, b1: ArrayLike, w2: ArrayLike, b2: ArrayLike,
                    dtype: type = np.float64) -> tuple[np.ndarray, np.ndarray]:
    """hidden[B,F] = ReLU(h_t w1^T + b1) and logits[B,H,A] = hidden w2^T + b2, with w2 [H,A,F]
    (the [H*A, F] matrix viewed per horizon) and b2 [H,A]."""
    h_t, w1, b1, w2, b2 = _cast(dtype, h_t, w1, b1, w2, b2)
    hidden = np.maximum(h_t @ w1.T + b1, 0)
    h, a, f = w2.shape
    return hidden, (hidden @ w2.reshape(h * a, f).T + b2.reshape(-1)).reshape(-1, h, a)


def frdhead_grad_w2(hidden: ArrayLike, w2: ArrayLike, grad_logits: ArrayLike,
                    dtype: type = np.float64) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """F.3b: grad_w2[H,A,F] = grad_logits^T hidden, grad_b2[H,A] = sum_b grad_logits and
    dhidden[B,F] = grad_logits w2."""
    hidden, w2, g = _cast(dtype, hidden, w2, grad_logits)
    h, a, f = w2.shape
    g2 = g.reshape(-1, h * a)
    return ((g2.T @ hidden).reshape(h, a, f), g.sum(axis=0), g2 @ w2.reshape(h * a, f))


def frdhead_grad_w1(h_t: ArrayLike, w1: ArrayLike, hidden: ArrayLike, dhidden: ArrayLike,
                    dtype: type = np.float64) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """F.3c: dpre = dhidden where the unit is active (hidden = ReLU(pre) > 0, i.e. pre > 0),
    else 0; grad_w1[F,D_in] = dpre^T h_t, grad_b1[F] = sum_b dpre, grad_h_t[B,D_in] = dpre w1."""
    h_t, w1, hidden, dhidden = _cast(dtype, h_t, w1, hidden, dhidden)
    dpre = np.where(hidden > 0, dhidden, 0)
    return dpre.T @ h_t, dpre.sum(axis=0), dpre @ w1


def frdhead_loss(h_t: ArrayLike, w1: ArrayLike, b1: ArrayLike, w2: ArrayLike, b2: ArrayLike,
                 labels: ArrayLike) -> float:
    """The FRD head's scalar loss sum(ce) / B, whose gradients the two backward stages give."""
    return frd_loss(frdhead_forward(h_t, w1, b1, w2, b2)[1], labels)


# Adam's default hyperparameters (PyTorch's).
ADAM_LR, ADAM_BETA1, ADAM_BETA2, ADAM_EPS = 1e-3, 0.9, 0.999, 1e-8


def adam_step(param: ArrayLike, grad: ArrayLike, m: ArrayLike, v: ArrayLike, t: int,
              lr: float = ADAM_LR, beta1: float = ADAM_BETA1, beta2: float = ADAM_BETA2,
              eps: float = ADAM_EPS, dtype: type = np.float64
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Step ``t`` (from 1) of bias-corrected Adam: the new param, m and v."""
    param, grad, m, v = _cast(dtype, param, grad, m, v)
    bc1, bc2 = dtype(1 - beta1 ** t), dtype(1 - beta2 ** t)
    m = dtype(beta1) * m + dtype(1 - beta1) * grad
    v = dtype(beta2) * v + dtype(1 - beta2) * grad * grad
    return param - dtype(lr) * (m / bc1) / (np.sqrt(v / bc2) + dtype(eps)), m, v
