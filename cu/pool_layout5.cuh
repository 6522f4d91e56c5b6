// LAYOUT 5 (wide rows, tensor cores): ln streamed through a ring of STAGES slots of L5_KC keys
// (cp.async), so a row need not fit shared memory. A block walks its rows (a grid of B, or GRID
// per SM) as one sequence of slots, and the ring runs on across rows. Per slot, as 3xTF32
// mma.sync (tf32_mma.cuh) with the horizons as the n dimension:
//   forward   S^T [KC x H] = LN . Q^T   the warps split D, their partial sums added in warp order
//             online softmax           a warp a horizon: running max and sum in its registers,
//                                      raw scores to attn (normalised at the row's end)
//             ctx^T [D x H] += LN^T . P^T   a warp its D / NWARPS columns, rescaled as the max moves
//   backward  DW^T [KC x H] = LN . G^T (split D as above); DS = scale * A * (DW + GA - c)
//             grad_ln [KC x D] = A^T . G + DS^T . Q   items of 16 keys x 8 L5_GN columns
//             GQ^T [D x H] += LN^T . DS^T             over all the block's rows, gq_scratch[block]
//   c = grad_ctx . ctx (+ sum_k attn * grad_attn); without ctx a first pass over the row's slots
//   sums it from DW, so that row's slots are visited twice.
// Needs N_HORIZONS % 8 == 0, HIDDEN_DIM % (16 * NWARPS) == 0 and shared memory for the ring
// (the host's restrictions say the same).
static_assert(N_HORIZONS % 8 == 0 && HIDDEN_DIM % (16 * NWARPS) == 0 && HIDDEN_DIM % 32 == 0,
              "LAYOUT 5: shape");
#define L5_NT (N_HORIZONS / 8)              // n8 tiles across the horizons
#define L5_CM (HIDDEN_DIM / (16 * NWARPS))  // a warp's m16 tiles of columns
#define L5_DS (HIDDEN_DIM / NWARPS)         // a warp's slice of D in the scores
#define L5_HW ((N_HORIZONS + NWARPS - 1) / NWARPS)  // a warp's horizons in the softmax
#define L5_GN 4                             // grad_ln's n8 tiles of columns an item

// Element (r, c) of a slot's ln. The forward's rows are L5_LDW floats (padded: its scores read
// single floats in the mma's k order, conflict-free). The backward's (SWZ) are HIDDEN_DIM floats,
// unpadded, so that a warp's 16-byte copies into a row fill whole 128-byte lines; in each group
// of 8 16-byte chunks, row r's chunk x sits at x ^ f(r % 8), f = 0 2 4 6 3 1 7 5. Then its
// fragment reads hit 32 banks: 4 rows' 8-byte pairs of two chunks (rows 0-3 or 4-7: f's bits 1-2
// differ; padded rows conflict two ways) and the single floats of 2 chunks at rows 2t + e of a
// k-step (again bits 1-2). Swizzled, the forward measured slower (104 against 91 us at H=8,
// D=512; its scores read no pairs), so it keeps padded rows.
template <bool SWZ>
__device__ __forceinline__ int l5_at(const int r, const int c)
{
    if constexpr (SWZ) {
        const int q = r & 3, h = r >> 2 & 1;
        return r * HIDDEN_DIM + ((c >> 2 ^ (2 * (q ^ h) + h)) << 2) + (c & 3);
    } else {
        return r * L5_LDW + c;
    }
}
// Elements (r, c) and (r, c + 1) of a swizzled slot ls, c even (one chunk); (k, c) and (k + 1, c).
__device__ __forceinline__ float2 l5_row_pair(const float* ls, const int r, const int c)
{
    return *reinterpret_cast<const float2*>(ls + l5_at<true>(r, c));
}
__device__ __forceinline__ float2 l5_col_pair(const float* ls, const int k, const int c)
{
    return make_float2(ls[l5_at<true>(k, c)], ls[l5_at<true>(k + 1, c)]);
}

