// LAYOUT 4 (many horizons, tensor cores): a block holds a whole row of ln in shared memory (KP
// keys: K rounded up to 16, zeros past K), so the row's work is a few block-wide products with
// barriers between them, each spread over every warp, as 3xTF32 mma.sync (tf32_mma.cuh) with
// the horizons as the n dimension. Blocks loop over the rows (a grid of B, or GRID per SM).
//   S^T [KP x H]  = LN . Q^T                 a warp 16 keys at a time, every horizon; q through L1
//   P = softmax of each horizon's scores     a warp a horizon, in log2 units; attn written once
//   ctx^T [D x H] = LN^T . P^T               a warp D / NWARPS columns, every horizon
// Needs N_HORIZONS % 8 == 0 and HIDDEN_DIM % (16 * NWARPS) == 0, and shared memory for the row
// (the host's restrictions say the same).
static_assert(N_HORIZONS % 8 == 0 && HIDDEN_DIM % (16 * NWARPS) == 0, "LAYOUT 4: shape");
#define L4_NT (N_HORIZONS / 8)               // n8 tiles across the horizons
#define L4_CM (HIDDEN_DIM / (16 * NWARPS))   // a warp's m16 tiles of columns
#define L4_GN 4                              // grad_ln's n8 tiles of columns an item
// A warp's horizons in the per-horizon steps (warp + j NWARPS, j < L4_HW), all at once so that
// their shuffle reductions overlap; each horizon's sum keeps its order (lanes, then a tree)
#define L4_HW (N_HORIZONS / NWARPS)
static_assert(N_HORIZONS % NWARPS == 0, "LAYOUT 4: horizons a warp");

// Rows [0, n) of src (HIDDEN_DIM floats each) into dst, L4_LDW apart, by cp.async; rows
// [n, rows) zeros. One commit group.
__device__ __forceinline__ void l4_fetch_rows(float* dst, const float* __restrict__ src,
                                              const int n, const int rows)
{
    for (int e = threadIdx.x; e < rows * (HIDDEN_DIM / 4); e += BLOCK) {
        const int r = e / (HIDDEN_DIM / 4), c = e % (HIDDEN_DIM / 4) * 4;
        copy_async<16>(dst + r * L4_LDW + c, r < n ? src + (size_t)r * HIDDEN_DIM + c : src,
                       r < n);
    }
    copy_commit();
}

__device__ __forceinline__ void l4_wait_copies()
{
    asm volatile("cp.async.wait_group 0;\n" ::: "memory");
    __syncthreads();
}

// X^T [KP x H] = LN . X^T (X's rows ldx apart), f(key, h, value) for every key < KP
template <class F>
__device__ __forceinline__ void l4_keys_by_horizons(const float* ls, const float* x,
                                                    const int ldx, const int kp, F f)
{
    for (int k0 = threadIdx.x / 32 * 16; k0 < kp; k0 += 16 * NWARPS) {
        float acc[1][L4_NT][4];
        tf32_zero(acc);
        tf32_gemm<1, L4_NT, HIDDEN_DIM / 8, false, false>(acc, ls + k0 * L4_LDW, L4_LDW, x, ldx);
        tf32_each(acc, [&](int m, int n, float v) { f(k0 + m, n, v); });
    }
}

// acc^T [D x H] += LN^T . Y^T over the row's kp keys, the warp's L4_CM tiles of columns (Y [H]
// rows over the keys, ldy apart)
__device__ __forceinline__ void l4_columns_by_horizons(float (&acc)[L4_CM][L4_NT][4],
                                                       const float* ls, const float* y,
                                                       const int ldy, const int kp)
{
    const int d0 = threadIdx.x / 32 * 16 * L4_CM;
    for (int k0 = 0; k0 < kp; k0 += 16)
        tf32_gemm<L4_CM, L4_NT, 2, true, false>(acc, ls + k0 * L4_LDW + d0, L4_LDW, y + k0, ldy);
}

