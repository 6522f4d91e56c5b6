// FRD head forward on Hopper's warpgroup MMA (wgmma, sm_90a), for the model's head shape:
// D_IN = FRD_HIDDEN = 128 and 104 < HA <= 112 (the restriction in ops/frdhead.py).
//   frdhead_wg_hidden        hidden = ReLU(h_t w1^T + b1)              (m64n128 products)
//   frdhead_wg_forward       logits = hidden w2^T + b2                 (m64n112: HA padded)
//   frdhead_wg_forward_loss  the logits, then softmax_ce_row on each (row, horizon)
// The op launches frdhead_wg_hidden, then one of the others. Why two kernels and not one: w1's and
// w2's split halves take 128 + 112 KB of shared memory, more than a block has (their FP16
// pieces fit: frdhead_f16.cuh, which shares this file's row buffer and epilogue pieces).
//
// 3xTF32 as in the mma.sync kernels (split(), the dropped small*small term). A block of WG
// warpgroups splits its weight once into big and small halves in wgmma's K-major core-matrix
// layout, then each warpgroup takes row tiles of 64, grid-strided, its next tile's cp.async in
// flight while it multiplies: A (the rows) comes from registers, read from a raw row buffer,
// split and multiplied CS k-steps at a time; B (the weight halves) through shared-memory
// descriptors. Fixed sums (k ascending within a wgmma, the passes in order): bitwise reruns.
// Knobs: WG (warpgroups a block), CS (k-steps a chunk), SWZ (1: the row buffer unpadded, odd
// rows' 16-byte chunks XOR 4; 0: rows padded by 16 floats; both conflict-free).

#define WG_THREADS (128 * WG)
#define WG_ROWS 64                 // a tile's rows: one m64 product
#define WG_K FRD_HIDDEN            // depth of both products (D_IN == FRD_HIDDEN)
#define WG_N2 112                  // the logits' columns, padded
#define WG_XROW (WG_K + (SWZ ? 0 : 16))
#define WG_STAGE (8 * HA)          // a warp's staged logits rows (the layer-2 epilogue)
// A layer's dynamic shared memory (wg_layer): its weight's big and small halves [rows x WG_K],
// then per warpgroup a row buffer and 4 warps' EXTRA floats. The op reads these two.
#define WG_HIDDEN_FLOATS (2 * FRD_HIDDEN * WG_K + WG * WG_ROWS * WG_XROW)
#define WG_LOGITS_FLOATS (2 * WG_N2 * WG_K + WG * (WG_ROWS * WG_XROW + 4 * WG_STAGE))
// float offset of columns col .. col + 3 (col a multiple of 4) of row r in a row buffer
#define WG_XOFF(r, col) ((r) * WG_XROW + (SWZ ? ((((col) >> 2) ^ (((r) & 1) << 2)) << 2) : (col)))
static_assert(D_IN == 128 && FRD_HIDDEN == 128, "the wgmma forward is built for 128 x 128");
static_assert(HA <= WG_N2 && HA > WG_N2 - 8, "the m64n112 accumulator holds 105..112 logits");
static_assert(CS % 2 == 0 && (WG_K / 8) % CS == 0, "chunks of whole float4 pairs of k-steps");

#include "wgmma.cuh"

// the warpgroup's 128 threads copy rows [r0, r0 + WG_ROWS) of x [M, WG_K] into buf (rows past
// M read as zeros)
__device__ __forceinline__ void wg_load_tile(float* buf, const float* __restrict__ x, int r0,
                                             int M, int tid) {
    for (int e = tid; e < WG_ROWS * WG_K / 4; e += 128) {
        const int r = e / (WG_K / 4), c = 4 * (e % (WG_K / 4));
        const bool in = r0 + r < M;
        copy16(buf + WG_XOFF(r, c), in ? x + (size_t)(r0 + r) * WG_K + c : x, in);
    }
    commit_copies();
}

