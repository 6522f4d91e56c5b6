// Deterministic column sums y[m] = sum_n x[n, m] with no atomics (two-stage, like PyCUDA's
// ReductionKernel). Block (TX, TY): threadIdx.x walks columns (coalesced), threadIdx.y walks rows
// with stride TY inside the block's row range, then a fixed-order tree over TY in shared memory.
// grid.y splits the rows into chunks of `rows_per_split`; each chunk writes its own output row,
// and the host launches again over those partial rows until one row is left.
// Template constants: TX, TY.
#include "heads_common.cuh"
#include "pdl.cuh"

extern "C" __global__ void __launch_bounds__(TX * TY)
reduce_axis0(const float* __restrict__ x, float* __restrict__ y, const int N, const int M,
             const int rows_per_split)
{
    pdl_wait();
    __shared__ float part[TY][TX + 1];
    const int m = blockIdx.x * TX + threadIdx.x;
    const int r0 = blockIdx.y * rows_per_split;
    const int r1 = min(N, r0 + rows_per_split);
    float v = 0.f;
    if (m < M)
        for (int r = r0 + threadIdx.y; r < r1; r += TY) v += x[(size_t)r * M + m];
    part[threadIdx.y][threadIdx.x] = v;
    __syncthreads();
#pragma unroll
    for (int s = TY / 2; s > 0; s >>= 1) {
        if (threadIdx.y < s) part[threadIdx.y][threadIdx.x] += part[threadIdx.y + s][threadIdx.x];
        __syncthreads();
    }
    if (threadIdx.y == 0 && m < M) y[(size_t)blockIdx.y * M + m] = part[0][threadIdx.x];
}
