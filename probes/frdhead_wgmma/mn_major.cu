// Issue 32 probe: can a weight staged for the forward (K-major FP16 core matrices, rows n, k the
// contiguous direction) serve the backward's product with its transpose, read MN-major through
// wgmma's imm-trans-b flag? Then one block holding w1's and w2's pieces could run the backward's
// row products (dhidden = G w2, grad_h_t = dpre w1) beside the forward's without a second copy.
// W [R = 112, C = 128] is staged as the forward's B operand (core_offset_h(r, c, R)); each core
// matrix is 8 rows r by 16 bytes of c, so read transposed (n = c, k = r) it is an MN-major core
// matrix: k groups 128 bytes apart, n groups R * 16. Which descriptor field takes which step
// is what this checks (DESC 0: leading = the n step, stride = the k step; 1: swapped), with
// FP16-exact integers, so the sums are exact:
//   y1 [64 x R] = x [64 x C] . W^T   (forward reading, tnspB 0: the control)
//   y2 [64 x C] = a [64 x R] . W     (transposed reading, tnspB 1)
// One warpgroup, one block. Template constant DESC.
#include "wgmma.cuh"
#include "wgmma_f16.cuh"
#define R 112
#define C 128

// A fragment of k16 step s from a row-major float matrix m [64 x ld] (values FP16-exact)
__device__ __forceinline__ void frag(const float* m, int ld, int s, int r0, int t,
                                     unsigned (&a)[4]) {
    unsigned unused;
#pragma unroll
    for (int q = 0; q < 4; ++q) {  // a_q: row r0 + 8 (q & 1), columns 16s + 2t + 8 (q >> 1)
        const float* p = m + (r0 + 8 * (q & 1)) * ld + 16 * s + 2 * t + 8 * (q >> 1);
        split_pair(p[0], p[1], a[q], unused);
    }
}

extern "C" __global__ void __launch_bounds__(128, 1)
mn_major(const float* __restrict__ w, const float* __restrict__ x, const float* __restrict__ a,
         float* __restrict__ y1, float* __restrict__ y2)
{
    extern __shared__ __align__(128) unsigned char smem[];
    __half* wb = reinterpret_cast<__half*>(smem);
    for (int e = threadIdx.x; e < R * C; e += 128)
        wb[core_offset_h(e / C, e % C, R)] = __float2half_rn(w[e]);
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int r0 = 16 * warp + g;
    {
        float d[56];
#pragma unroll
        for (int i = 0; i < 56; ++i) d[i] = 0.f;
        asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
        for (int s = 0; s < C / 16; ++s) {
            unsigned f[4];
            frag(x, C, s, r0, t, f);
            wgmma_f16(d, f, f16_desc<R>(wb + 2 * s * (R / 8) * 64));
        }
        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
        asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
#pragma unroll
        for (int i = 0; i < 56; ++i)
            y1[(r0 + 8 * ((i >> 1) & 1)) * R + 8 * (i >> 2) + 2 * t + (i & 1)] = d[i];
    }
    float d[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) d[i] = 0.f;
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
    constexpr unsigned N_STEP = R * 16, K_STEP = 128;  // bytes between core matrices
#pragma unroll
    for (int s = 0; s < R / 16; ++s) {
        unsigned f[4];
        frag(a, R, s, r0, t, f);
        const float* start = reinterpret_cast<const float*>(wb + 2 * s * 64);
        wgmma_f16_t(d, f, DESC ? wg_desc(start, K_STEP, N_STEP) : wg_desc(start, N_STEP, K_STEP));
    }
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
#pragma unroll
    for (int i = 0; i < 64; ++i)
        y2[(r0 + 8 * ((i >> 1) & 1)) * C + 8 * (i >> 2) + 2 * t + (i & 1)] = d[i];
}
