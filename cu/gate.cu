// The alpha gate out[b,h] = head[b,h] + tanh(alpha[h]) * residual[b,h] and its backward.
// Template constants: N_HORIZONS, BLOCK, and ITEMS (forward elements per thread) or ROWS
// (backward batch rows per block): the knob present selects the kernel compiled. No atomics.
#include "heads_common.cuh"

#ifdef ITEMS
// Forward, elementwise over the B*N_HORIZONS outputs. tanh(0) == 0 returns head itself, so a
// closed gate is bit-identical to the head (also for head == -0.0).
extern "C" __global__ void __launch_bounds__(BLOCK)
gate_forward(const float* __restrict__ head, const float* __restrict__ residual,
             const float* __restrict__ alpha, float* __restrict__ out, const int n)
{
    const int base = blockIdx.x * BLOCK * ITEMS + threadIdx.x;
#pragma unroll
    for (int j = 0; j < ITEMS; ++j) {
        const int i = base + j * BLOCK;
        if (i < n) {
            const float t = tanhf(alpha[i % N_HORIZONS]);
            out[i] = t == 0.f ? head[i] : fmaf(t, residual[i], head[i]);
        }
    }
}

#endif

#ifdef ROWS
// Backward: grad_residual = tanh(alpha) * g (one writer per element) and the block's partial of
// grad_alpha[h] = (1 - tanh^2) * sum_b g*residual over its ROWS rows, summed across threads by a
// fixed-order tree and written to ga_scratch[blockIdx.x, h] (reduced over blocks by reduce_axis0).
extern "C" __global__ void __launch_bounds__(BLOCK)
gate_backward(const float* __restrict__ residual, const float* __restrict__ alpha,
              const float* __restrict__ grad_out, float* __restrict__ grad_residual,
              float* __restrict__ ga_scratch, const int B)
{
    __shared__ float part[N_HORIZONS][BLOCK];
    const int b0 = blockIdx.x * ROWS;
    const int b1 = min(B, b0 + ROWS);
    float t[N_HORIZONS], acc[N_HORIZONS];
#pragma unroll
    for (int h = 0; h < N_HORIZONS; ++h) {
        t[h] = tanhf(alpha[h]);
        acc[h] = 0.f;
    }
    for (int b = b0 + threadIdx.x; b < b1; b += BLOCK) {
#pragma unroll
        for (int h = 0; h < N_HORIZONS; ++h) {
            const int i = b * N_HORIZONS + h;
            const float g = grad_out[i];
            grad_residual[i] = t[h] * g;
            acc[h] = fmaf(g, residual[i], acc[h]);
        }
    }
#pragma unroll
    for (int h = 0; h < N_HORIZONS; ++h) part[h][threadIdx.x] = acc[h];
    __syncthreads();
#pragma unroll
    for (int s = BLOCK / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) {
#pragma unroll
            for (int h = 0; h < N_HORIZONS; ++h) part[h][threadIdx.x] += part[h][threadIdx.x + s];
        }
        __syncthreads();
    }
    if (threadIdx.x < N_HORIZONS) {
        const float th = tanhf(alpha[threadIdx.x]);  // recomputed: t[] takes compile-time indices only
        ga_scratch[blockIdx.x * N_HORIZONS + threadIdx.x] = (1.f - th * th) * part[threadIdx.x][0];
    }
}
#endif