// Dynamic shared memory (floats): the row's ln [KP][L4_LDW], scores then P [N_HORIZONS][L4_LDK].
extern "C" __global__ void POOL_BOUNDS pool_forward(POOL_FORWARD_PARAMS)
{
    pdl_wait();
    extern __shared__ __align__(16) float smem[];
    float *ls = smem, *ps = ls + L4_KP * L4_LDW;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, d0 = warp * 16 * L4_CM;
    const float to_log2 = scale * LOG2E;
    const int kp = L4_KP, ldk = L4_LDK;
    for (int b = blockIdx.x; b < B; b += gridDim.x) {
        l4_fetch_rows(ls, ln + (size_t)b * K * HIDDEN_DIM, K, kp);
        l4_wait_copies();
        l4_keys_by_horizons(ls, q_h, HIDDEN_DIM, kp, [=](int key, int h, float v) {
            ps[h * ldk + key] = key < K ? v * to_log2 : -INFINITY;
        });
        __syncthreads();
        float* attnb = attn + ATTN_ROW(b);
        float top[L4_HW], sum[L4_HW];
#pragma unroll
        for (int j = 0; j < L4_HW; ++j) {
            top[j] = -INFINITY;
            sum[j] = 0.f;
        }
        for (int k = lane; k < K; k += 32)
#pragma unroll
            for (int j = 0; j < L4_HW; ++j)
                top[j] = fmaxf(top[j], ps[(warp + j * NWARPS) * ldk + k]);
#pragma unroll
        for (int j = 0; j < L4_HW; ++j) top[j] = group_max<32>(top[j]);
        for (int k = lane; k < K; k += 32)
#pragma unroll
            for (int j = 0; j < L4_HW; ++j) {
                float* e = ps + (warp + j * NWARPS) * ldk + k;
                *e = exp2f(*e - top[j]);
                sum[j] += *e;
            }
#pragma unroll
        for (int j = 0; j < L4_HW; ++j) sum[j] = warp_sum(sum[j]);
#pragma unroll
        for (int j = 0; j < L4_HW; ++j) {
            const int h = warp + j * NWARPS;
            const float inv = 1.f / sum[j];
            float* row = ps + h * ldk;
            float* ah = attnb + (size_t)h * ATTN_STRIDE;
            for (int k = lane; k < kp; k += 32) {
                const float p = k < K ? row[k] * inv : 0.f;  // P . LN needs zeros past K
                row[k] = p;
                if (k < K) ah[k] = p;
            }
#if SPLIT_COUNT > 1
            if (lane == 0) SPLIT_LSE(b, h) = (top[j] + log2f(sum[j])) / LOG2E;
#endif
        }
        __syncthreads();
        float acc[L4_CM][L4_NT][4];
        tf32_zero(acc);
        l4_columns_by_horizons(acc, ls, ps, ldk, kp);
        float* ctxb = ctx + (size_t)b * N_HORIZONS * HIDDEN_DIM + d0;
        tf32_each(acc, [=](int m, int n, float v) { ctxb[n * HIDDEN_DIM + m] = v; });
        __syncthreads();  // ls and ps are free for the next row
    }
}