// A k-step's 8 logical columns are a permutation of 16 physical ones (the float4 a thread
// reads): fragment column kk of k-step s is physical 16 (s / 2) + 4 (kk % 4) + 2 (s % 2) + kk / 4.
// B is staged under the same permutation, so the sum over k is unchanged.
// w [n_valid, WG_K] into its halves wb, ws [ROWS x WG_K] (rows past n_valid zero), by all the
// block's threads with 16-byte loads: physical columns 16c + 4q .. + 3 are logical (k-step 2c,
// q), (2c, q + 4), (2c + 1, q), (2c + 1, q + 4); lane L takes row n % 8 = L / 4 and q = L % 4,
// so a warp's stores hit 32 banks.
// The loads go out in batches of at most 16 float4 a thread before the first split, so that
// the block waits out a round trip to L2 a batch, not a load.
template <int ROWS>
__device__ __forceinline__ void wg_stage_split(float* wb, float* ws, const float* __restrict__ w,
                                               int n_valid) {
    constexpr int PER = ROWS * WG_K / 4 / WG_THREADS, NB = (PER + 15) / 16, BATCH = PER / NB;
    static_assert(ROWS * WG_K / 4 % WG_THREADS == 0 && PER % NB == 0, "whole batches of loads");
#pragma unroll 1
    for (int j0 = 0; j0 < PER; j0 += BATCH) {
        float4 v[BATCH];
#pragma unroll
        for (int j = 0; j < BATCH; ++j) {
            const int e = threadIdx.x + (j0 + j) * WG_THREADS, L = e % 32, blk = e / 32;
            const int n = 8 * (blk % (ROWS / 8)) + L / 4, c = blk / (ROWS / 8), q = L % 4;
            v[j] = n < n_valid
                ? __ldg(reinterpret_cast<const float4*>(w) + n * (WG_K / 4) + 4 * c + q)
                : make_float4(0.f, 0.f, 0.f, 0.f);
        }
#pragma unroll
        for (int j = 0; j < BATCH; ++j) {
            const int e = threadIdx.x + (j0 + j) * WG_THREADS, L = e % 32, blk = e / 32;
            const int n = 8 * (blk % (ROWS / 8)) + L / 4, c = blk / (ROWS / 8), q = L % 4;
            const float vs[4] = {v[j].x, v[j].y, v[j].z, v[j].w};
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int l = 8 * (2 * c + (i >> 1)) + q + 4 * (i & 1);
                unsigned big, small;
                split(vs[i], big, small);
                wb[core_offset(n, l, ROWS)] = __uint_as_float(big);
                ws[core_offset(n, l, ROWS)] = __uint_as_float(small);
            }
        }
    }
}

// d = A . B^T over WG_K for the warp's 16 rows of the tile in buf, B's halves wb, ws of
// ROWS = 2 * NACC rows, in 3xTF32: small.big + big.small + big.big a k-step. The whole tile's
// fragments are read into registers first, then tile_read() runs: the buffer takes the next
// tile's copies during all of this tile's products, not only its last chunk's.
template <int NACC, class Read>
__device__ __forceinline__ void wg_tile_products(float (&d)[NACC], const float* buf,
                                                 const float* wb, const float* ws, int warp,
                                                 int g, int t, Read tile_read) {
    constexpr int ROWS = 2 * NACC;
    float4 raw[WG_K / 16][2];  // physical columns 16c + 4t .. + 3 of rows g and g + 8
#pragma unroll
    for (int c = 0; c < WG_K / 16; ++c)
#pragma unroll
        for (int h = 0; h < 2; ++h)
            raw[c][h] = *reinterpret_cast<const float4*>(
                buf + WG_XOFF(16 * warp + g + 8 * h, 16 * c + 4 * t));
    tile_read();
#pragma unroll
    for (int i = 0; i < NACC; ++i) d[i] = 0.f;
#pragma unroll
    for (int c0 = 0; c0 < WG_K / 8; c0 += CS) {
        unsigned big[CS][4], small[CS][4];
#pragma unroll
        for (int s = 0; s < CS; ++s) {
            const float4 r0 = raw[(c0 + s) / 2][0], r1 = raw[(c0 + s) / 2][1];
            split(s & 1 ? r0.z : r0.x, big[s][0], small[s][0]);
            split(s & 1 ? r1.z : r1.x, big[s][1], small[s][1]);
            split(s & 1 ? r0.w : r0.y, big[s][2], small[s][2]);
            split(s & 1 ? r1.w : r1.y, big[s][3], small[s][3]);
        }
        asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
        for (int s = 0; s < CS; ++s) {
            const int kb = 2 * (c0 + s) * (ROWS / 8) * 32;
            wgmma_3xtf32(d, big[s], small[s], wb + kb, ws + kb, ROWS);
        }
        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
        // the chunk before is done (its A registers free): this one's products overlap the
        // next chunk's splits
        asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
    }
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
}

// A layer's block: its weight's halves [ROWS x WG_K] twice, then per warpgroup a row buffer
// [WG_ROWS x WG_XROW] and EXTRA floats (the layer-2 staging). Walks the warpgroup's tiles and
// hands each tile's accumulators to epilogue(d, first row of the warp, warp's extra, warp, g, t).
template <int ROWS, int EXTRA, class Epilogue>
__device__ __forceinline__ void wg_layer(const float* __restrict__ x, const float* __restrict__ w,
                                         int n_valid, int M, Epilogue epilogue) {
    float* wb = reinterpret_cast<float*>(dynamic_smem);
    float* ws = wb + ROWS * WG_K;
    const int wg = threadIdx.x / 128, tid = threadIdx.x % 128;
    const int warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
    float* buf = ws + ROWS * WG_K + wg * (WG_ROWS * WG_XROW + 4 * EXTRA);
    float* extra = buf + WG_ROWS * WG_XROW + warp * EXTRA;
    const int tiles = (M + WG_ROWS - 1) / WG_ROWS, stride = gridDim.x * WG;
    int tile = blockIdx.x * WG + wg;
    if (tile < tiles) wg_load_tile(buf, x, tile * WG_ROWS, M, tid);
    wg_stage_split<ROWS>(wb, ws, w, n_valid);
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // seen by wgmma's reads
    __syncthreads();
    for (; tile < tiles; tile += stride) {
        wait_copies<0>();
        wg_barrier(wg);
        float d[ROWS / 2];
        wg_tile_products(d, buf, wb, ws, warp, g, t, [&] {
            wg_barrier(wg);  // every thread has read the tile: the buffer takes the next
            if (tile + stride < tiles) wg_load_tile(buf, x, (tile + stride) * WG_ROWS, M, tid);
        });
        epilogue(d, tile * WG_ROWS + 16 * warp, extra, lane, g, t);
    }
}

