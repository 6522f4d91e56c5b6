"""Issue 32 probe (CPU, no GPU): would a split of the operands into FP16 (or BF16) pieces keep
the FRD head's products as accurate as 3xTF32, at the tensor cores' 16-bit rate (twice TF32's on
Hopper)? Emulates each scheme's pieces and float32 accumulation in NumPy on the head's row
products (K = 128 and 105) and holds each to the library's validation rule
(``verify.checks.compare``: the error against float64 within 16x float32's own, or 1e-5 of the
largest output).

Schemes (a * b a product, big / small the pieces, float32 sums over k ascending):
  tf32x1        big.big, big = x cut to tf32 (the top 10 mantissa bits, a truncation)
  tf32x3        small.big + big.small + big.big: the library's kernels
  fp16x2        x scaled by a power of two per row (A) or column (B) so that its largest
                element is below 2^15; big = fp16(x), small = fp16((x - big) * 2^11), kept
                scaled; big.big in one accumulator, small.big + big.small in a second, summed
                as first + second * 2^-11 (two accumulator sets)
  fp16x2_one    the same pieces unscaled by 2^11 (small may be subnormal), one accumulator
  fp16x2_tensor fp16x2 with one power of two for each whole operand (a weight gradient, whose K
                is the batch, cannot scale along it; a bound known before the launch would do)
  bf16x2        big = bf16(x), small = bf16(x - big), three products, one accumulator
  bf16x3        three bf16 pieces, the six products of order <= 2, one accumulator

The weight gradients (``--weight-gradients``, B = 65536): K is the batch, so fp16x2's
row/column scales are A^T's rows and X's columns over the whole batch, one power of two a column
of A and of X (wgrad_f16.cu's design); fp16x2_one is that kernel's arithmetic with the scales
from a first pass, fp16x2_running its WS_RUNNING (scales from the steps so far, the accumulator
rescaled, blocks' slices summed in order).

    python probes/frdhead_wgmma/precision.py reports/nvidia-h200/probes/frd_precision.json
    python probes/frdhead_wgmma/precision.py --weight-gradients \
        reports/nvidia-h200/probes/frd_precision_wgrad.json
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Callable

import numpy as np

from pycuda_heads.verify.checks import compare

F32 = np.float32


def tf32(x: np.ndarray) -> np.ndarray:
    return (x.astype(F32).view(np.uint32) & np.uint32(0xFFFFE000)).view(F32)


def bf16(x: np.ndarray) -> np.ndarray:
    """Round to nearest even on float32's top 16 bits."""
    u = x.astype(F32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return u.astype(np.uint32).view(F32)


def fp16(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).astype(F32)


def accumulate(pairs: list[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    """sum over k ascending (each k: the pairs' products in order) of a[:, k] b[k, :], float32."""
    m, n = pairs[0][0].shape[0], pairs[0][1].shape[1]
    acc = np.zeros((m, n), F32)
    for k in range(pairs[0][0].shape[1]):
        for a, b in pairs:
            acc += np.outer(a[:, k], b[k, :]).astype(F32)  # a 22-bit product: exact in float32
    return acc


def pow2_scale(x: np.ndarray, axis: int | None) -> np.ndarray:
    """2^e per row (axis 1), column (axis 0) or the whole array (None) with the largest
    |x| * 2^e in [2^14, 2^15)."""
    top = np.abs(x).max(axis=axis, keepdims=True).astype(np.float64)
    e = 14 - np.floor(np.log2(np.where(top > 0, top, 1.0)))
    return np.exp2(e).astype(F32)


def tf32x1(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return accumulate([(tf32(a), tf32(b))])


def tf32x3(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    ab, bb = tf32(a), tf32(b)
    return accumulate([(tf32(a - ab), bb), (ab, tf32(b - bb)), (ab, bb)])


def fp16x2(a: np.ndarray, b: np.ndarray, one: bool = False,
           whole: bool = False) -> np.ndarray:
    sa, sb = (pow2_scale(a, None), pow2_scale(b, None)) if whole else \
        (pow2_scale(a, 1), pow2_scale(b, 0))
    a, b = a * sa, b * sb  # exact: powers of two
    a0, b0 = fp16(a), fp16(b)
    up = F32(1.0 if one else 2.0 ** 11)
    a1, b1 = fp16((a - a0) * up), fp16((b - b0) * up)
    if one:
        c = accumulate([(a1, b0), (a0, b1), (a0, b0)])
    else:
        c = accumulate([(a0, b0)]) + accumulate([(a1, b0), (a0, b1)]) * F32(2.0 ** -11)
    return c / (sa * sb)


def fp16x2_running(a: np.ndarray, b: np.ndarray, bk: int = 32, rows: int = 512) -> np.ndarray:
    """wgrad_f16.cu's WS_RUNNING: K cut into blocks' slices of ``rows`` (their partials summed
    in float32 in order), a slice into steps of ``bk``; a column's scale is pow2 of its running
    maximum over the slice's steps so far, and when a scale shrinks the accumulator is rescaled
    by the ratio (a power of two, exact) before the step's products (fp16x2_one's three)."""
    m, n = a.shape[0], b.shape[1]
    total = np.zeros((m, n), F32)
    for k0 in range(0, a.shape[1], rows):
        sa, sb = np.full((m, 1), 2.0 ** 127, F32), np.full((1, n), 2.0 ** 127, F32)
        acc = np.zeros((m, n), F32)
        for s0 in range(k0, min(k0 + rows, a.shape[1]), bk):
            sa_step, sb_step = a[:, s0:s0 + bk], b[s0:s0 + bk]
            ma, mb = np.abs(sa_step).max(1, keepdims=True), np.abs(sb_step).max(0, keepdims=True)
            na = np.where(ma > 0, np.minimum(sa, pow2_scale(sa_step, 1)), sa)
            nb = np.where(mb > 0, np.minimum(sb, pow2_scale(sb_step, 0)), sb)
            acc *= (na / sa) * (nb / sb)
            sa, sb = na, nb
            x, y = sa_step * sa, sb_step * sb
            x0, y0 = fp16(x), fp16(y)
            x1, y1 = fp16(x - x0), fp16(y - y0)
            for k in range(x.shape[1]):
                for u, v in ((x1, y0), (x0, y1), (x0, y0)):
                    acc += np.outer(u[:, k], v[k, :]).astype(F32)
        total += acc / (sa * sb)
    return total


def bf16x2(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a0, b0 = bf16(a), bf16(b)
    return accumulate([(bf16(a - a0), b0), (a0, bf16(b - b0)), (a0, b0)])


def bf16x3(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a0, b0 = bf16(a), bf16(b)
    a1, b1 = bf16(a - a0), bf16(b - b0)
    a2, b2 = bf16(a - a0 - a1), bf16(b - b0 - b1)
    return accumulate([(a2, b0), (a1, b1), (a0, b2), (a1, b0), (a0, b1), (a0, b0)])


SCHEMES: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "tf32x1": tf32x1, "tf32x3": tf32x3, "fp16x2": fp16x2,
    "fp16x2_one": lambda a, b: fp16x2(a, b, one=True),
    "fp16x2_tensor": lambda a, b: fp16x2(a, b, whole=True), "fp16x2_running": fp16x2_running,
    "bf16x2": bf16x2, "bf16x3": bf16x3}


def cases(rng: np.random.Generator, m: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """(A [m, K], B [K, N]) of the head's products, and harder draws."""
    k = n = 128
    w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(F32)
    h_t = rng.standard_normal((m, k)).astype(F32)
    # grad_logits-like rows: softmax minus a one-hot over 21 atoms, / B (B = 65536), K = 105
    logits = rng.standard_normal((m, 5, 21))
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    p[np.arange(m), :, rng.integers(0, 21, m)] -= 1
    g = (p.reshape(m, 105) / 65536).astype(F32)
    w2 = (rng.standard_normal((105, n)) / np.sqrt(n)).astype(F32)
    wide = (h_t * np.exp2(rng.uniform(-12, 12, (m, k)))).astype(F32)
    return {"hidden = h_t w1^T (K 128)": (h_t, w),
            "dhidden = G w2 (K 105, G ~ 1/B)": (g, w2),
            "wide rows: h_t * 2^U(-12, 12)": (wide, w),
            "wide weights: w * 2^U(-12, 12)": (h_t, (w * np.exp2(rng.uniform(-12, 12, (k, n))))
                                               .astype(F32))}


def wgrad_cases(rng: np.random.Generator, b: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """(A^T [m, B], X [B, n]) of the backward's weight gradients, and a harder h_t."""
    logits = rng.standard_normal((b, 5, 21))
    p = np.exp(logits - logits.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    p[np.arange(b), :, rng.integers(0, 21, b)] -= 1
    g = (p.reshape(b, 105) / b).astype(F32)
    hidden = np.maximum(rng.standard_normal((b, 128)), 0).astype(F32)
    dpre = np.where(hidden > 0, rng.standard_normal((b, 128)) / b, 0).astype(F32)
    h_t = rng.standard_normal((b, 128)).astype(F32)
    wide = (h_t * np.exp2(rng.uniform(-12, 12, (b, 1)))).astype(F32)
    return {f"dW2 = G^T hidden (K = B = {b})": (np.ascontiguousarray(g.T), hidden),
            f"dW1 = dpre^T h_t (K = B = {b})": (np.ascontiguousarray(dpre.T), h_t),
            f"dW1, h_t rows * 2^U(-12, 12) (K = B = {b})": (np.ascontiguousarray(dpre.T), wide)}


WGRAD_SCHEMES = ("tf32x3", "fp16x2_one", "fp16x2_tensor", "fp16x2_running")


def main(path: str, weight_gradients: bool = False) -> None:
    rng = np.random.default_rng(32)
    out: dict = {"rule": "verify.checks.compare: max |err| <= max(16 x float32's, 1e-5 x max|ref|)"}
    todo = wgrad_cases(rng, 65536) if weight_gradients else cases(rng, 1024)
    schemes = {k: SCHEMES[k] for k in WGRAD_SCHEMES} if weight_gradients else SCHEMES
    for name, (a, b) in todo.items():
        ref64 = a.astype(np.float64) @ b.astype(np.float64)
        ref32 = accumulate([(a, b)])
        row = {}
        for scheme, fn in schemes.items():
            got = compare(fn(a, b), ref64, ref32)
            row[scheme] = {"passed": got["passed"], "max_rel_err": got["max_rel_err"],
                           "x_float32": got["max_abs_err"] / got["ref32_abs_err"]}
        out[name] = row
        print(name)
        for scheme, r in row.items():
            print(f"  {scheme:13s} {'pass' if r['passed'] else 'FAIL'}  max_rel_err "
                  f"{r['max_rel_err']:.2e}  {r['x_float32']:.1f}x float32's error", flush=True)
    Path(path).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    if sys.argv[1] == "--weight-gradients":
        main(sys.argv[2], weight_gradients=True)
    else:
        main(sys.argv[1])
