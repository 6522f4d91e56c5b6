"""Issue 32 probe (CPU): the index arithmetic of the FP16 engine (cu/wgmma_f16.cuh,
cu/frdhead_f16.cuh) replayed in NumPy under the layouts PTX documents for wgmma with FP16 operands, to catch an
index slip before a GPU run; the hardware's own reading of those layouts is the GPU run's to
prove (it did: the GPU tests of WGMMA = 2). Modelled, as the code assumes them:
  A from registers (a warp's 16 rows of the m64 tile): a0 = (g, 2t..2t + 1), a1 = (g + 8, ..),
      a2 = (g, 2t + 8..), a3 = (g + 8, 2t + 8..), the lower k in the low half;
  B from shared memory, K-major, no swizzle: element (n, k) of a k16 step at byte
      start + (k // 8) * LBO + (n // 8) * SBO + (n % 8) * 16 + (k % 8) * 2, LBO = ROWS * 16,
      SBO = 128 (the descriptor f16_desc builds);
  D: d[4j + 2h + e] = (row g + 8h, column 8j + 2t + e).
Replays stage_f16 (permuted and not), split_rows_f16, products_f16 (three products, float32
sums), acc_f16 and wf_forward's epilogues on one 64-row tile, and holds the result to the
library's validation rule against float64.

    python probes/frdhead_wgmma/fp16_layout_check.py
"""
from __future__ import annotations

import numpy as np

from pycuda_heads import reference as ref
from pycuda_heads.verify.checks import compare

F32, F16 = np.float32, np.float16
D = F = 128
N2, HA = 112, 105
ROWS = 64


def pow2_scale(top: float) -> F32:
    """The CUDA pow2_scale: 2^(141 - e) for top's biased exponent e, clamped; 1 for 0."""
    if top <= 0:
        return F32(1)
    e = (int(np.array(top, F32).view(np.uint32)) >> 23) & 0xFF
    return np.array(min(268 - e, 254) << 23, np.uint32).view(F32)


def core_offset_h(r: int, k: int, rows: int) -> int:
    return ((k >> 3) * (rows >> 3) + (r >> 3)) * 64 + (r & 7) * 8 + (k & 7)


def physical_k(k: int) -> int:
    """The physical column of logical pair (k, k + 1), k even (the float4 at 16s + 4t holds
    logical 2t, 2t + 1, 2t + 8, 2t + 9 of step s)."""
    return (k & ~15) + 4 * ((k & 7) >> 1) + 2 * ((k >> 3) & 1)


