// Prototype (not shipped): the pool's LAYOUT 0 with the keys of a batch row split over SPLIT
// blocks, for long sequences at small B, where one block per batch row leaves most SMs idle
// (B=64, K=4096: 64 blocks on 132 SMs). Grid (SPLIT, B); block `split` of row b owns keys
// [split * KS, min(K, (split + 1) * KS)), KS = ceil(K / SPLIT). No atomics: per-split partials go
// to scratch and are combined in split order by a second kernel.
// Template constants as for cu/pool.cu's LAYOUT 0: N_HORIZONS, HIDDEN_DIM, BLOCK, VEC, UNROLL.
#include "heads_common.cuh"
#include "pool_common.cuh"

#define NWARPS (BLOCK / 32)
#define ROWS (N_HORIZONS * HIDDEN_DIM)

__device__ __forceinline__ void key_range(const int K, int* kb, int* ke)
{
    const int ks = (K + gridDim.x - 1) / gridDim.x;
    *kb = min(K, blockIdx.x * ks);
    *ke = min(K, *kb + ks);
}

// exp(m - top) as a weight, 0 for a part that saw no key (m = -inf)
__device__ __forceinline__ float weight(const float m, const float top)
{
    return m == -INFINITY ? 0.f : expf(m - top);
}

// Forward, pass 1: the online softmax of the block's keys, per warp, merged across warps in warp
// order. part_ml[(b * SPLIT + split) * H + h] = (max, sum); part_acc[b, split, h, :] the context
// sum against that max, unnormalised. The scaled scores go to attn, normalised by the combine.
extern "C" __global__ void __launch_bounds__(BLOCK)
pool_forward_split(const float* __restrict__ q_h, const float* __restrict__ ln,
                   float* __restrict__ attn, float* __restrict__ part_acc,
                   float2* __restrict__ part_ml, const int K, const float scale)
{
    __shared__ __align__(16) float wacc[NWARPS * ROWS];
    __shared__ float wm[NWARPS * N_HORIZONS], wl[NWARPS * N_HORIZONS];
    __shared__ float fm[N_HORIZONS], fl[N_HORIZONS];

    const int b = blockIdx.y, part = b * gridDim.x + blockIdx.x;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int kb, ke;
    key_range(K, &kb, &ke);
    const float* lnb = ln + (size_t)b * K * HIDDEN_DIM;
    float* attnb = attn + (size_t)b * N_HORIZONS * K;

    float q[N_HORIZONS][ROW_PER_LANE];
    float m[N_HORIZONS], l[N_HORIZONS], acc[N_HORIZONS][ROW_PER_LANE];
#pragma unroll
    for (int h = 0; h < N_HORIZONS; ++h) {
        load_row(q_h + h * HIDDEN_DIM, lane, q[h]);
        m[h] = -INFINITY;
        l[h] = 0.f;
#pragma unroll
        for (int j = 0; j < ROW_PER_LANE; ++j) acc[h][j] = 0.f;
    }
    for (int k0 = kb + warp * UNROLL; k0 < ke; k0 += NWARPS * UNROLL) {
        float x[UNROLL][ROW_PER_LANE];
        load_keys(lnb, k0, ke, lane, x);
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            if (k0 + u >= ke) continue;  // not break: the loop must stay fully unrolled
#pragma unroll
            for (int h = 0; h < N_HORIZONS; ++h) {
                float dot = 0.f;
#pragma unroll
                for (int j = 0; j < ROW_PER_LANE; ++j) dot = fmaf(q[h][j], x[u][j], dot);
                const float sc = warp_sum(dot) * scale;
                if (lane == 0) attnb[h * K + k0 + u] = sc;
                const float mn = fmaxf(m[h], sc);
                const float corr = __expf(m[h] - mn);
                const float p = __expf(sc - mn);
                l[h] = fmaf(l[h], corr, p);
#pragma unroll
                for (int j = 0; j < ROW_PER_LANE; ++j)
                    acc[h][j] = fmaf(acc[h][j], corr, p * x[u][j]);
                m[h] = mn;
            }
        }
    }
    if (lane == 0) {
#pragma unroll
        for (int h = 0; h < N_HORIZONS; ++h) {
            wm[warp * N_HORIZONS + h] = m[h];
            wl[warp * N_HORIZONS + h] = l[h];
        }
    }
