// Per-horizon residual projection residual[b,h] = w_res[h,:] . ctx[b,h,:] + bias_res[h] and its
// backward. A block owns ROWS consecutive batch rows and loops over their horizons.
// Template constants: N_HORIZONS, HIDDEN_DIM, BLOCK, ROWS, VEC. No atomics.
#include "heads_common.cuh"

#define NWARPS (BLOCK / 32)

// Forward: one warp per (b, h) pair of the block's rows.
extern "C" __global__ void __launch_bounds__(BLOCK)
residual_forward(const float* __restrict__ ctx, const float* __restrict__ w_res,
                 const float* __restrict__ bias_res, float* __restrict__ residual, const int B)
{
    residual_pairs(ctx, w_res, B,
                   [&](int p, int h, float dot) { residual[p] = dot + bias_res[h]; });
}

// Backward: thread per VEC columns of the [N_HORIZONS*HIDDEN_DIM] row, looping over the block's
// rows in order. Writes grad_ctx rows (or adds to them when accumulate != 0, so the caller's
// grad_ctx for the pool backward needs no second buffer), and the block's partial sums
// gw_scratch[blockIdx.x, :] and gb_scratch[blockIdx.x, :], reduced over blocks by reduce_axis0.
extern "C" __global__ void __launch_bounds__(BLOCK)
residual_backward(const float* __restrict__ ctx, const float* __restrict__ w_res,
                  const float* __restrict__ grad_residual, float* __restrict__ gw_scratch,
                  float* __restrict__ gb_scratch, float* __restrict__ grad_ctx, const int B,
                  const int accumulate)
{
    const int b0 = blockIdx.x * ROWS;
    const int b1 = min(B, b0 + ROWS);
    const int HD = N_HORIZONS * HIDDEN_DIM;
    for (int e = threadIdx.x * VEC; e < HD; e += BLOCK * VEC) {
        const int h = e / HIDDEN_DIM;
        float w[VEC], acc[VEC];
        load_vec<VEC>(w_res + e, w);
#pragma unroll
        for (int v = 0; v < VEC; ++v) acc[v] = 0.f;
        for (int b = b0; b < b1; ++b) {
            const float g = __ldg(grad_residual + b * N_HORIZONS + h);
            const size_t off = (size_t)b * HD + e;
            float x[VEC], out[VEC];
            load_vec<VEC>(ctx + off, x);
            if (accumulate) {
#pragma unroll
                for (int v = 0; v < VEC; ++v) out[v] = fmaf(g, w[v], grad_ctx[off + v]);
            } else {
#pragma unroll
                for (int v = 0; v < VEC; ++v) out[v] = g * w[v];
            }
            store_vec<VEC>(grad_ctx + off, out);
#pragma unroll
            for (int v = 0; v < VEC; ++v) acc[v] = fmaf(g, x[v], acc[v]);
        }
        store_vec<VEC>(gw_scratch + (size_t)blockIdx.x * HD + e, acc);
    }
    if (threadIdx.x < N_HORIZONS) {
        float s = 0.f;
        for (int b = b0; b < b1; ++b) s += grad_residual[b * N_HORIZONS + threadIdx.x];
        gb_scratch[blockIdx.x * N_HORIZONS + threadIdx.x] = s;
    }
}