def stage(w: np.ndarray, rows: int, kd: int, permute: bool, n_valid: int):
    """stage_f16: the two FP16 pieces in shared memory (flat, halves) and 1 / each row's scale,
    walked as the kernel does: lane (row n, q) loads logical pairs k = 8c + 2q from physical
    column physical_k(k) and stores them at core_offset_h(n, k)."""
    big, small = np.zeros(rows * kd, F16), np.zeros(rows * kd, F16)
    inv_t = np.ones(rows, F32)
    for n in range(rows):
        pairs = {}
        for c in range(kd // 8):
            for q in range(4):
                k = 8 * c + 2 * q
                p = physical_k(k) if permute else k
                pairs[k] = w[n, p:p + 2] if n < n_valid else np.zeros(2, F32)
        t = pow2_scale(float(max(np.abs(v).max() for v in pairs.values())))
        inv_t[n] = F32(1) / t
        for k, v in pairs.items():
            for e in range(2):
                s = F32(v[e] * t)
                b = F16(s)
                big[core_offset_h(n, k + e, rows)] = b
                small[core_offset_h(n, k + e, rows)] = F16(F32(s - F32(b)))
    return big, small, inv_t


def b_operand(piece: np.ndarray, rows: int, kd: int) -> np.ndarray:
    """B [rows x kd] as the modelled descriptor reads it, k16 step by step."""
    raw = piece.view(np.uint8)
    out = np.zeros((rows, kd), F32)
    for s in range(kd // 16):
        start = 2 * s * (rows // 8) * 64 * 2  # f16_desc(wb + kb), kb in halves
        for n in range(rows):
            for k in range(16):
                at = start + (k // 8) * rows * 16 + (n // 8) * 128 + (n % 8) * 16 + (k % 8) * 2
                out[n, 16 * s + k] = F32(raw[at:at + 2].view(F16)[0])
    return out


def a_operand(frags: dict, kd: int) -> np.ndarray:
    """A [64 x kd] from every thread's fragments: frags[(warp, lane)] = [steps][4] pairs."""
    a = np.zeros((ROWS, kd), F32)
    for (w, lane), steps in frags.items():
        g, t = lane // 4, lane % 4
        for s, regs in enumerate(steps):
            for q, (lo, hi) in enumerate(regs):
                r = 16 * w + g + 8 * (q & 1)
                c = 16 * s + 2 * t + 8 * (q >> 1)
                a[r, c], a[r, c + 1] = lo, hi
    return a


def split_pair(lo: F32, hi: F32):
    b = (F16(lo), F16(hi))
    return b, (F16(F32(lo - F32(b[0]))), F16(F32(hi - F32(b[1]))))


def products(big_a: np.ndarray, small_a: np.ndarray, wb: np.ndarray, ws: np.ndarray) -> np.ndarray:
    """products_f16: small.big + big.small + big.big a k16 step, float32 sums in that order."""
    d = np.zeros((big_a.shape[0], wb.shape[0]), F32)
    for s in range(big_a.shape[1] // 16):
        k = slice(16 * s, 16 * s + 16)
        for a, b in ((small_a, wb), (big_a, ws), (big_a, wb)):
            d += (a[:, k].astype(np.float64) @ b[:, k].T.astype(np.float64)).astype(F32)
    return d


def main() -> None:
    rng = np.random.default_rng(7)
    h_t = rng.standard_normal((ROWS, D)).astype(F32) * np.exp2(rng.integers(-6, 6, (ROWS, 1))
                                                                 ).astype(F32)
    w1 = (rng.standard_normal((F, D)) / np.sqrt(D)).astype(F32)
    b1 = rng.standard_normal(F).astype(F32) * F32(0.1)
    w2 = (rng.standard_normal((HA, F)) / np.sqrt(F)).astype(F32)
    b2 = rng.standard_normal(HA).astype(F32)
    w1b, w1s, inv_t1 = stage(w1, F, D, True, F)
    w2b, w2s, inv_t2 = stage(w2, N2, F, False, HA)
    # rows_f16: each thread's float4s at physical 16s + 4t of rows g, g + 8
    frags_b, frags_s, sc = {}, {}, np.zeros(ROWS, F32)
    for w in range(4):
        for lane in range(32):
            g, t = lane // 4, lane % 4
            rows = [16 * w + g, 16 * w + g + 8]
            top = [max(float(np.abs(h_t[r, 16 * s + 4 * q:16 * s + 4 * q + 4]).max())
                       for s in range(D // 16) for q in range(4)) for r in rows]
            scale = [pow2_scale(x) for x in top]  # the quad's max: the whole row's
            for h in range(2):
                sc[rows[h]] = scale[h]
            bs, ss = [], []
            for s in range(D // 16):
                u, v = (h_t[r, 16 * s + 4 * t:16 * s + 4 * t + 4] * scale[i]
                        for i, r in enumerate(rows))
                pairs = [split_pair(u[0], u[1]), split_pair(v[0], v[1]),
                         split_pair(u[2], u[3]), split_pair(v[2], v[3])]
                bs.append([p[0] for p in pairs])
                ss.append([p[1] for p in pairs])
            frags_b[(w, lane)], frags_s[(w, lane)] = bs, ss
    d = products(a_operand(frags_b, D), a_operand(frags_s, D), b_operand(w1b, F, D),
                 b_operand(w1s, F, D))
    hidden = np.maximum(d * (F32(1) / sc)[:, None] * inv_t1[None, :] + b1, 0).astype(F32)
    # acc_f16: the next A fragments from the accumulator fragment, in place
    frags_b, frags_s, sh = {}, {}, np.zeros(ROWS, F32)
    for w in range(4):
        for lane in range(32):
            g, t = lane // 4, lane % 4
            frag = np.zeros(64, F32)  # d[4j + 2h + e] = (row g + 8h, column 8j + 2t + e)
            for j in range(F // 8):
                for h in range(2):
                    for e in range(2):
                        frag[4 * j + 2 * h + e] = hidden[16 * w + g + 8 * h, 8 * j + 2 * t + e]
            scale = [pow2_scale(float(np.abs(hidden[16 * w + g + 8 * h]).max())) for h in range(2)]
            for h in range(2):
                sh[16 * w + g + 8 * h] = scale[h]
            bs, ss = [], []
            for s in range(F // 16):
                pairs = [split_pair(F32(frag[8 * s + 2 * q] * scale[q & 1]),
                                    F32(frag[8 * s + 2 * q + 1] * scale[q & 1])) for q in range(4)]
                bs.append([p[0] for p in pairs])
                ss.append([p[1] for p in pairs])
            frags_b[(w, lane)], frags_s[(w, lane)] = bs, ss
    d2 = products(a_operand(frags_b, F), a_operand(frags_s, F), b_operand(w2b, N2, F),
                  b_operand(w2s, N2, F))
    logits = (d2[:, :HA] * (F32(1) / sh)[:, None] * inv_t2[None, :HA] + b2).astype(F32)
    want = ref.frdhead_forward(h_t, w1, b1, w2.reshape(5, 21, F), b2.reshape(5, 21))
    want32 = ref.frdhead_forward(h_t, w1, b1, w2.reshape(5, 21, F), b2.reshape(5, 21),
                                 dtype=np.float32)
    for name, got, r64, r32 in (("hidden", hidden, want[0], want32[0]),
                                ("logits", logits, want[1].reshape(ROWS, HA),
                                 want32[1].reshape(ROWS, HA))):
        c = compare(got, r64, r32)
        print(f"{name}: {'pass' if c['passed'] else 'FAIL'}  max_rel_err {c['max_rel_err']:.2e}  "
              f"{c['max_abs_err'] / c['ref32_abs_err']:.1f}x float32's error")


if __name__ == "__main__":
    main()
