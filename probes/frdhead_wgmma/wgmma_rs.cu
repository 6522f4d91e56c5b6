// Issue 32 probe, second step: the FRD head's first layer, hidden = ReLU(x w^T + b), on wgmma
// with A (x) from registers. wgmma.cu split each x tile into shared memory with scalar loads
// and one warpgroup an SM, and took 107 us at B = 65536 (98 us in plain TF32: the loads, not the
// products, set its time). Here:
// - WG warpgroups a block share w, split once into big and small halves (128 KB);
// - each warpgroup owns a raw x tile buffer of BM rows, filled by cp.async one tile ahead;
// - each thread reads its A fragments from that buffer with 16-byte loads, splits them in
//   registers and issues the 3 products of every k-step with A from registers.
// A k-step's 8 logical columns are a permutation of 16 physical ones (the float4 a thread
// reads): k-step s, fragment column kk holds physical column PHYS(s, kk); w is staged under the
// same permutation, so the sum over k is unchanged.
// A fragment order: a0 (g, t), a1 (g+8, t), a2 (g, t+4), a3 (g+8, t+4), g = lane/4, t = lane%4
// (the order with a1 and a2 swapped failed the float64 check on the H200).
// Template constants: N (= 128), K (multiple of 16), WG, PASSES (3: 3xTF32, 1: plain TF32),
// WSTAGE (how w is staged), CS (k-steps a chunk: a chunk's fragments are read, split and
// multiplied before the next's, so fewer registers hold A and 3 warpgroups fit), SWZ (1: the x
// buffer's rows unpadded, odd rows' 16-byte chunks XOR 4: conflict-free in less shared memory).
#ifndef PASSES
#define PASSES 3
#endif
#ifndef WSTAGE
#define WSTAGE 1  // w staged by 16-byte loads (0: one float a thread at a time; 2: see below)
#endif
#ifndef CS
#define CS (K / 8)
#endif
#ifndef SWZ
#define SWZ 0
#endif
#define NT (128 * WG)
#define BM 64
#define XROW (K + (SWZ ? 0 : 16))  // padded (SWZ 0) so a warp's fragment reads hit 32 banks
// float offset of columns col .. col + 3 (col a multiple of 4) of row r in the x buffer
#define XOFF(r, col) ((r) * XROW + (SWZ ? ((((col) >> 2) ^ (((r) & 1) << 2)) << 2) : (col)))
#define PHYS(s, kk) (16 * ((s) >> 1) + 4 * ((kk) & 3) + 2 * ((s) & 1) + ((kk) >> 2))
static_assert(N == 128, "the accumulator fragment below is m64n128");
static_assert(K % 16 == 0, "K in steps of 16");
static_assert(CS % 2 == 0 && (K / 8) % CS == 0, "chunks of whole float4 pairs of k-steps");

#include "wgmma_common.cuh"

// the warpgroup's 128 threads copy rows [r0, r0 + BM) of x into buf (rows past M read as 0)
__device__ __forceinline__ void load_tile(float* buf, const float* __restrict__ x, int r0, int M,
                                          int tid) {
    for (int e = tid; e < BM * K / 4; e += 128) {
        const int r = e / (K / 4), c = 4 * (e % (K / 4));
        const bool in = r0 + r < M;
        const float* src = in ? x + (size_t)(r0 + r) * K + c : x;
        const unsigned dst = (unsigned)__cvta_generic_to_shared(buf + XOFF(r, c));
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                     :: "r"(dst), "l"(src), "r"(in ? 16 : 0) : "memory");
    }
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

__device__ __forceinline__ void wg_barrier(int wg) {
    asm volatile("bar.sync %0, 128;\n" :: "r"(wg + 1) : "memory");
}

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
    // 16-byte loads, all of a thread's in flight: physical columns 16c + 4q .. + 3 are logical
    // (k-step 2c, q), (2c, q + 4), (2c + 1, q), (2c + 1, q + 4). WSTAGE 2: lane L takes row
    // n % 8 = L / 4 and q = L % 4, so a warp's stores hit 32 distinct banks (WSTAGE 1 takes 32
    // float4 of one row: 8-way conflicts)
#pragma unroll 8
    for (int e = threadIdx.x; e < N * K / 4; e += NT) {
#if WSTAGE == 1
        const int n = e / (K / 4), c = (e % (K / 4)) / 4, q = e % 4;
#else
        const int L = e % 32, blk = e / 32;
        const int n = 8 * (blk % (N / 8)) + L / 4, c = blk / (N / 8), q = L % 4;
#endif
        const float4 v = __ldg(reinterpret_cast<const float4*>(w) + n * (K / 4) + 4 * c + q);
        const float vs[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int l = 8 * (2 * c + (i >> 1)) + q + 4 * (i & 1);
            unsigned big, small;
            split(vs[i], big, small);
            wb[cm(n, l, N)] = __uint_as_float(big);
            ws[cm(n, l, N)] = __uint_as_float(small);
        }
    }
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
#pragma unroll
        for (int c0 = 0; c0 < K / 8; c0 += CS) {
            float4 raw[CS / 2][2];  // physical columns 16c + 4t .. + 3 of rows g and g + 8
#pragma unroll
            for (int c = 0; c < CS / 2; ++c)
#pragma unroll
                for (int h = 0; h < 2; ++h)
                    raw[c][h] = *reinterpret_cast<const float4*>(
                        buf + XOFF(16 * warp + g + 8 * h, 16 * (c0 / 2 + c) + 4 * t));
            if (c0 + CS == K / 8) {
                wg_barrier(wg);  // every thread has read the tile: the buffer takes the next
                if (tile + stride < tiles) load_tile(buf, x, (tile + stride) * BM, M, tid);
            }
            unsigned big[CS][4], small[CS][4];
#pragma unroll
            for (int s = 0; s < CS; ++s) {
                const float4 r0 = raw[s / 2][0], r1 = raw[s / 2][1];
                // kk = t: physical 4t + 2(s&1); kk = t + 4: the next one
                const float lo0 = s & 1 ? r0.z : r0.x, hi0 = s & 1 ? r0.w : r0.y;
                const float lo1 = s & 1 ? r1.z : r1.x, hi1 = s & 1 ? r1.w : r1.y;
                split(lo0, big[s][0], small[s][0]); split(lo1, big[s][1], small[s][1]);
                split(hi0, big[s][2], small[s][2]); split(hi1, big[s][3], small[s][3]);
            }
            asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
            for (int s = 0; s < CS; ++s) {
                const unsigned lb = N * 16;
                const int kb = 2 * (c0 + s) * (N / 8) * 32;
#if PASSES == 3
                wgmma_rs(d, small[s], desc(wb + kb, lb, 128));
                wgmma_rs(d, big[s], desc(ws + kb, lb, 128));
#endif
                wgmma_rs(d, big[s], desc(wb + kb, lb, 128));
            }
            asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
            asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");  // A's registers free
        }
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
