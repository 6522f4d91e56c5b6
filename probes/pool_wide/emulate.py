"""wide.cu's third version (wide_forward_rows, wide_backward_rows), its fourth
(wide_forward_dsplit, wide_backward_dsplit) and its fifth (wide_forward_whole,
wide_backward_whole) emulated on the CPU, lane by lane, to check their fragment indexing,
softmax and shared-memory hand-offs against the float64 reference before any GPU time: each
mma.sync m16n8k8 is rebuilt from the 32 lanes' registers by the PTX layouts (A: a0 (g, t),
a1 (g+8, t), a2 (g, t+4), a3 (g+8, t+4); B: b0 (t, g), b1 (t+4, g); C: c0 (g, 2t), c1 (g, 2t+1),
c2 (g+8, 2t), c3 (g+8, 2t+1)), in float64 with the operand split left out (big = x, small = 0,
so the three products are the exact one). The loops follow the kernel's, one warp at a time.

    python probes/pool_wide/emulate.py
"""
from __future__ import annotations

import itertools

import numpy as np

from pycuda_heads import reference as ref

LANE = np.arange(32)
G, T = LANE // 4, LANE % 4


def mma(c: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """c [4, 32] += A B from a [4, 32] and b [2, 32] as the lanes hold them."""
    A, B, C = np.zeros((16, 8)), np.zeros((8, 8)), np.zeros((16, 8))
    A[G, T], A[G + 8, T], A[G, T + 4], A[G + 8, T + 4] = a
    B[T, G], B[T + 4, G] = b
    C[G, 2 * T], C[G, 2 * T + 1], C[G + 8, 2 * T], C[G + 8, 2 * T + 1] = c
    D = C + A @ B
    return np.stack([D[G, 2 * T], D[G, 2 * T + 1], D[G + 8, 2 * T], D[G + 8, 2 * T + 1]])


def quad(v: np.ndarray, op) -> np.ndarray:
    """group_max<4> / group_sum<4>: the xor-2 then xor-1 butterfly of each quad."""
    for o in (2, 1):
        v = op(v, v[LANE ^ o])
    return v


def rows_scores(x: np.ndarray, ls: np.ndarray) -> np.ndarray:
    """rows_scores: S [16 x KC] = X_w [16 x D] . ln_chunk^T in the accumulator layout."""
    kc, d = ls.shape
    s = np.zeros((kc // 8, 4, 32))
    for k0 in range(0, d, 8):
        a = np.stack([x[G, k0 + 2 * T], x[G + 8, k0 + 2 * T], x[G, k0 + 2 * T + 1],
                      x[G + 8, k0 + 2 * T + 1]])
        for j in range(kc // 8):
            s[j] = mma(s[j], a, np.stack([ls[8 * j + G, k0 + 2 * T],
                                          ls[8 * j + G, k0 + 2 * T + 1]]))
    return s


def rows_times_ln(acc: np.ndarray, s: np.ndarray, ls: np.ndarray) -> None:
    """rows_times_ln: acc [16 x D] += P . ln_chunk, P the accumulators s as A fragments."""
    for kk in range(s.shape[0]):
        a = np.stack([s[kk, 0], s[kk, 2], s[kk, 1], s[kk, 3]])
        for j in range(acc.shape[0]):
            acc[j] = mma(acc[j], a, np.stack([ls[8 * kk + 2 * T, 8 * j + G],
                                              ls[8 * kk + 2 * T + 1, 8 * j + G]]))


def warp_rows(q: np.ndarray, ln: np.ndarray, h0: int, kc: int, scale: float
              ) -> tuple[np.ndarray, np.ndarray]:
    """One warp's 16 horizons of one batch row: (ctx [16, D], attn [16, K])."""
    k_, d = ln.shape
    nck, ntk, ntd = -(-k_ // kc), kc // 8, d // 8
    kp = nck * kc
    sw = np.full((16, kp), np.nan)
    acc = np.zeros((ntd, 4, 32))
    m, l = np.full((2, 32), -np.inf), np.zeros((2, 32))
    for c in range(nck):
        c0 = c * kc
        ls = np.zeros((kc, d))  # the ring slot: keys past K are zeros
        ls[:max(0, min(kc, k_ - c0))] = ln[c0:c0 + kc]
        s = rows_scores(q[h0:h0 + 16], ls)
        mx = np.full((2, 32), -np.inf)
        for j in range(ntk):
            for e in range(4):
                key = c0 + 8 * j + 2 * T + e % 2
                v = np.where(key < k_, s[j, e] * scale, -np.inf)
                s[j, e] = v
                sw[G + 8 * (e // 2), key] = v
                mx[e // 2] = np.maximum(mx[e // 2], v)
        alpha = np.zeros((2, 32))
        for r in range(2):
            mx[r] = quad(mx[r], np.maximum)
            m_new = np.maximum(m[r], mx[r])
            alpha[r] = np.exp(m[r] - m_new)
            m[r] = m_new
        total = np.zeros((2, 32))
        for j in range(ntk):
            for e in range(4):
                s[j, e] = np.exp(s[j, e] - m[e // 2])
                total[e // 2] += s[j, e]
        for r in range(2):
            l[r] = l[r] * alpha[r] + quad(total[r], np.add)
        for e in range(4):
            acc[:, e] *= alpha[e // 2]
        rows_times_ln(acc, s, ls)
    ctx = np.zeros((16, d))
    for j in range(ntd):
        for r in range(2):
            ctx[G + 8 * r, 8 * j + 2 * T] = acc[j, 2 * r] / l[r]
            ctx[G + 8 * r, 8 * j + 2 * T + 1] = acc[j, 2 * r + 1] / l[r]
    attn = np.zeros((16, k_))
    for e0 in range(0, 16 * k_, 32):
        e = np.minimum(e0 + LANE, 16 * k_ - 1)
        h, k = e // k_, e % k_
        src = 4 * (h % 8)
        mh, lh = np.where(h < 8, m[0][src], m[1][src]), np.where(h < 8, l[0][src], l[1][src])
        ok = e0 + LANE < 16 * k_
        attn[h[ok], k[ok]] = (np.exp(sw[h, k] - mh) / lh)[ok]
    return ctx, attn


def block_rows_backward(q: np.ndarray, ln: np.ndarray, attn: np.ndarray, gctx: np.ndarray,
                        ctx: np.ndarray, kc: int, scale: float) -> tuple[np.ndarray, np.ndarray]:
    """One block's rows (every batch row here): (its grad_q_h partial [H, D], grad_ln)."""
    nb, k_, d = ln.shape
    h_all = q.shape[0]
    warps, nck, ntk, ntd = h_all // 16, -(-k_ // kc), kc // 8, d // 8
    mt_l = kc // (16 * warps)
    accq = np.zeros((warps, ntd, 4, 32))
    grad_ln = np.full((nb, k_, d), np.nan)
    for b in range(nb):
        c = np.zeros((warps, 2, 32))
        for ck in range(nck):
            c0 = ck * kc
            ls = np.zeros((kc, d))
            ls[:max(0, min(kc, k_ - c0))] = ln[b, c0:c0 + kc]
            sds = np.full((h_all, kc), np.nan)
            for w in range(warps):
                h0 = 16 * w
                if c0 == 0:
                    for r in range(2):
                        part = np.zeros(32)
                        for dd in range(0, d, 4):
                            part += gctx[b, h0 + G + 8 * r, dd + T] * ctx[b, h0 + G + 8 * r, dd + T]
                        c[w, r] = quad(part, np.add)
                s = rows_scores(gctx[b, h0:h0 + 16], ls)
                for j in range(ntk):
                    for e in range(4):
                        hr, key = h0 + G + 8 * (e // 2), 8 * j + 2 * T + e % 2
                        ok = c0 + key < k_
                        av = np.where(ok, attn[b, hr, np.minimum(c0 + key, k_ - 1)], 0.0)
                        s[j, e] = scale * av * (s[j, e] - c[w, e // 2])
                        sds[hr, key] = s[j, e]
                rows_times_ln(accq[w], s, ls)
            for w in range(warps):  # after the barrier: warp w's keys over every horizon
                for i in range(mt_l):
                    k1 = (w * mt_l + i) * 16 + G
                    accl = np.zeros((ntd, 4, 32))
                    for kk in range(2 * h_all // 8):
                        sd_part = kk >= h_all // 8
                        h = 8 * kk - (h_all if sd_part else 0) + 2 * T
                        x = []
                        for e in range(4):
                            key, hh = k1 + 8 * (e % 2), h + e // 2
                            if sd_part:
                                x.append(sds[hh, key])
                            else:
                                ok = c0 + key < k_
                                x.append(np.where(ok, attn[b, hh, np.minimum(c0 + key, k_ - 1)],
                                                  0.0))
                        src = q if sd_part else gctx[b]
                        for j in range(ntd):
                            bm = np.stack([src[h, 8 * j + G], src[h + 1, 8 * j + G]])
                            accl[j] = mma(accl[j], np.stack(x), bm)
                    for r in range(2):
                        key = c0 + k1 + 8 * r
                        for j in range(ntd):
                            ok = key < k_
                            grad_ln[b, key[ok], (8 * j + 2 * T)[ok]] = accl[j, 2 * r][ok]
                            grad_ln[b, key[ok], (8 * j + 2 * T + 1)[ok]] = accl[j, 2 * r + 1][ok]
    grad_q = np.zeros((h_all, d))
    for w in range(warps):
        for j in range(ntd):
            for r in range(2):
                grad_q[16 * w + G + 8 * r, 8 * j + 2 * T] = accq[w, j, 2 * r]
                grad_q[16 * w + G + 8 * r, 8 * j + 2 * T + 1] = accq[w, j, 2 * r + 1]
    return grad_q, grad_ln


def dsplit_shares(x: np.ndarray, ls: np.ndarray, dc: int) -> np.ndarray:
    """dsplit_scores: every warp's share of ln_chunk . X^T, then the sum in warp order, in the
    accumulator layout [NH8, 4, 32] (the same in every warp)."""
    d, nh8 = ls.shape[1], x.shape[0] // 8
    share = np.full((d // dc, 16, x.shape[0]), np.nan)
    for w in range(d // dc):
        s = np.zeros((nh8, 4, 32))
        for k0 in range(w * dc, (w + 1) * dc, 8):
            a = np.stack([ls[G, k0 + 2 * T], ls[G + 8, k0 + 2 * T], ls[G, k0 + 2 * T + 1],
                          ls[G + 8, k0 + 2 * T + 1]])
            for j in range(nh8):
                s[j] = mma(s[j], a, np.stack([x[8 * j + G, k0 + 2 * T],
                                              x[8 * j + G, k0 + 2 * T + 1]]))
        for j in range(nh8):
            for e in range(4):
                share[w, G + 8 * (e // 2), 8 * j + 2 * T + e % 2] = s[j, e]
    out = np.zeros((nh8, 4, 32))
    for j in range(nh8):
        for e in range(4):
            for u in range(d // dc):
                out[j, e] = out[j, e] + share[u, G + 8 * (e // 2), 8 * j + 2 * T + e % 2]
    return out


def dsplit_times(acc: np.ndarray, yw: np.ndarray, ls: np.ndarray, d0: int) -> None:
    """dsplit_times: acc [MT_D, NH8, 4, 32] += ln_chunk[:, cols]^T . Y, Y the warp's copy."""
    for kk in range(2):
        bm = [np.stack([yw[8 * kk + 2 * T, 8 * j + G], yw[8 * kk + 2 * T + 1, 8 * j + G]])
              for j in range(acc.shape[1])]
        for i in range(acc.shape[0]):
            a = np.stack([ls[8 * kk + 2 * T, d0 + 16 * i + G],
                          ls[8 * kk + 2 * T, d0 + 16 * i + G + 8],
                          ls[8 * kk + 2 * T + 1, d0 + 16 * i + G],
                          ls[8 * kk + 2 * T + 1, d0 + 16 * i + G + 8]])
            for j in range(acc.shape[1]):
                acc[i, j] = mma(acc[i, j], a, bm[j])


def block_dsplit(q: np.ndarray, ln: np.ndarray, dc: int, scale: float
                 ) -> tuple[np.ndarray, np.ndarray]:
    """wide_forward_dsplit on one batch row: (ctx [H, D], attn [H, K])."""
    k_, d = ln.shape
    h_all = q.shape[0]
    warps, nh8, mt_d = d // dc, h_all // 8, dc // 16
    kp = -(-k_ // 16) * 16
    sraw = np.full((h_all, kp), np.nan)
    acc = np.zeros((warps, mt_d, nh8, 4, 32))
    m, l = np.full((nh8, 2, 32), -np.inf), np.zeros((nh8, 2, 32))  # the same in every warp
    for c0 in range(0, k_, 16):
        ls = np.zeros((16, d))
        ls[:min(16, k_ - c0)] = ln[c0:c0 + 16]
        s = dsplit_shares(q, ls, dc)
        for j in range(nh8):
            for e in range(4):
                key, h = G + 8 * (e // 2), 8 * j + 2 * T + e % 2
                s[j, e] = np.where(c0 + key < k_, s[j, e] * scale, -np.inf)
                sraw[h, c0 + key] = s[j, e]
        alpha = np.zeros((nh8, 2, 32))
        for j in range(nh8):
            for c in range(2):
                mx = np.maximum(s[j, c], s[j, c + 2])
                for o in (4, 8, 16):
                    mx = np.maximum(mx, mx[LANE ^ o])
                m_new = np.maximum(m[j, c], mx)
                alpha[j, c] = np.exp(m[j, c] - m_new)
                m[j, c] = m_new
                s[j, c] = np.exp(s[j, c] - m_new)
                s[j, c + 2] = np.exp(s[j, c + 2] - m_new)
                total = s[j, c] + s[j, c + 2]
                for o in (4, 8, 16):
                    total = total + total[LANE ^ o]
                l[j, c] = l[j, c] * alpha[j, c] + total
        pw = np.full((16, h_all), np.nan)
        for j in range(nh8):
            for e in range(4):
                pw[G + 8 * (e // 2), 8 * j + 2 * T + e % 2] = s[j, e]
        for w in range(warps):
            for e in range(4):
                acc[w, :, :, e] *= alpha[:, e % 2]
            dsplit_times(acc[w], pw, ls, w * dc)
    ctx = np.full((h_all, d), np.nan)
    for w in range(warps):
        for i in range(mt_d):
            for j in range(nh8):
                for e in range(4):
                    ctx[8 * j + 2 * T + e % 2, w * dc + 16 * i + G + 8 * (e // 2)] = \
                        acc[w, i, j, e] / l[j, e % 2]
    attn = np.full((h_all, k_), np.nan)
    for e0 in range(0, h_all * k_, 32):
        e = np.minimum(e0 + LANE, h_all * k_ - 1)
        h, k = e // k_, e % k_
        mh, lh = np.zeros(32), np.ones(32)
        for j in range(nh8):
            for c in range(2):
                mv, lv = m[j, c][(h % 8) // 2], l[j, c][(h % 8) // 2]
                sel = (h // 8 == j) & (h % 2 == c)
                mh, lh = np.where(sel, mv, mh), np.where(sel, lv, lh)
        ok = e0 + LANE < h_all * k_
        attn[h[ok], k[ok]] = (np.exp(sraw[h, k] - mh) / lh)[ok]
    return ctx, attn


def block_dsplit_backward(q: np.ndarray, ln: np.ndarray, attn: np.ndarray, gctx: np.ndarray,
                          ctx: np.ndarray, dc: int, scale: float) -> tuple[np.ndarray, np.ndarray]:
    """wide_backward_dsplit over every batch row in one block: (grad_q_h partial, grad_ln)."""
    nb, k_, d = ln.shape
    h_all = q.shape[0]
    warps, nh8, mt_d = d // dc, h_all // 8, dc // 16
    accq = np.zeros((warps, mt_d, nh8, 4, 32))
    grad_ln = np.full((nb, k_, d), np.nan)
    for b in range(nb):
        c = np.zeros((nh8, 2, 32))
        for j in range(nh8):
            for cc in range(2):
                h = 8 * j + 2 * T + cc
                v = np.zeros(32)
                for dd in range(0, d, 8):
                    v = v + gctx[b, h, dd + G] * ctx[b, h, dd + G]
                for o in (4, 8, 16):
                    v = v + v[LANE ^ o]
                c[j, cc] = v
        for c0 in range(0, k_, 16):
            ls = np.zeros((16, d))
            ls[:min(16, k_ - c0)] = ln[b, c0:c0 + 16]
            dw = dsplit_shares(gctx[b], ls, dc)
            for w in range(warps):
                d0 = w * dc
                s, a = np.zeros((nh8, 4, 32)), np.zeros((nh8, 4, 32))
                yw = np.full((16, h_all), np.nan)
                for j in range(nh8):
                    for e in range(4):
                        key, h = G + 8 * (e // 2), 8 * j + 2 * T + e % 2
                        ok = c0 + key < k_
                        a[j, e] = np.where(ok, attn[b, h, np.minimum(c0 + key, k_ - 1)], 0.0)
                        s[j, e] = scale * a[j, e] * (dw[j, e] - c[j, e % 2])
                        yw[key, h] = s[j, e]
                dsplit_times(accq[w], yw, ls, d0)
                accl = np.zeros((dc // 8, 4, 32))
                for part in range(2):
                    for j in range(nh8):
                        x = s[j] if part else a[j]
                        frag = np.stack([x[0], x[2], x[1], x[3]])
                        src = q if part else gctx[b]
                        for n in range(dc // 8):
                            bm = np.stack([src[8 * j + 2 * T, d0 + 8 * n + G],
                                           src[8 * j + 2 * T + 1, d0 + 8 * n + G]])
                            accl[n] = mma(accl[n], frag, bm)
                for r in range(2):
                    key = c0 + G + 8 * r
                    ok = key < k_
                    for n in range(dc // 8):
                        grad_ln[b, key[ok], (d0 + 8 * n + 2 * T)[ok]] = accl[n, 2 * r][ok]
                        grad_ln[b, key[ok], (d0 + 8 * n + 2 * T + 1)[ok]] = accl[n, 2 * r + 1][ok]
    grad_q = np.full((h_all, d), np.nan)
    for w in range(warps):
        for i in range(mt_d):
            for j in range(nh8):
                for e in range(4):
                    grad_q[8 * j + 2 * T + e % 2, w * dc + 16 * i + G + 8 * (e // 2)] = \
                        accq[w, i, j, e]
    return grad_q, grad_ln


class Whole:
    """The fifth version's block over flat shared memory (NaN where nothing was written, so a
    read of padding or of a stale row shows in the result), with tf32_mma.cuh's warp_mma."""

    def __init__(self, h: int, d: int, warps: int, kmax: int, sns: int, gn: int, qg: int
                 ) -> None:
        self.h, self.d, self.warps, self.kmax, self.sns, self.gn = h, d, warps, kmax, sns, gn
        self.ldw, self.ldk, self.cm, self.qg = d + 4, kmax + 4, d // (16 * warps), qg
        self.ldx, self.xrows = (d, 0) if qg else (d + 4, h)

    def staged(self, smem: int, src: np.ndarray) -> tuple[np.ndarray, int]:
        """Shared memory of `smem` floats (NaN), and where the products read src: after it as
        global memory (QG 1; rows D apart), else its first rows (src fetched there)."""
        if self.qg:
            return np.r_[np.full(smem, np.nan), src.ravel()], smem
        mem = np.full(smem, np.nan)
        self.fetch_rows(mem, 0, src, len(src))
        return mem, 0

    def fetch_rows(self, mem: np.ndarray, dst: int, src: np.ndarray, kp: int) -> None:
        for r in range(kp):
            mem[dst + r * self.ldw:dst + r * self.ldw + self.d] = src[r] if r < len(src) else 0

    def pair(self, mem: np.ndarray, base: int, km: bool, ld: int, i: np.ndarray, k: np.ndarray
             ) -> tuple[np.ndarray, np.ndarray]:
        if km:
            return mem[base + k * ld + i], mem[base + (k + 1) * ld + i]
        return mem[base + i * ld + k], mem[base + i * ld + k + 1]

    def warp_mma(self, acc: np.ndarray, mem: np.ndarray, a: int, b: int, ks: int, ka: bool,
                 lda: int, kb: bool, ldb: int) -> None:
        """acc [MT, NT, 4, 32] += A . B as warp_mma<MT, NT, KS, KA, LDA, KB, LDB> reads them."""
        mt, nt = acc.shape[:2]
        for k0 in range(0, 8 * ks, 8):
            af = np.zeros((mt, 4, 32))
            for i in range(mt):
                for hh in range(2):
                    v0, v1 = self.pair(mem, a, ka, lda, 16 * i + G + 8 * hh, k0 + 2 * T)
                    af[i, hh], af[i, hh + 2] = v0, v1
            for j in range(nt):
                bf = np.stack(self.pair(mem, b, kb, ldb, 8 * j + G, k0 + 2 * T))
                for i in range(mt):
                    acc[i, j] = mma(acc[i, j], af[i], bf)

    @staticmethod
    def each_acc(acc: np.ndarray, f) -> None:
        for i in range(acc.shape[0]):
            for j in range(acc.shape[1]):
                for e in range(4):
                    f(16 * i + G + 8 * (e // 2), 8 * j + 2 * T + e % 2, acc[i, j, e])

    def by_horizons(self, mem: np.ndarray, ls: int, xs: int, kp: int, f) -> None:
        ns = self.h // 8 // self.sns
        for w in range(self.warps):
            for it in range(w, kp // 16 * self.sns, self.warps):
                k0, h0 = it // self.sns * 16, it % self.sns * 8 * ns
                acc = np.zeros((1, ns, 4, 32))
                self.warp_mma(acc, mem, ls + k0 * self.ldw, xs + h0 * self.ldx, self.d // 8,
                              False, self.ldw, False, self.ldx)
                self.each_acc(acc, lambda m, n, v: f(k0 + m, h0 + n, v))

    def forward(self, q: np.ndarray, ln: np.ndarray, grid: int, scale: float
                ) -> tuple[np.ndarray, np.ndarray]:
        """(ctx, attn) of every row, blocks blockIdx < grid each looping over its rows."""
        h, d, ldw, ldk = self.h, self.d, self.ldw, self.ldk
        nb, k_ = ln.shape[:2]
        kp = -(-k_ // 16) * 16
        ctx, attn = np.full((nb, h, d), np.nan), np.full((nb, h, k_), np.nan)
        for blk in range(grid):
            ls = self.xrows * ldw
            ps = ls + self.kmax * ldw
            mem, qs = self.staged(ps + h * ldk, q)
            for b in range(blk, nb, grid):
                self.fetch_rows(mem, ls, ln[b], kp)

                def score(key, hh, v):
                    mem[ps + hh * ldk + key] = np.where(key < k_, v * scale, -np.inf)
                self.by_horizons(mem, ls, qs, kp, score)
                for hh in range(h):
                    row = mem[ps + hh * ldk:ps + hh * ldk + kp]
                    m = row[:k_].max()
                    p = np.exp(row[:k_] - m) / np.exp(row[:k_] - m).sum()
                    row[:k_], row[k_:] = p, 0
                    attn[b, hh] = p
                for w in range(self.warps):
                    acc = np.zeros((self.cm, h // 8, 4, 32))
                    d0 = w * 16 * self.cm
                    for k0 in range(0, kp, 16):
                        self.warp_mma(acc, mem, ls + k0 * ldw + d0, ps + k0, 2, True, ldw,
                                      False, ldk)

                    def put(m, n, v):
                        ctx[b, n, d0 + m] = v
                    self.each_acc(acc, put)
        return ctx, attn

    def backward(self, q: np.ndarray, ln: np.ndarray, attn: np.ndarray, gctx: np.ndarray,
                 grid: int, scale: float) -> tuple[np.ndarray, np.ndarray]:
        """(grad_q_h summed over the blocks' scratch rows in order, grad_ln)."""
        h, d, ldw, ldk, gn = self.h, self.d, self.ldw, self.ldk, self.gn
        nb, k_ = ln.shape[:2]
        kp = -(-k_ // 16) * 16
        grad_ln, scratch = np.full((nb, k_, d), np.nan), np.full((grid, h, d), np.nan)
        for blk in range(grid):
            ls = 2 * self.xrows * ldw
            as_, ds = ls + self.kmax * ldw, ls + self.kmax * ldw + h * ldk
            smem = ds + h * ldk
            mem, qs = self.staged(smem, q)
            if self.qg:  # every row's G after q in global memory
                mem = np.r_[mem, gctx.ravel()]
            accq = np.zeros((self.warps, self.cm, h // 8, 4, 32))
            for b in range(blk, nb, grid):
                self.fetch_rows(mem, ls, ln[b], kp)
                if self.qg:
                    gs = smem + h * d + b * h * d
                else:
                    gs = self.xrows * ldw
                    self.fetch_rows(mem, gs, gctx[b], h)
                for hh in range(h):
                    mem[as_ + hh * ldk:as_ + hh * ldk + kp] = np.r_[attn[b, hh], np.zeros(kp - k_)]

                def dw(key, hh, v):
                    mem[ds + hh * ldk + key] = v
                self.by_horizons(mem, ls, gs, kp, dw)
                for hh in range(h):
                    a = mem[as_ + hh * ldk:as_ + hh * ldk + kp]
                    sd = mem[ds + hh * ldk:ds + hh * ldk + kp]
                    sd[:] = scale * a * (sd - (a * sd).sum())
                for w in range(self.warps):
                    for it in range(w, kp // 16 * (d // (8 * gn)), self.warps):
                        k0, n0 = it // (d // (8 * gn)) * 16, it % (d // (8 * gn)) * 8 * gn
                        acc = np.zeros((1, gn, 4, 32))
                        self.warp_mma(acc, mem, as_ + k0, gs + n0, h // 8, True, ldk, True,
                                      self.ldx)
                        self.warp_mma(acc, mem, ds + k0, qs + n0, h // 8, True, ldk, True,
                                      self.ldx)

                        def put(m, n, v):
                            ok = k0 + m < k_
                            grad_ln[b, (k0 + m)[ok], (n0 + n)[ok]] = v[ok]
                        self.each_acc(acc, put)
                    d0 = w * 16 * self.cm
                    for k0 in range(0, kp, 16):
                        self.warp_mma(accq[w], mem, ls + k0 * ldw + d0, ds + k0, 2, True, ldw,
                                      False, ldk)
            for w in range(self.warps):
                def keep(m, n, v):
                    scratch[blk, n, w * 16 * self.cm + m] = v
                self.each_acc(accq[w], keep)
        return scratch.sum(axis=0), grad_ln


def main() -> None:
    rng = np.random.default_rng(1)
    for h, d, k, kc in ((16, 16, 20, 16), (32, 24, 64, 32), (16, 8, 1, 16), (32, 16, 100, 64)):
        q = rng.standard_normal((h, d))
        ln = rng.standard_normal((2, k, d))
        want_ctx, want_attn = ref.pool_forward(q, ln)
        scale = 1 / np.sqrt(d)
        err = 0.0
        for b in range(2):
            for h0 in range(0, h, 16):
                ctx, attn = warp_rows(q, ln[b], h0, kc, scale)
                err = max(err, np.abs(ctx - want_ctx[b, h0:h0 + 16]).max(),
                          np.abs(attn - want_attn[b, h0:h0 + 16]).max())
        print(f"forward  H={h} D={d} K={k} KC={kc}: max abs error {err:.1e}")
        assert err < 1e-12, err
    for h, d, k, dc in ((8, 64, 20, 16), (8, 64, 33, 64), (32, 32, 16, 16), (16, 48, 1, 16)):
        q = rng.standard_normal((h, d))
        ln = rng.standard_normal((2, k, d))
        want_ctx, want_attn = ref.pool_forward(q, ln)
        err = 0.0
        for b in range(2):
            ctx, attn = block_dsplit(q, ln[b], dc, 1 / np.sqrt(d))
            assert np.isfinite(ctx).all() and np.isfinite(attn).all(), "an output nobody wrote"
            err = max(err, np.abs(ctx - want_ctx[b]).max(), np.abs(attn - want_attn[b]).max())
        print(f"dsplit   H={h} D={d} K={k} DC={dc}: max abs error {err:.1e}")
        assert err < 1e-12, err
    for h, d, k, dc in ((8, 64, 20, 16), (8, 64, 33, 64), (32, 32, 16, 16), (16, 48, 1, 16)):
        q = rng.standard_normal((h, d))
        ln = rng.standard_normal((3, k, d))
        gctx = rng.standard_normal((3, h, d))
        ctx, attn = ref.pool_forward(q, ln)
        want_q, want_ln = ref.pool_backward(q, ln, attn, gctx)
        got_q, got_ln = block_dsplit_backward(q, ln, attn, gctx, ctx, dc, 1 / np.sqrt(d))
        assert np.isfinite(got_q).all() and np.isfinite(got_ln).all(), "an output nobody wrote"
        err = max(np.abs(got_q - want_q).max(), np.abs(got_ln - want_ln).max())
        print(f"dsplit backward H={h} D={d} K={k} DC={dc}: max abs error {err:.1e}")
        assert err < 1e-12, err
    for h, d, k, kc in ((16, 16, 20, 16), (32, 24, 64, 32), (16, 8, 1, 32), (32, 16, 100, 64)):
        q = rng.standard_normal((h, d))
        ln = rng.standard_normal((3, k, d))
        gctx = rng.standard_normal((3, h, d))
        ctx, attn = ref.pool_forward(q, ln)
        want_q, want_ln = ref.pool_backward(q, ln, attn, gctx)
        got_q, got_ln = block_rows_backward(q, ln, attn, gctx, ctx, kc, 1 / np.sqrt(d))
        assert np.isfinite(got_ln).all(), "a grad_ln element nobody wrote"
        err = max(np.abs(got_q - want_q).max(), np.abs(got_ln - want_ln).max())
        print(f"backward H={h} D={d} K={k} KC={kc}: max abs error {err:.1e}")
        assert err < 1e-12, err

    for (h, d, warps, k, sns, gn, grid), qg in itertools.product(
            ((32, 32, 2, 64, 1, 2, 2), (32, 32, 2, 20, 2, 4, 3), (8, 64, 4, 1, 1, 2, 2),
             (16, 64, 4, 37, 2, 8, 1)), (0, 1)):
        q = rng.standard_normal((h, d))
        ln = rng.standard_normal((5, k, d))
        gctx = rng.standard_normal((5, h, d))
        blk = Whole(h, d, warps, -(-k // 16) * 16 + 16, sns, gn, qg)  # KMAX past the keys
        want_ctx, want_attn = ref.pool_forward(q, ln)
        ctx, attn = blk.forward(q, ln, grid, 1 / np.sqrt(d))
        want_q, want_ln = ref.pool_backward(q, ln, want_attn, gctx)
        got_q, got_ln = blk.backward(q, ln, want_attn, gctx, grid, 1 / np.sqrt(d))
        err = max(np.abs(ctx - want_ctx).max(), np.abs(attn - want_attn).max(),
                  np.abs(got_q - want_q).max(), np.abs(got_ln - want_ln).max())
        print(f"whole    H={h} D={d} K={k} WARPS={warps} SNS={sns} GN={gn} QG={qg} grid {grid}: "
              f"max abs error {err:.1e}")
        assert err < 1e-12, err

if __name__ == "__main__":
    main()
