// Issue 32 probe, the backward's row products on wgmma (3xTF32), the shape the forward's layers
// have with w read transposed:
//   grad_w2 stage: dhidden = G w2             A = G [M, 105], w2 [105, 128]   (KA 105, MASK 0)
//   grad_w1 stage: dh_t = (dhidden . [hidden > 0]) w1   A = dhidden, mask = hidden [M, 128],
//                  w1 [128, 128]                                                  (KA 128, MASK 1)
// y [M, N = 128] = (A . mask) W for W [KA, N] row-major: B[n][k] = W[k][n], staged once a block,
// transposed and split into big and small halves in the no-swizzle K-major layout (k natural;
// k >= KA zero). A tiles of 64 rows are copied raw (rows padded to LDA = KP + 4 floats, so a warp's
// fragment reads hit 32 banks), 4 bytes a copy where a row is not 16-byte aligned (KA = 105); the
// mask tile beside it. Each warpgroup walks its tiles grid-strided, the next tile's copies issued
// after its products, in flight during its stores; fragments are read, masked and split CS
// k-steps at a time (wgrad.cu's fragment order, no permutation).
// Template constants: KA, WG (warpgroups a block), CS, MASK.
#include "wgmma_common.cuh"

#define N 128
#define ROWS 64
#define KP ((KA + 7) / 8 * 8)                // k padded to whole k-steps
#define LDA (KP + 4)
#define NT (128 * WG)
#define TILE (ROWS * LDA * (MASK ? 2 : 1))   // a warpgroup's floats: the A tile, the mask tile
static_assert((KP / 8) % CS == 0, "whole chunks of k-steps");

__device__ __forceinline__ void copy(float* dst, const float* src, bool in, int bytes) {
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    if (bytes == 16)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                     :: "r"(d), "l"(src), "r"(in ? 16 : 0) : "memory");
    else
        asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n"
                     :: "r"(d), "l"(src), "r"(in ? 4 : 0) : "memory");
}

// rows [r0, r0 + ROWS) of x [M, KA] into buf [ROWS][LDA], zeros past M and past KA
__device__ __forceinline__ void load_rows(float* buf, const float* __restrict__ x, int r0, int M,
                                          int tid) {
    if (KA % 4 == 0) {
        for (int e = tid; e < ROWS * KP / 4; e += 128) {
            const int r = e / (KP / 4), c = 4 * (e % (KP / 4));
            const bool in = r0 + r < M && c < KA;
            copy(buf + r * LDA + c, in ? x + (size_t)(r0 + r) * KA + c : x, in, 16);
        }
    } else {
        for (int e = tid; e < ROWS * KP; e += 128) {
            const int r = e / KP, c = e % KP;
            const bool in = r0 + r < M && c < KA;
            copy(buf + r * LDA + c, in ? x + (size_t)(r0 + r) * KA + c : x, in, 4);
        }
    }
}

__device__ __forceinline__ void load_tile(float* buf, const float* __restrict__ a,
                                          const float* __restrict__ mask, int r0, int M, int tid) {
    load_rows(buf, a, r0, M, tid);
    if (MASK) load_rows(buf + ROWS * LDA, mask, r0, M, tid);
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// element (r, c) of the tile, masked
__device__ __forceinline__ float at(const float* buf, int r, int c) {
    const float v = buf[r * LDA + c];
    return MASK ? (buf[ROWS * LDA + r * LDA + c] > 0.f ? v : 0.f) : v;
}

extern "C" __global__ void __launch_bounds__(NT, 1)
wg_rowprod(const float* __restrict__ a, const float* __restrict__ mask,
           const float* __restrict__ w, float* __restrict__ y, const int M)
{
    extern __shared__ __align__(128) float sm[];
    float* wb = sm;            // W^T big   [N x KP], core-matrix layout
    float* ws = wb + N * KP;   // W^T small
    const int wg = threadIdx.x / 128, tid = threadIdx.x % 128;
    const int warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
    float* buf = ws + N * KP + wg * TILE;
    const int tiles = (M + ROWS - 1) / ROWS, stride = gridDim.x * WG;
    int tile = blockIdx.x * WG + wg;
    if (tile < tiles) load_tile(buf, a, mask, tile * ROWS, M, tid);
    for (int e = threadIdx.x; e < N * KP; e += NT) {  // coalesced along W's rows
        const int k = e / N, n = e % N;
        unsigned big, small;
        split(k < KA ? w[(size_t)k * N + n] : 0.f, big, small);
        wb[core_offset(n, k, N)] = __uint_as_float(big);
        ws[core_offset(n, k, N)] = __uint_as_float(small);
    }
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
    const int m = 16 * warp + g;  // the thread's first fragment row in the tile
    for (; tile < tiles; tile += stride) {
        asm volatile("cp.async.wait_all;\n" ::: "memory");
        wg_barrier(wg);
        float d[64];
#pragma unroll
        for (int i = 0; i < 64; ++i) d[i] = 0.f;
#pragma unroll
        for (int s0 = 0; s0 < KP / 8; s0 += CS) {
            unsigned big[CS][4], small[CS][4];
#pragma unroll
            for (int s = 0; s < CS; ++s) {
                const int k = 8 * (s0 + s) + t;
                split(at(buf, m, k), big[s][0], small[s][0]);
                split(at(buf, m + 8, k), big[s][1], small[s][1]);
                split(at(buf, m, k + 4), big[s][2], small[s][2]);
                split(at(buf, m + 8, k + 4), big[s][3], small[s][3]);
            }
            asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
            for (int s = 0; s < CS; ++s) {
                const int kb = 2 * (s0 + s) * (N / 8) * 32;
                wgmma_rs(d, small[s], wg_desc(wb + kb, N * 16, 128));
                wgmma_rs(d, big[s], wg_desc(ws + kb, N * 16, 128));
                wgmma_rs(d, big[s], wg_desc(wb + kb, N * 16, 128));
            }
            asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
            asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
        }
        wg_barrier(wg);  // every fragment read: the buffer takes the next tile (issued inside the
        // last chunk, ptxas injects warpgroup arrives: C7519), in flight during the stores
        if (tile + stride < tiles) load_tile(buf, a, mask, (tile + stride) * ROWS, M, tid);
        const int r0 = tile * ROWS + m;
#pragma unroll
        for (int j = 0; j < N / 8; ++j)
#pragma unroll
            for (int h = 0; h < 2; ++h)
                if (r0 + 8 * h < M)
                    *reinterpret_cast<float2*>(y + (size_t)(r0 + 8 * h) * N + 8 * j + 2 * t) =
                        make_float2(d[4 * j + 2 * h], d[4 * j + 2 * h + 1]);
    }
}