// Keys [k0, k0 + L5_KC) of a row's ln (zeros past K) into a slot (l5_at). Where a key's float4s
// divide the block, a thread's copies share one column, rows BLOCK / (D / 4) apart.
template <bool SWZ>
__device__ __forceinline__ void l5_fetch_keys(float* dst, const float* __restrict__ lnb,
                                              const int k0, const int K)
{
    constexpr int f4 = HIDDEN_DIM / 4, n = L5_KC * f4;
    if constexpr (BLOCK % f4 == 0) {
        constexpr int rs = BLOCK / f4;
        const int r0 = threadIdx.x / f4, c = threadIdx.x % f4 * 4;
        const float* src = lnb + (size_t)(k0 + r0) * HIDDEN_DIM + c;
        const int left = K - k0 - r0;  // this thread's rows i rs below K: i rs < left
#pragma unroll
        for (int i = 0; i < (n + BLOCK - 1) / BLOCK; ++i) {
            if (n % BLOCK != 0 && r0 + i * rs >= L5_KC) break;
            const bool valid = i * rs < left;
            copy_async<16>(dst + l5_at<SWZ>(r0 + i * rs, c),
                           valid ? src + (size_t)i * rs * HIDDEN_DIM : lnb, valid);
        }
    } else {
        for (int e = threadIdx.x; e < n; e += BLOCK) {
            const int r = e / f4, c = e % f4 * 4;
            const bool valid = k0 + r < K;
            copy_async<16>(dst + l5_at<SWZ>(r, c),
                           valid ? lnb + (size_t)(k0 + r) * HIDDEN_DIM + c : lnb, valid);
        }
    }
}

// acc (a warp's L5_CM m16 tiles of D from d0, n8 tiles of horizons) += LN^T B over the
// swizzled slot's L5_KC keys: the backward's GQ, B's horizons ldb floats apart by key.
template <int NT>
__device__ __forceinline__ void l5_slot_columns(float (&acc)[L5_CM][NT][4], const float* ls,
                                                const int d0, const float* b, const int ldb)
{
    const int g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
#pragma unroll
    for (int k0 = 0; k0 < L5_KC; k0 += 8) {
        const int k = k0 + 2 * t;
        tf32_step<L5_CM, NT>(
            acc, [&](int i, int h) { return l5_col_pair(ls, k, d0 + 16 * i + g + 8 * h); },
            [&](int j) { return tf32_pair<false>(b, ldb, 8 * j + g, k); });
    }
}

// The rows this block takes: blockIdx.x, then gridDim.x apart, below B.
__device__ __forceinline__ int l5_rows(const int B)
{
    return B > (int)blockIdx.x ? (B - 1 - (int)blockIdx.x) / (int)gridDim.x + 1 : 0;
}

// A place in the block's sequence of (row, visit) pairs, vpr visits a row: stepped, not
// divided, so that a slot costs no integer division. Slot v lands after `cp.async.wait_group
// STAGES - 2` at visit v: every visit commits one group, empty past the end.
struct L5Cursor {
    int b, rem, row;  // the batch row, the visit's place among its row's, the block's row count
    __device__ __forceinline__ void step(const int vpr)
    {
        if (++rem == vpr) {
            rem = 0;
            b += gridDim.x;
            ++row;
        }
    }
};

// The scores' partial sums of the slot ls (l5_at<SWZ>): warp w's slice of D, every horizon
// (rows of x ldx apart), into sp[w][h][key] (L5_SPK floats a horizon).
template <bool SWZ>
__device__ __forceinline__ void l5_partial_scores(float* sp, const float* ls, const float* x,
                                                  const int ldx)
{
    const int warp = threadIdx.x / 32, d0 = warp * L5_DS;
    float acc[1][L5_NT][4];
    tf32_zero(acc);
    if constexpr (SWZ) {
        const int g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
#pragma unroll 8
        for (int k0 = d0; k0 < d0 + L5_DS; k0 += 8) {
            const int k = k0 + 2 * t;
            tf32_step<1, L5_NT>(acc, [&](int, int h) { return l5_row_pair(ls, g + 8 * h, k); },
                                [&](int j) { return tf32_pair<false>(x, ldx, 8 * j + g, k); });
        }
    } else {
        tf32_gemm<1, L5_NT, L5_DS / 8, false, false>(acc, ls + d0, L5_LDW, x + d0, ldx);
    }
    float* spw = sp + warp * N_HORIZONS * L5_SPK;
    tf32_each(acc, [=](int m, int n, float v) { spw[n * L5_SPK + m] = v; });
}

