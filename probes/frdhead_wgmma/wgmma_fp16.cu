// Issue 32 probe: the FRD head's first layer, hidden = ReLU(x w^T + b) for x [M, K] and w [N, K],
// on wgmma with FP16 pieces at the 16-bit tensor rate (twice TF32's). precision.py's "fp16x2_one"
// scheme: each operand scaled by a power of two (x a row, w a row of w: an output column) so that
// its largest element is in [2^14, 2^15); big = fp16(x s), small = fp16(x s - big) (may be
// subnormal); small.big + big.small + big.big into one float32 accumulator, then divided by both
// scales. Three k16 products a 16-wide k step: half the tensor time of 3xTF32's three k8 products
// a k8 step. Outside the library; run.py compiles it with -D options and checks it against
// float64 with the library's rule.
//
// A block of WG warpgroups stages w's two pieces once (FP16, 64 KB) in wgmma's no-swizzle K-major
// layout (core matrices of 8 rows by 16 bytes: 8 halves of k), then each warpgroup walks 64-row
// tiles, grid-strided. A comes from registers: a warp's 16 rows, each thread a float4 of a row
// per k16 step straight from global memory (a quad reads 64 contiguous bytes). The float4 at
// physical columns 16s + 4t .. + 3 holds logical columns 2t, 2t + 1, 2t + 8, 2t + 9 of step s
// (the f16 A fragment's), and w is staged under the same permutation, so the sum over k is the
// same sum. PASSES 1 (big.big only) checks the layouts at the plain FP16 bound.
// Template constants: N (= 128), K (a multiple of 16), WG.
#ifndef PASSES
#define PASSES 3
#endif
#define BM 64
#define NT (128 * WG)
static_assert(N == 128, "the accumulator fragment below is m64n128");
static_assert(K % 128 == 0, "K in steps of 16; w staged 128 floats a warp at a time");

#include "wgmma.cuh"
#include "wgmma_f16.cuh"

// split_rows_f16 on rows r0 and r0 + 8 of x [M, KD] straight from global memory (rows past M zero)
template <int KD>
__device__ __forceinline__ void rows_f16(const float* __restrict__ x, int r0, int M, int t,
                                         unsigned (&big)[KD / 16][4], unsigned (&small)[KD / 16][4],
                                         float (&sc)[2]) {
    float4 raw[KD / 16][2];
#pragma unroll
    for (int s = 0; s < KD / 16; ++s)
#pragma unroll
        for (int h = 0; h < 2; ++h)
            raw[s][h] = r0 + 8 * h < M
                ? __ldg(reinterpret_cast<const float4*>(x + (size_t)(r0 + 8 * h) * KD + 16 * s
                                                        + 4 * t))
                : make_float4(0.f, 0.f, 0.f, 0.f);
    split_rows_f16<KD>(raw, big, small, sc);
}

extern "C" __global__ void __launch_bounds__(NT, 1)
wg_layer_f16(const float* __restrict__ x, const float* __restrict__ w,
             const float* __restrict__ bias, float* __restrict__ y, const int M)
{
    extern __shared__ __align__(128) unsigned char smem[];
    __half* wb = reinterpret_cast<__half*>(smem);  // w big   [N x K], core layout
    __half* ws = wb + N * K;                       // w small
    float* inv_t = reinterpret_cast<float*>(ws + N * K);  // 1 / column scale, [N]
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    stage_f16<N, K, NT, true>(wb, ws, inv_t, w, N);
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // seen by wgmma's reads
    __syncthreads();
    const int wg = threadIdx.x / 128, g = lane / 4, t = lane % 4, w4 = warp % 4;
    const int tiles = (M + BM - 1) / BM, stride = gridDim.x * WG;
    for (int tile = blockIdx.x * WG + wg; tile < tiles; tile += stride) {
        const int r0 = tile * BM + 16 * w4 + g;  // the thread's rows r0 and r0 + 8
        unsigned big[K / 16][4], small[K / 16][4];
        float sc[2];
        rows_f16<K>(x, r0, M, t, big, small, sc);
        float d[64];
        products_f16<N, K, PASSES>(d, big, small, wb, ws);
        // d[4j + 2h + e]: row r0 + 8h, column 8j + 2t + e
#pragma unroll
        for (int j = 0; j < N / 8; ++j)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int r = r0 + 8 * h, c = 8 * j + 2 * t;
                if (r < M) {
                    const float inv_s = 1.f / sc[h];
                    float2 o;
                    o.x = fmaxf(d[4 * j + 2 * h] * inv_s * inv_t[c] + bias[c], 0.f);
                    o.y = fmaxf(d[4 * j + 2 * h + 1] * inv_s * inv_t[c + 1] + bias[c + 1], 0.f);
                    *reinterpret_cast<float2*>(y + (size_t)r * N + c) = o;
                }
            }
    }
}
