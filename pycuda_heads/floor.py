"""Bytes each kernel must move through device memory (every input read once, every output
written once, float32/int32 = 4 bytes): the numerator of the memory-bandwidth floor."""
from __future__ import annotations

from typing import Mapping


def floor_bytes(kernel: str, template: Mapping[str, int], shape: Mapping[str, int]) -> int:
    h, d, a = template.get("N_HORIZONS", 1), template.get("HIDDEN_DIM", 1), template.get("N_ATOMS", 1)
    b = shape.get("B", 1)
    k = shape.get("K", 1)
    words = {
        # q_h, ln in; ctx, attn out
        "pool.forward": h * d + b * k * d + b * h * d + b * h * k,
        # q_h, ln, attn, grad_ctx in; grad_ln, grad_q_h out
        "pool.backward": h * d + b * k * d + b * h * k + b * h * d + b * k * d + h * d,
        # ctx, w_res, bias in; residual out
        "residual.forward": b * h * d + h * d + h + b * h,
        # ctx, w_res, grad_residual in; grad_w_res, grad_bias, grad_ctx out
        "residual.backward": b * h * d + h * d + b * h + h * d + h + b * h * d,
        # head, residual, alpha in; out
        "gate.forward": 3 * b * h + h,
        # residual, alpha, grad_out in; grad_residual, grad_alpha out (grad_head is grad_out)
        "gate.backward": 3 * b * h + 2 * h,
        # logits, labels in; grad_logits, ce out
        "frd.softmax_ce_grad": 2 * b * h * a + 2 * b * h,
        "reduce_axis0": shape.get("N", 1) * shape.get("M", 1) + shape.get("M", 1),
    }
    if kernel not in words:
        raise KeyError(f"no floor formula for kernel {kernel!r}")
    return 4 * words[kernel]