#pragma unroll
    for (int h = 0; h < N_HORIZONS; ++h)
        store_row(wacc + (warp * N_HORIZONS + h) * HIDDEN_DIM, lane, acc[h]);
    __syncthreads();

    if (threadIdx.x < N_HORIZONS) {
        const int h = threadIdx.x;
        float top = -INFINITY;
        for (int w = 0; w < NWARPS; ++w) top = fmaxf(top, wm[w * N_HORIZONS + h]);
        float sum = 0.f;
        for (int w = 0; w < NWARPS; ++w)
            sum += wl[w * N_HORIZONS + h] * weight(wm[w * N_HORIZONS + h], top);
        fm[h] = top;
        fl[h] = sum;
        part_ml[part * N_HORIZONS + h] = make_float2(top, sum);
    }
    __syncthreads();
    float* out = part_acc + (size_t)part * ROWS;
    for (int e = threadIdx.x; e < ROWS; e += BLOCK) {
        const int h = e / HIDDEN_DIM;
        float v = 0.f;
        for (int w = 0; w < NWARPS; ++w)
            v += wacc[w * ROWS + e] * weight(wm[w * N_HORIZONS + h], fm[h]);
        out[e] = v;
    }
}

// Forward, pass 2, on the same grid: every block merges row b's SPLIT partials in split order
// (the same bits in each), normalises its own keys' scores into attn, and block 0 of the row
// writes ctx.
extern "C" __global__ void __launch_bounds__(BLOCK)
pool_forward_combine(const float* __restrict__ part_acc, const float2* __restrict__ part_ml,
                     float* __restrict__ ctx, float* __restrict__ attn, const int K)
{
    __shared__ float top[N_HORIZONS], sum[N_HORIZONS];
    const int b = blockIdx.y, nsplit = gridDim.x;
    const float2* ml = part_ml + (size_t)b * nsplit * N_HORIZONS;
    if (threadIdx.x < N_HORIZONS) {
        const int h = threadIdx.x;
        float t = -INFINITY;
        for (int s = 0; s < nsplit; ++s) t = fmaxf(t, ml[s * N_HORIZONS + h].x);
        float z = 0.f;
        for (int s = 0; s < nsplit; ++s) {
            const float2 v = ml[s * N_HORIZONS + h];
            z += v.y * weight(v.x, t);
        }
        top[h] = t;
        sum[h] = z;
    }
    __syncthreads();
    if (blockIdx.x == 0) {
        const float* acc = part_acc + (size_t)b * nsplit * ROWS;
        for (int e = threadIdx.x; e < ROWS; e += BLOCK) {
            const int h = e / HIDDEN_DIM;
            float v = 0.f;
            for (int s = 0; s < nsplit; ++s)
                v += acc[(size_t)s * ROWS + e] * weight(ml[s * N_HORIZONS + h].x, top[h]);
            ctx[(size_t)b * ROWS + e] = v / sum[h];
        }
    }
    int kb, ke;
    key_range(K, &kb, &ke);
    float* attnb = attn + (size_t)b * N_HORIZONS * K;
    for (int e = threadIdx.x; e < N_HORIZONS * (ke - kb); e += BLOCK) {
        const int h = e / (ke - kb), k = kb + e % (ke - kb);
        attnb[h * K + k] = expf(attnb[h * K + k] - top[h]) / sum[h];
    }
}

// Backward, pass 1 (one warp per horizon, grid B): c[b, h] = sum_k attn * dw =
// grad_ctx[b,h,:] . ctx[b,h,:] (+ sum_k attn * grad_attn), each lane's share summed in key order.
extern "C" __global__ void __launch_bounds__(32 * N_HORIZONS)
pool_backward_c(const float* __restrict__ grad_ctx, const float* __restrict__ ctx,
                const float* __restrict__ attn, const float* __restrict__ grad_attn,
                float* __restrict__ c, const int K)
{
    const int b = blockIdx.x, h = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const size_t row = (size_t)b * N_HORIZONS + h;
    float v = 0.f;
    for (int d = lane; d < HIDDEN_DIM; d += 32)
        v = fmaf(grad_ctx[row * HIDDEN_DIM + d], ctx[row * HIDDEN_DIM + d], v);
    if (grad_attn != nullptr)
        for (int k = lane; k < K; k += 32)
            v = fmaf(attn[row * K + k], grad_attn[row * K + k], v);
    v = warp_sum(v);
    if (lane == 0) c[row] = v;
}

