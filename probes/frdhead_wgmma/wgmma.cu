// Issue 32 probe: the FRD head's first layer, hidden = ReLU(x w^T + b) for x [M, K] and w [N, K],
// on Hopper's warpgroup MMA (wgmma, sm_90a) in 3xTF32 (a*b ~ a_small*b_big + a_big*b_small +
// a_big*b_big, float32 accumulators), to measure what wgmma gives over mma.sync
// (probes/frdhead_mma) before a head is built on it. Outside the library; run.py compiles it
// with -D options and checks it against float64.
//
// One warpgroup (128 threads) a block, persistent over tiles of BM = 64 rows. w is split once a
// block into big and small halves in shared memory; each x tile is split into its own two halves
// there. Operands sit in wgmma's no-swizzle K-major layout: "core matrices" of 8 rows by 16
// bytes (4 floats of K), 128 contiguous bytes each; core matrix (row group g, k group c) of an
// R-row operand at ((c * R/8) + g) * 128 bytes, so 8-row groups are 128 bytes apart (the
// descriptor's stride byte offset) and k groups R*16 bytes apart (its leading byte offset).
// (Its first run settled the descriptor's reading: wgmma_common.cuh.)
// PASSES 3 is 3xTF32; PASSES 1 (big*big only) times plain TF32 for comparison.
// Template constants: N (= 128: the accumulator is m64n128), K (multiple of 8).
#ifndef PASSES
#define PASSES 3
#endif
#define NT 128
#define BM 64
static_assert(N == 128, "the accumulator fragment below is m64n128");
static_assert(K % 8 == 0, "K in steps of 8");

#include "wgmma_common.cuh"

__device__ __forceinline__ void store_split(float v, float* big, float* small) {
    unsigned b, s;
    split(v, b, s);
    *big = __uint_as_float(b);
    *small = __uint_as_float(s);
}

extern "C" __global__ void __launch_bounds__(NT, 1)
wg_layer(const float* __restrict__ x, const float* __restrict__ w, const float* __restrict__ bias,
         float* __restrict__ y, const int M)
{
    extern __shared__ __align__(128) float sm[];
    float* wb = sm;             // w big   [N x K]
    float* ws = wb + N * K;     // w small
    float* xb = ws + N * K;     // x tile big [BM x K]
    float* xs = xb + BM * K;    // x tile small
    for (int e = threadIdx.x; e < N * K; e += NT) {
        const int n = e / K, k = e % K;
        store_split(w[e], wb + core_offset(n, k, N), ws + core_offset(n, k, N));
    }
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (int tile = blockIdx.x; tile * BM < M; tile += gridDim.x) {
        const int r0 = tile * BM;
        __syncthreads();  // the last tile's MMAs have read xb and xs (they were waited for)
        for (int e = threadIdx.x; e < BM * K; e += NT) {
            const int r = e / K, k = e % K;
            const float v = r0 + r < M ? x[(size_t)(r0 + r) * K + k] : 0.f;
            store_split(v, xb + core_offset(r, k, BM), xs + core_offset(r, k, BM));
        }
        // generic-proxy writes to shared memory, then read by wgmma (the async proxy)
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        __syncthreads();
        float d[64];
#pragma unroll
        for (int i = 0; i < 64; ++i) d[i] = 0.f;
        asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
        for (int s = 0; s < K / 8; ++s) {  // k groups 2s and 2s + 1
            const unsigned la = BM * 16, lb = N * 16;
            const int ka = 2 * s * (BM / 8) * 32, kb = 2 * s * (N / 8) * 32;
#if PASSES == 3
            wgmma_ss(d, wg_desc(xs + ka, la, 128), wg_desc(wb + kb, lb, 128));
            wgmma_ss(d, wg_desc(xb + ka, la, 128), wg_desc(ws + kb, lb, 128));
#endif
            wgmma_ss(d, wg_desc(xb + ka, la, 128), wg_desc(wb + kb, lb, 128));
        }
        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
        asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
        // d[4j + 2h + e]: row 16*warp + lane/4 + 8h, column 8j + 2*(lane%4) + e
#pragma unroll
        for (int j = 0; j < N / 8; ++j)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int r = r0 + 16 * warp + lane / 4 + 8 * h, c = 8 * j + 2 * (lane % 4);
                if (r < M) {
                    float2 v;
                    v.x = fmaxf(d[4 * j + 2 * h] + bias[c], 0.f);
                    v.y = fmaxf(d[4 * j + 2 * h + 1] + bias[c + 1], 0.f);
                    *reinterpret_cast<float2*>(y + (size_t)r * N + c) = v;
                }
            }
    }
}