// Horizon h's sum over the warps' partial sums at key k (warp order).
__device__ __forceinline__ float l5_score(const float* sp, const int h, const int k)
{
    float s = 0.f;
#pragma unroll
    for (int w = 0; w < NWARPS; ++w) s += sp[(w * N_HORIZONS + h) * L5_SPK + k];
    return s;
}

// The forward's q as the scores' B fragments of warp w's slice of D, split once a kernel (q is
// the same for every slot): L5_QF registers a lane, where they fit (else q through L1). These
// scores take the mma's own k order (fragment k = t + 4 e is column k0 + t + 4 e), not
// tf32_gemm's pairs: a slot's rows are L5_LDW = 4 (mod 32) floats apart, so a warp's single
// loads of ln hit 32 banks, where its 8-byte pairs conflicted two ways.
#define L5_QF (L5_DS / 8 * L5_NT * 4)
struct L5Queries {
    unsigned big[L5_DS / 8][L5_NT][2], small[L5_DS / 8][L5_NT][2];
};
__device__ __forceinline__ void l5_load_queries(L5Queries& qf, const float* __restrict__ q_h)
{
    const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const float* qw = q_h + threadIdx.x / 32 * L5_DS;
#pragma unroll
    for (int ks = 0; ks < L5_DS / 8; ++ks)
#pragma unroll
        for (int j = 0; j < L5_NT; ++j) {
            const float* qr = qw + (8 * j + g) * HIDDEN_DIM + 8 * ks + t;
            tf32_split(qr[0], qf.big[ks][j][0], qf.small[ks][j][0]);
            tf32_split(qr[4], qf.big[ks][j][1], qf.small[ks][j][1]);
        }
}

// l5_partial_scores with q's fragments from registers (the same order of products and sums)
__device__ __forceinline__ void l5_partial_scores_q(float* sp, const float* ls,
                                                    const L5Queries& qf)
{
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, d0 = warp * L5_DS;
    const int g = lane / 4, t = lane % 4;
    float acc[2][L5_NT][4] = {};
#pragma unroll
    for (int ks = 0; ks < L5_DS / 8; ++ks) {
        unsigned a_big[4], a_small[4];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const float* lr = ls + d0 + (g + 8 * h) * L5_LDW + 8 * ks + t;
            tf32_split(lr[0], a_big[h], a_small[h]);
            tf32_split(lr[4], a_big[h + 2], a_small[h + 2]);
        }
        float(&c)[L5_NT][4] = acc[ks % 2];
#pragma unroll
        for (int j = 0; j < L5_NT; ++j) tf32_mma(c[j], a_small, qf.big[ks][j]);
#pragma unroll
        for (int j = 0; j < L5_NT; ++j) tf32_mma(c[j], a_big, qf.small[ks][j]);
#pragma unroll
        for (int j = 0; j < L5_NT; ++j) tf32_mma(c[j], a_big, qf.big[ks][j]);
    }
    float* spw = sp + warp * N_HORIZONS * L5_SPK;
#pragma unroll
    for (int j = 0; j < L5_NT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e)
            spw[(8 * j + 2 * t + e % 2) * L5_SPK + g + 8 * (e / 2)] = acc[0][j][e] + acc[1][j][e];
}

