// The per-horizon residual and the alpha gate fused:
//   residual[b,h] = w_res[h,:] . ctx[b,h,:] + bias_res[h]
//   out[b,h]      = head[b,h] + tanh(alpha[h]) * residual[b,h]
// and their backward from grad_out in one kernel (plus one reduce_axis0 over its scratch rows
// when there is more than one row group). Template constants: N_HORIZONS, HIDDEN_DIM, BLOCK, ROWS,
// VEC, and UNROLL for the backward: the knob present selects the kernel compiled. No atomics.
#include "heads_common.cuh"

#include "pdl.cuh"

#ifndef UNROLL
// Forward: residual_forward's loop (so residual is bitwise that kernel's at equal VEC) with the
// gate applied where the residual is written.
// tanh(0) == 0 returns head itself: a closed gate is bit-identical to the head (-0.0 included).
extern "C" __global__ void __launch_bounds__(BLOCK)
resgate_forward(const float* __restrict__ ctx, const float* __restrict__ w_res,
                const float* __restrict__ bias_res, const float* __restrict__ head,
                const float* __restrict__ alpha, float* __restrict__ out,
                float* __restrict__ residual, const int B)
{
    pdl_enter();
    residual_pairs(ctx, w_res, B, [&](int p, int h, float dot) {
        const float r = dot + bias_res[h];
        const float t = tanhf(alpha[h]);
        residual[p] = r;
        out[p] = t == 0.f ? head[p] : fmaf(t, r, head[p]);
    });
}
#endif

#ifdef UNROLL
#define HD (N_HORIZONS * HIDDEN_DIM)
// One scratch row per row group: [grad_w_res partial (HD) | grad_bias_res (H) | grad_alpha (H)].
#define SCRATCH_COLS (HD + 2 * N_HORIZONS)

// Backward on grid (row groups, column strips). Block (g, s) owns the batch rows
// [g*ROWS, g*ROWS + ROWS) and the strip of BLOCK*VEC columns s of the flattened [HD] row; each
// thread owns VEC columns of one horizon (VEC divides HIDDEN_DIM), so its grad_w_res partial stays
// in registers and no block-wide sum is needed. grad_residual = tanh(alpha) * grad_out is formed
// on the fly and never stored. grad_ctx = grad_residual * w_res has one writer per element (added
// to grad_ctx when accumulate != 0). The thread owning column 0 of horizon h also sums its
// grad_bias_res and grad_alpha partials, from the grad_out it loads anyway: no extra pass and no
// extra round trip. Every scratch element has one writer summing in row order: with one row group
// the row is already the final result.
extern "C" __global__ void __launch_bounds__(BLOCK)
resgate_backward(const float* __restrict__ ctx, const float* __restrict__ w_res,
                 const float* __restrict__ alpha, const float* __restrict__ residual,
                 const float* __restrict__ grad_out, float* __restrict__ scratch,
                 float* __restrict__ grad_ctx, const int B, const int accumulate)
{
    pdl_enter();
    const int e = (blockIdx.y * BLOCK + threadIdx.x) * VEC;
    if (e >= HD) return;
    const int b0 = blockIdx.x * ROWS;
    const int b1 = min(B, b0 + ROWS);
    const int h = e / HIDDEN_DIM;
    const bool first = e % HIDDEN_DIM == 0;
    // tanh(alpha) is formed after the first rows' loads are issued: a small batch waits for
    // memory once, not twice (alpha's load, then the rows').
    const float a = __ldg(alpha + h);
    float t = 0.f;
    float w[VEC], acc[VEC];
    load_vec<VEC>(w_res + e, w);
#pragma unroll
    for (int v = 0; v < VEC; ++v) acc[v] = 0.f;
    float sum_g = 0.f, sum_go_r = 0.f;
    for (int b = b0; b < b1; b += UNROLL) {
        // All UNROLL rows' loads are issued before any store: bytes in flight per thread.
        float x[UNROLL][VEC], go[UNROLL], r[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            if (b + u < b1) {
                load_vec<VEC>(ctx + (size_t)(b + u) * HD + e, x[u]);
                go[u] = __ldg(grad_out + (b + u) * N_HORIZONS + h);
                if (first) r[u] = __ldg(residual + (b + u) * N_HORIZONS + h);
            }
        }
        t = tanhf(a);
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            if (b + u < b1) {
                const float g = t * go[u];
                float* dst = grad_ctx + (size_t)(b + u) * HD + e;
                float o[VEC];
#pragma unroll
                for (int v = 0; v < VEC; ++v)
                    o[v] = accumulate ? fmaf(g, w[v], dst[v]) : g * w[v];
                store_vec<VEC>(dst, o);
#pragma unroll
                for (int v = 0; v < VEC; ++v) acc[v] = fmaf(g, x[u][v], acc[v]);
                if (first) {
                    sum_g += g;
                    sum_go_r = fmaf(go[u], r[u], sum_go_r);
                }
            }
        }
    }
    float* row = scratch + (size_t)blockIdx.x * SCRATCH_COLS;
    // Scalar stores: a row of SCRATCH_COLS floats need not be vector-aligned.
#pragma unroll
    for (int v = 0; v < VEC; ++v) row[e + v] = acc[v];
    if (first) {
        row[HD + h] = sum_g;
        row[HD + N_HORIZONS + h] = (1.f - t * t) * sum_go_r;
    }
}
#endif