// Backward, one row (the whole row's keys give c, so ctx is needed only by a split row):
//   DW^T [KP x H] = LN . G^T;  DS = scale * A * (DW + GA - c),  c = sum_k A (DW + GA)
//   grad_ln [KP x D] = A^T . G + DS^T . Q     items of 16 keys x 8 L4_GN columns over the warps
//   GQ^T [D x H] += LN^T . DS^T               the warp's columns over all its rows in registers,
//                                             gq_scratch[block] at the end (reduce_axis0 after)
// Dynamic shared memory (floats): q and G [2][N_HORIZONS][L4_LDW], the row's ln [KP][L4_LDW],
// A and DW then DS [2][N_HORIZONS][L4_LDK].
extern "C" __global__ void POOL_BOUNDS pool_backward(POOL_BACKWARD_PARAMS)
{
    pdl_wait();
    extern __shared__ __align__(16) float smem[];
    float *qs = smem, *gs = qs + N_HORIZONS * L4_LDW, *ls = gs + N_HORIZONS * L4_LDW;
    float *as = ls + L4_KP * L4_LDW, *ds = as + N_HORIZONS * L4_LDK;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, d0 = warp * 16 * L4_CM;
    constexpr int ITEMS_D = HIDDEN_DIM / (8 * L4_GN);
    l4_fetch_rows(qs, q_h, N_HORIZONS, N_HORIZONS);
    float gq[L4_CM][L4_NT][4];
    tf32_zero(gq);
    for (int b = blockIdx.x; b < B; b += gridDim.x) {
        const float* attnb = attn + ATTN_ROW(b);
        const float* gab = grad_attn ? grad_attn + ATTN_ROW(b) : nullptr;
        const float* gcb = grad_ctx + (size_t)BATCH_ROW(b) * N_HORIZONS * HIDDEN_DIM;
        for (int h = warp; h < N_HORIZONS; h += NWARPS)  // attn, zeros past K
            for (int k = lane; k < L4_KP; k += 32)
                copy_async<4>(as + h * L4_LDK + k,
                              k < K ? attnb + (size_t)h * ATTN_STRIDE + k : attnb, k < K);
        l4_fetch_rows(ls, ln + (size_t)b * K * HIDDEN_DIM, K, L4_KP);
        l4_fetch_rows(gs, gcb, N_HORIZONS, N_HORIZONS);
        l4_wait_copies();
        l4_keys_by_horizons(ls, gs, L4_LDW, L4_KP, [=](int key, int h, float v) {
            ds[h * L4_LDK + key] =
                gab && key < K ? v + gab[(size_t)h * ATTN_STRIDE + key] : v;
        });
        __syncthreads();
        float c[L4_HW];
#pragma unroll
        for (int j = 0; j < L4_HW; ++j) c[j] = 0.f;
#if SPLIT_COUNT > 1  // a split's keys are part of the row: c from the forward's ctx
        const float* cb = ctx + (size_t)BATCH_ROW(b) * N_HORIZONS * HIDDEN_DIM;
        for (int d = lane; d < HIDDEN_DIM; d += 32)
#pragma unroll
            for (int j = 0; j < L4_HW; ++j) {
                const int e = (warp + j * NWARPS) * HIDDEN_DIM + d;
                c[j] = fmaf(gcb[e], cb[e], c[j]);
            }
#pragma unroll
        for (int j = 0; j < L4_HW; ++j) {
            c[j] = warp_sum(c[j]);
            if (gab) c[j] += SPLIT_ATTN_DOT(b, warp + j * NWARPS);
        }
#else
        for (int k = lane; k < L4_KP; k += 32)  // A is 0 past K
#pragma unroll
            for (int j = 0; j < L4_HW; ++j) {
                const int e = (warp + j * NWARPS) * L4_LDK + k;
                c[j] = fmaf(as[e], ds[e], c[j]);
            }
#pragma unroll
        for (int j = 0; j < L4_HW; ++j) c[j] = warp_sum(c[j]);
#endif
        for (int k = lane; k < L4_KP; k += 32)
#pragma unroll
            for (int j = 0; j < L4_HW; ++j) {
                const int e = (warp + j * NWARPS) * L4_LDK + k;
                ds[e] = scale * as[e] * (ds[e] - c[j]);
            }
        __syncthreads();
        for (int it = warp; it < L4_KP / 16 * ITEMS_D; it += NWARPS) {
            const int k0 = it / ITEMS_D * 16, n0 = it % ITEMS_D * 8 * L4_GN;
            float acc[1][L4_GN][4];
            tf32_zero(acc);
            tf32_gemm<1, L4_GN, N_HORIZONS / 8, true, true>(acc, as + k0, L4_LDK, gs + n0, L4_LDW);
            tf32_gemm<1, L4_GN, N_HORIZONS / 8, true, true>(acc, ds + k0, L4_LDK, qs + n0, L4_LDW);
            // a lane's elements at fixed offsets from one address (row g, columns 2t)
            float* gl = grad_ln + ((size_t)b * K + k0 + lane / 4) * HIDDEN_DIM + n0 + lane % 4 * 2;
            tf32_each(acc, [=](int m, int n, float v) {
                if (k0 + m < K) gl[(m - lane / 4) * HIDDEN_DIM + n - lane % 4 * 2] = v;
            });
        }
        l4_columns_by_horizons(gq, ls, ds, L4_LDK, L4_KP);
        __syncthreads();  // ls, gs, as and ds are free for the next row
    }
    float* row = gq_scratch + (size_t)blockIdx.x * N_HORIZONS * HIDDEN_DIM + d0;
    tf32_each(gq, [=](int m, int n, float v) { row[n * HIDDEN_DIM + m] = v; });
}