// Dynamic shared memory (floats): the ring [STAGES][L5_KC][L5_LDW], the partial scores
// [NWARPS][N_HORIZONS][L5_SPK], P [N_HORIZONS][L5_LDK], each horizon's rescale and (at a row's
// end) sum [2][N_HORIZONS].
extern "C" __global__ void POOL_BOUNDS pool_forward(POOL_FORWARD_PARAMS)
{
    pdl_wait();
    extern __shared__ __align__(16) float smem[];
    float *ring = smem, *sp = ring + STAGES * L5_FSLOT, *ps = sp + L5_PARTS;
    float *corr = ps + N_HORIZONS * L5_LDK, *lsum = corr + N_HORIZONS;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int d0 = warp * 16 * L5_CM;
    const float to_log2 = scale * LOG2E;
    const int nch = (K + L5_KC - 1) / L5_KC;
    const int rows = l5_rows(B);
    const int visits = rows * nch;
    L5Cursor at{(int)blockIdx.x, 0, 0}, next = at;  // visit v's, and the next to fetch
    auto fetch = [&](int v) {
        if (v < visits) {
            l5_fetch_keys<false>(ring + v % STAGES * L5_FSLOT, ln + (size_t)next.b * K * HIDDEN_DIM,
                          next.rem * L5_KC, K);
            next.step(nch);
        }
        copy_commit();
    };
    for (int v = 0; v < STAGES - 1; ++v) fetch(v);

    float top[L5_HW], sum[L5_HW];  // the warp's horizons warp + j NWARPS
    float acc[L5_CM][L5_NT][4];
    L5Queries qf;
    if constexpr (L5_QF <= 32) l5_load_queries(qf, q_h);
    for (int v = 0; v < visits; v++, at.step(nch)) {
        const int k0 = at.rem * L5_KC;
        asm volatile("cp.async.wait_group %0;\n" ::"n"(STAGES - 2) : "memory");
        __syncthreads();  // slot v is in; every warp is done with visit v - 1
        fetch(v + STAGES - 1);
        const float* ls = ring + v % STAGES * L5_FSLOT;
        if (at.rem == 0) {
#pragma unroll
            for (int j = 0; j < L5_HW; ++j) {
                top[j] = -INFINITY;
                sum[j] = 0.f;
            }
            tf32_zero(acc);
        }
        if constexpr (L5_QF <= 32)
            l5_partial_scores_q(sp, ls, qf);
        else
            l5_partial_scores<false>(sp, ls, q_h, HIDDEN_DIM);
        __syncthreads();
        float* attnb = attn + ATTN_ROW(at.b);
        const bool last = at.rem == nch - 1;
#pragma unroll
        for (int j = 0; j < L5_HW; ++j) {
            const int h = warp + j * NWARPS;
            if (h >= N_HORIZONS) break;
            const int k = k0 + lane;
            const bool valid = lane < L5_KC && k < K;
            const float s = valid ? l5_score(sp, h, lane) * to_log2 : -INFINITY;
            if (valid) attnb[(size_t)h * ATTN_STRIDE + k] = s;
            const float mx = fmaxf(top[j], group_max<32>(s));
            const float p = valid ? exp2f(s - mx) : 0.f;
            const float f = top[j] == -INFINITY ? 0.f : exp2f(top[j] - mx);
            sum[j] = fmaf(sum[j], f, warp_sum(p));
            top[j] = mx;
            if (lane < L5_KC) ps[h * L5_LDK + lane] = p;
            if (lane == 0) {
                corr[h] = f;
                if (last) lsum[h] = sum[j];
            }
        }
        __syncthreads();
        tf32_each(acc, [&](int m, int n, float& v) { v *= corr[n]; });
        tf32_gemm<L5_CM, L5_NT, L5_KC / 8, true, false>(acc, ls + d0, L5_LDW, ps, L5_LDK);
        if (last) {
            float* ctxb = ctx + (size_t)at.b * N_HORIZONS * HIDDEN_DIM + d0;
            tf32_each(acc, [=](int m, int n, float& v) {
                ctxb[n * HIDDEN_DIM + m] = v / lsum[n];
            });
#pragma unroll
            for (int j = 0; j < L5_HW; ++j) {
                const int h = warp + j * NWARPS;
                if (h >= N_HORIZONS) break;
                const float inv = 1.f / sum[j];
                float* ah = attnb + (size_t)h * ATTN_STRIDE;
                for (int k = lane; k < K; k += 32) ah[k] = exp2f(ah[k] - top[j]) * inv;
#if SPLIT_COUNT > 1
                if (lane == 0) SPLIT_LSE(at.b, h) = (top[j] + log2f(sum[j])) / LOG2E;
#endif
            }
        }
    }
}

