// Issue 32 probe, second step: the FRD head's first layer, hidden = ReLU(x w^T + b), on wgmma
// with A (x) from registers. wgmma.cu split each x tile into shared memory with scalar loads
// and one warpgroup an SM, and took 107 us at B = 65536 (98 us in plain TF32: the loads, not the
// products, set its time). Here:
// - WG warpgroups a block share w, split once into big and small halves (128 KB);
// - each warpgroup owns a raw x tile buffer of BM rows, filled by cp.async one tile ahead;
// - each thread reads its A fragments from that buffer with 16-byte loads, splits them in
//   registers and issues the 3 products of every k-step with A from registers.
// Template constants: N (= 128), K (multiple of 16), WG, PASSES (3: 3xTF32, 1: plain TF32),
// WSTAGE (how w is staged), CS (k-steps a chunk: a chunk's fragments are read, split and
// multiplied before the next's, so fewer registers hold A and 3 warpgroups fit), SWZ (1: the x
// buffer's rows unpadded, odd rows' 16-byte chunks XOR 4: conflict-free in less shared memory).
#ifndef PASSES
#define PASSES 3
#endif
#ifndef WSTAGE
#define WSTAGE 1  // w staged by 16-byte loads (0: one float a thread at a time; 2: stage_split)
#endif
#ifndef CS
#define CS (K / 8)
#endif
#ifndef SWZ
#define SWZ 0
#endif
#define NT (128 * WG)
#define BM 64
static_assert(N == 128, "the accumulator fragment below is m64n128");

#include "wgmma_tile.cuh"

extern "C" __global__ void __launch_bounds__(NT, 1)
wg_layer_rs(const float* __restrict__ x, const float* __restrict__ w,
            const float* __restrict__ bias, float* __restrict__ y, const int M)
{
    extern __shared__ __align__(128) float sm[];
    float* wb = sm;            // w big   [N x K], core-matrix layout, k permuted
    float* ws = wb + N * K;    // w small
    const int wg = threadIdx.x / 128, tid = threadIdx.x % 128;
    float* buf = ws + N * K + wg * BM * XROW;  // this warpgroup's raw x tile
    const int tiles = (M + BM - 1) / BM, stride = gridDim.x * WG;
    int tile = blockIdx.x * WG + wg;
    if (tile < tiles) load_tile(buf, x, tile * BM, M, tid);
#if WSTAGE == 0
    for (int e = threadIdx.x; e < N * K; e += NT) {
        const int n = e / K, l = e % K;
        const float v = w[n * K + PHYS(l / 8, l % 8)];
        unsigned big, small;
        split(v, big, small);
        wb[cm(n, l, N)] = __uint_as_float(big);
        ws[cm(n, l, N)] = __uint_as_float(small);
    }
#else
    stage_split<N, WSTAGE, NT>(wb, ws, w, N);
#endif
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
    const int warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
    for (; tile < tiles; tile += stride) {
        asm volatile("cp.async.wait_all;\n" ::: "memory");
        wg_barrier(wg);
        float d[64];
#pragma unroll
        for (int i = 0; i < 64; ++i) d[i] = 0.f;
        tile_products(d, buf, wb, ws, warp, g, t, [&] {
            wg_barrier(wg);  // every thread has read the tile: the buffer takes the next
            if (tile + stride < tiles) load_tile(buf, x, (tile + stride) * BM, M, tid);
        });
        const int r0 = tile * BM;
#pragma unroll
        for (int j = 0; j < N / 8; ++j)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int r = r0 + 16 * warp + g + 8 * h, c = 8 * j + 2 * t;
                if (r < M) {
                    float2 v;
                    v.x = fmaxf(d[4 * j + 2 * h] + bias[c], 0.f);
                    v.y = fmaxf(d[4 * j + 2 * h + 1] + bias[c + 1], 0.f);
                    *reinterpret_cast<float2*>(y + (size_t)r * N + c) = v;
                }
            }
    }
}
