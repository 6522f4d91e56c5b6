// The loss of a head trained on two targets, and the gradients it sends back, in one kernel:
//   d = out - y,  grad_out = d * grad_scale  (grad_scale = 2 / (B * N_HORIZONS): the mean square),
//   grad_logits_w = frd_weight * grad_logits (the FRD softmax-CE gradient, already / B),
//   loss = sum d^2 / (B * N_HORIZONS) + frd_weight * sum ce / B.
// Block x owns the batch rows [x * ROWS, x * ROWS + ROWS): one writer per gradient element, and
// its loss partial, summed in a fixed order, in partial[x] (reduce_axis0 adds the blocks'; with
// one block it is the loss). Template constants: N_HORIZONS, N_ATOMS, BLOCK, ROWS. No atomics.
#include "heads_common.cuh"

#include "pdl.cuh"

extern "C" __global__ void __launch_bounds__(BLOCK)
headloss_grad(const float* __restrict__ out, const float* __restrict__ y,
              const float* __restrict__ ce, const float* __restrict__ grad_logits,
              float* __restrict__ grad_out, float* __restrict__ grad_logits_w,
              float* __restrict__ partial, const int B, const float grad_scale,
              const float frd_weight, const float inv_bh, const float weight_over_b)
{
    pdl_enter();
    __shared__ float squares[BLOCK], losses[BLOCK];
    const int p0 = blockIdx.x * ROWS * N_HORIZONS;
    const int p1 = min(B, (int)(blockIdx.x + 1) * ROWS) * N_HORIZONS;
    float s = 0.f, c = 0.f;
    for (int p = p0 + threadIdx.x; p < p1; p += BLOCK) {
        const float d = out[p] - y[p];
        grad_out[p] = d * grad_scale;
        s = fmaf(d, d, s);
        c += ce[p];
    }
    const size_t a1 = (size_t)p1 * N_ATOMS;
    for (size_t i = (size_t)p0 * N_ATOMS + threadIdx.x; i < a1; i += BLOCK)
        grad_logits_w[i] = frd_weight * grad_logits[i];
    squares[threadIdx.x] = s;
    losses[threadIdx.x] = c;
    __syncthreads();
#pragma unroll
    for (int o = BLOCK / 2; o > 0; o >>= 1) {
        if (threadIdx.x < o) {
            squares[threadIdx.x] += squares[threadIdx.x + o];
            losses[threadIdx.x] += losses[threadIdx.x + o];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) partial[blockIdx.x] = squares[0] * inv_bh + losses[0] * weight_over_b;
}