// Backward, pass 2 (grid (SPLIT, B), a warp per key): the grad_ln row
// sum_h attn * grad_ctx + scale * ds * q_h with ds = attn * (dw - c), horizons summed in order;
// the grad_q_h partial sum_k ds * ln in registers, merged across warps in warp order into
// gq_scratch[b * SPLIT + split, h, :] (then reduce_axis0 over its B * SPLIT rows).
extern "C" __global__ void __launch_bounds__(BLOCK)
pool_backward_split(const float* __restrict__ q_h, const float* __restrict__ ln,
                    const float* __restrict__ attn, const float* __restrict__ grad_ctx,
                    const float* __restrict__ grad_attn, const float* __restrict__ c,
                    float* __restrict__ grad_ln, float* __restrict__ gq_scratch, const int K,
                    const float scale)
{
    __shared__ __align__(16) float red[NWARPS * ROWS];
    const int b = blockIdx.y, part = b * gridDim.x + blockIdx.x;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int kb, ke;
    key_range(K, &kb, &ke);
    const float* lnb = ln + (size_t)b * K * HIDDEN_DIM;
    const float* attnb = attn + (size_t)b * N_HORIZONS * K;
    const float* gab = grad_attn == nullptr ? nullptr : grad_attn + (size_t)b * N_HORIZONS * K;

    float q[N_HORIZONS][ROW_PER_LANE], g[N_HORIZONS][ROW_PER_LANE], gq[N_HORIZONS][ROW_PER_LANE];
    float cb[N_HORIZONS];
#pragma unroll
    for (int h = 0; h < N_HORIZONS; ++h) {
        load_row(q_h + h * HIDDEN_DIM, lane, q[h]);
        load_row(grad_ctx + ((size_t)b * N_HORIZONS + h) * HIDDEN_DIM, lane, g[h]);
        cb[h] = c[b * N_HORIZONS + h];
#pragma unroll
        for (int j = 0; j < ROW_PER_LANE; ++j) gq[h][j] = 0.f;
    }
    for (int k0 = kb + warp * UNROLL; k0 < ke; k0 += NWARPS * UNROLL) {
        float x[UNROLL][ROW_PER_LANE];
        load_keys(lnb, k0, ke, lane, x);
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const int k = k0 + u;
            if (k >= ke) continue;
            float row[ROW_PER_LANE];
#pragma unroll
            for (int j = 0; j < ROW_PER_LANE; ++j) row[j] = 0.f;
#pragma unroll
            for (int h = 0; h < N_HORIZONS; ++h) {
                float dot = 0.f;
#pragma unroll
                for (int j = 0; j < ROW_PER_LANE; ++j) dot = fmaf(g[h][j], x[u][j], dot);
                float dw = warp_sum(dot);
                if (gab != nullptr) dw += gab[h * K + k];
                const float a = attnb[h * K + k];
                const float ds = a * (dw - cb[h]);
#pragma unroll
                for (int j = 0; j < ROW_PER_LANE; ++j) {
                    row[j] = fmaf(a, g[h][j], fmaf(scale * ds, q[h][j], row[j]));
                    gq[h][j] = fmaf(ds, x[u][j], gq[h][j]);
                }
            }
            store_row(grad_ln + ((size_t)b * K + k) * HIDDEN_DIM, lane, row);
        }
    }
#pragma unroll
    for (int h = 0; h < N_HORIZONS; ++h)
        store_row(red + (warp * N_HORIZONS + h) * HIDDEN_DIM, lane, gq[h]);
    __syncthreads();
    float* out = gq_scratch + (size_t)part * ROWS;
    for (int e = threadIdx.x; e < ROWS; e += BLOCK) {
        float v = 0.f;
        for (int w = 0; w < NWARPS; ++w) v += red[w * ROWS + e];
        out[e] = v * scale;
    }
}