// grad_ln's q operand: the B fragments of a warp's items (columns it * 8 L5_GN on, items it =
// warp + i NWARPS), raw, L5_QB floats a lane. q is the same for every slot, so where they fit
// they are loaded once a kernel, not through L1 every slot.
#define L5_ITEMS (HIDDEN_DIM / (8 * L5_GN))
#define L5_WITEMS ((L5_ITEMS + NWARPS - 1) / NWARPS)
#define L5_QB (L5_WITEMS * (N_HORIZONS / 8) * L5_GN * 2)
__device__ __forceinline__ float2 l5_q_frag(const float* __restrict__ q_h, const int it,
                                            const int ks, const int j)
{
    const int lane = threadIdx.x % 32;
    return tf32_pair<true>(q_h + it * 8 * L5_GN, HIDDEN_DIM, 8 * j + lane / 4,
                           8 * ks + 2 * (lane % 4));
}

// Dynamic shared memory (floats): the ring [STAGES] of slots (ln [L5_KC][HIDDEN_DIM], then attn
// [N_HORIZONS][L5_LDK]); the G rows of two batch rows [2][N_HORIZONS][L5_LDW]; the partial
// products [NWARPS][N_HORIZONS][L5_SPK]; DS [N_HORIZONS][L5_LDK]; c [N_HORIZONS]. q is not in
// shared memory (registers or L1), so that two blocks of 256 fit an SM at H=8, D=512.
extern "C" __global__ void POOL_BOUNDS pool_backward(POOL_BACKWARD_PARAMS)
{
    pdl_wait();
    extern __shared__ __align__(16) float smem[];
    float *ring = smem, *gs2 = ring + STAGES * L5_BSLOT;
    float *sp = gs2 + 2 * N_HORIZONS * L5_LDW, *ds = sp + L5_PARTS;
    float *cst = ds + N_HORIZONS * L5_LDK;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int d0 = warp * 16 * L5_CM;
    const int nch = (K + L5_KC - 1) / L5_KC;
    const int passes = ctx ? 1 : 2;  // without ctx, a first pass over the slots forms c
    const int vpr = passes * nch;
    const int rows = l5_rows(B);
    const int visits = rows * vpr;
    L5Cursor at{(int)blockIdx.x, 0, 0}, next = at;  // visit v's, and the next to fetch
    // attn's rows start 16-byte aligned where K is a multiple of 4 and attn is
    const bool attn16 = K % 4 == 0 && reinterpret_cast<size_t>(attn) % 16 == 0;
    auto fetch = [&](int v) {
        if (v < visits) {
            const int k0 = (next.rem < nch ? next.rem : next.rem - nch) * L5_KC;
            float* slot = ring + v % STAGES * L5_BSLOT;
            l5_fetch_keys<true>(slot, ln + (size_t)next.b * K * HIDDEN_DIM, k0, K);
            const float* attnb = attn + ATTN_ROW(next.b);
            if (attn16) {  // a horizon's keys of the slot as 16-byte copies
                for (int e = threadIdx.x; e < N_HORIZONS * (L5_KC / 4); e += BLOCK) {
                    const int h = e / (L5_KC / 4), m = e % (L5_KC / 4) * 4, k = k0 + m;
                    copy_async<16>(slot + L5_BLN + h * L5_LDK + m,
                                   k < K ? attnb + (size_t)h * ATTN_STRIDE + k : attnb, k < K);
                }
            } else {
                for (int e = threadIdx.x; e < N_HORIZONS * L5_KC; e += BLOCK) {
                    const int h = e / L5_KC, k = k0 + e % L5_KC;
                    copy_async<4>(slot + L5_BLN + h * L5_LDK + e % L5_KC,
                                  k < K ? attnb + (size_t)h * ATTN_STRIDE + k : attnb, k < K);
                }
            }
            if (next.rem == 0) {  // the row's G, beside the previous row's
                const float* gcb = grad_ctx + (size_t)BATCH_ROW(next.b) * N_HORIZONS * HIDDEN_DIM;
                if (ctx)  // its ctx into L2, where the row's first visit reads it for c
                    for (int e = threadIdx.x; e < N_HORIZONS * HIDDEN_DIM / 32; e += BLOCK)
                        asm volatile("prefetch.global.L2 [%0];" ::"l"(
                            ctx + (size_t)BATCH_ROW(next.b) * N_HORIZONS * HIDDEN_DIM + e * 32));
                float* gs = gs2 + next.row % 2 * N_HORIZONS * L5_LDW;
                for (int e = threadIdx.x; e < N_HORIZONS * (HIDDEN_DIM / 4); e += BLOCK) {
                    const int r = e / (HIDDEN_DIM / 4), c = e % (HIDDEN_DIM / 4) * 4;
                    copy_async<16>(gs + r * L5_LDW + c, gcb + (size_t)r * HIDDEN_DIM + c, true);
                }
            }
            next.step(vpr);
        }
        copy_commit();
    };
    // slots in flight: a row of fewer than STAGES - 1 slots takes fewer, so that the G rows of
    // the row after next never land on those of a row still in use
    const int ahead = min(STAGES - 1, nch);
    for (int v = 0; v < ahead; ++v) fetch(v);

    constexpr bool q_regs = L5_QB <= 16;
    float2 qb[q_regs ? L5_WITEMS : 1][N_HORIZONS / 8][L5_GN];
    if constexpr (q_regs) {
#pragma unroll
        for (int i = 0; i < L5_WITEMS; ++i)
#pragma unroll
            for (int ks = 0; ks < N_HORIZONS / 8; ++ks)
#pragma unroll
                for (int j = 0; j < L5_GN; ++j)
                    qb[i][ks][j] = warp + i * NWARPS < L5_ITEMS
                                       ? l5_q_frag(q_h, warp + i * NWARPS, ks, j)
                                       : make_float2(0.f, 0.f);
    }
    float gq[L5_CM][L5_NT][4];
    tf32_zero(gq);
    for (int v = 0; v < visits; v++, at.step(vpr)) {
        const int k0 = (at.rem < nch ? at.rem : at.rem - nch) * L5_KC;
        const bool forming = at.rem < (passes - 1) * nch;  // the first pass without ctx
        if (ahead == STAGES - 1)
            asm volatile("cp.async.wait_group %0;\n" ::"n"(STAGES - 2) : "memory");
        else
            asm volatile("cp.async.wait_group 0;\n" ::: "memory");
        __syncthreads();  // slot v is in; every warp is done with visit v - 1
        fetch(v + ahead);
        const float* ls = ring + v % STAGES * L5_BSLOT;
        const float* as = ls + L5_BLN;
        const float* gs = gs2 + at.row % 2 * N_HORIZONS * L5_LDW;
        const float* gab = grad_attn ? grad_attn + ATTN_ROW(at.b) : nullptr;
        if (at.rem == 0) {  // c from ctx, or zero for the first pass to sum
#pragma unroll
            for (int j = 0; j < L5_HW; ++j) {
                const int h = warp + j * NWARPS;
                if (h >= N_HORIZONS) break;
                float c = 0.f;
                if (ctx) {
                    const float* cb = ctx + ((size_t)BATCH_ROW(at.b) * N_HORIZONS + h) * HIDDEN_DIM;
#pragma unroll  // every load in flight at once
                    for (int d = lane; d < HIDDEN_DIM; d += 32)
                        c = fmaf(gs[h * L5_LDW + d], cb[d], c);
#if SPLIT_COUNT == 1
                    if (gab)
                        for (int k = lane; k < K; k += 32)
                            c = fmaf(attn[ATTN_ROW(at.b) + (size_t)h * K + k],
                                     gab[(size_t)h * K + k], c);
#endif
                    c = warp_sum(c);
#if SPLIT_COUNT > 1
                    if (gab) c += SPLIT_ATTN_DOT(at.b, h);
#endif
                }
                if (lane == 0) cst[h] = c;
            }
        }
        l5_partial_scores<true>(sp, ls, gs, L5_LDW);
        __syncthreads();
        if (forming) {  // c[h] += sum over the slot's keys of A (DW + GA), a warp a horizon
#pragma unroll
            for (int j = 0; j < L5_HW; ++j) {
                const int h = warp + j * NWARPS;
                if (h >= N_HORIZONS) break;
                const int k = k0 + lane;
                float t = 0.f;
                if (lane < L5_KC && k < K)
                    t = as[h * L5_LDK + lane]
                        * (l5_score(sp, h, lane) + (gab ? gab[(size_t)h * ATTN_STRIDE + k] : 0.f));
                t = warp_sum(t);
                if (lane == 0) cst[h] += t;
            }
            continue;  // the next visit's barrier orders c and sp
        }
        for (int e = threadIdx.x; e < N_HORIZONS * L5_KC; e += BLOCK) {
            const int h = e / L5_KC, m = e % L5_KC, k = k0 + m;
            const float ga = gab && k < K ? gab[(size_t)h * ATTN_STRIDE + k] : 0.f;
            ds[h * L5_LDK + m] = scale * as[h * L5_LDK + m] * (l5_score(sp, h, m) + ga - cst[h]);
        }
        __syncthreads();
        float* glb = grad_ln + (size_t)at.b * K * HIDDEN_DIM;
#pragma unroll
        for (int i = 0; i < L5_WITEMS; ++i) {
            const int it = warp + i * NWARPS, n0 = it * 8 * L5_GN, g = lane / 4, t = lane % 4;
            if (it >= L5_ITEMS) break;
            float acc[1][L5_GN][4];
            tf32_zero(acc);
            tf32_gemm<1, L5_GN, N_HORIZONS / 8, true, true>(acc, as, L5_LDK, gs + n0, L5_LDW);
#pragma unroll
            for (int ks = 0; ks < N_HORIZONS / 8; ++ks)
                tf32_step<1, L5_GN>(
                    acc,
                    [&](int, int h) {
                        return tf32_pair<true>(ds, L5_LDK, g + 8 * h, 8 * ks + 2 * t);
                    },
                    [&](int j) {
                        if constexpr (q_regs)
                            return qb[i][ks][j];
                        else
                            return l5_q_frag(q_h, it, ks, j);
                    });
            // a lane's pairs of columns (8 j + 2 t) at rows g and g + 8: one 8-byte store each
#pragma unroll
            for (int j = 0; j < L5_GN; ++j)
#pragma unroll
                for (int r = 0; r < 2; ++r)
                    if (k0 + g + 8 * r < K)
                        *reinterpret_cast<float2*>(glb + (size_t)(k0 + g + 8 * r) * HIDDEN_DIM
                                                   + n0 + 8 * j + 2 * t) =
                            make_float2(acc[0][j][2 * r], acc[0][j][2 * r + 1]);
        }
        l5_slot_columns(gq, ls, d0, ds, L5_LDK);
    }
    float* row = gq_scratch + (size_t)blockIdx.x * N_HORIZONS * HIDDEN_DIM + d0;
    tf32_each(gq, [=](int m, int n, float& v) { row[n * HIDDEN_DIM + m] = v; });
}