extern "C" __global__ void __launch_bounds__(WG_THREADS, 1)
frdhead_wg_hidden(const float* __restrict__ h_t, const float* __restrict__ w1,
               const float* __restrict__ b1, float* __restrict__ hidden, const int B)
{
    wg_layer<FRD_HIDDEN, 0>(h_t, w1, FRD_HIDDEN, B,
                            [&](float (&d)[FRD_HIDDEN / 2], int r8, float*, int, int g, int t) {
#pragma unroll
        for (int j = 0; j < FRD_HIDDEN / 8; ++j)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int r = r8 + g + 8 * h, c = 8 * j + 2 * t;
                if (r < B) {
                    float2 v;
                    v.x = fmaxf(d[4 * j + 2 * h] + __ldg(b1 + c), 0.f);
                    v.y = fmaxf(d[4 * j + 2 * h + 1] + __ldg(b1 + c + 1), 0.f);
                    *reinterpret_cast<float2*>(hidden + (size_t)r * FRD_HIDDEN + c) = v;
                }
            }
    });
}

// rows [r0, r0 + 8) of out [M, HA] from a warp's staging area (8 x HA, contiguous), coalesced
// (a row is HA floats, so a fragment's float2 is not aligned in global memory)
__device__ __forceinline__ void wg_store_rows(float* __restrict__ out, const float* stage, int r0,
                                              int M, int lane) {
    __syncwarp();
    const int n = min(8, M - r0) * HA;
    for (int i = lane; i < n; i += 32) out[(size_t)r0 * HA + i] = stage[i];
    __syncwarp();
}

// The second layer; with LOSS, a warp's 8 staged logits rows go through softmax_ce_row, one lane
// a (row, horizon) pair p, whose atoms sit at stage[N_ATOMS p ..] (N_ATOMS odd: the lanes' reads
// hit distinct banks; labels and ce are contiguous in p).
template <bool LOSS>
__device__ __forceinline__ void wg_logits(const float* __restrict__ hidden,
                                          const float* __restrict__ w2,
                                          const float* __restrict__ b2,
                                          const int* __restrict__ labels,
                                          float* __restrict__ logits,
                                          float* __restrict__ grad_logits, float* __restrict__ ce,
                                          const int B, const float inv_b) {
    wg_layer<WG_N2, WG_STAGE>(hidden, w2, HA, B,
                            [&](float (&d)[WG_N2 / 2], int r8, float* stage, int lane, int g,
                                int t) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {  // rows g (h 0) and g + 8 (h 1) of the warp's 16
            const int r0 = r8 + 8 * h;
#pragma unroll
            for (int j = 0; j < WG_N2 / 8; ++j)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const int c = 8 * j + 2 * t + e;
                    if (c < HA) stage[g * HA + c] = d[4 * j + 2 * h + e] + __ldg(b2 + c);
                }
            wg_store_rows(logits, stage, r0, B, lane);
            if (LOSS) {
                for (int p = lane; p < 8 * N_HORIZONS; p += 32) {
                    const bool in = r0 + p / N_HORIZONS < B;
                    const float loss = softmax_ce_row(stage + N_ATOMS * p,
                                                      in ? labels[(size_t)r0 * N_HORIZONS + p] : -1,
                                                      inv_b);
                    if (in) ce[(size_t)r0 * N_HORIZONS + p] = loss;
                }
                wg_store_rows(grad_logits, stage, r0, B, lane);
            }
        }
    });
}

extern "C" __global__ void __launch_bounds__(WG_THREADS, 1)
frdhead_wg_forward(const float* __restrict__ hidden, const float* __restrict__ w2,
                const float* __restrict__ b2, float* __restrict__ logits, const int B)
{
    wg_logits<false>(hidden, w2, b2, nullptr, logits, nullptr, nullptr, B, 0.f);
}

extern "C" __global__ void __launch_bounds__(WG_THREADS, 1)
frdhead_wg_forward_loss(const float* __restrict__ hidden, const float* __restrict__ w2,
                     const float* __restrict__ b2, const int* __restrict__ labels,
                     float* __restrict__ logits, float* __restrict__ grad_logits,
                     float* __restrict__ ce, const int B, const float inv_b)
{
    wg_logits<true>(hidden, w2, b2, labels, logits, grad_logits, ce, B, inv_b);
}
