// Pieces of the probes whose A operand is a raw row tile read into registers (wgmma_rs.cu,
// wgmma_loss.cu): the tile buffer's layout and its cp.async fill, a warpgroup's barrier, the
// split staging of the B operand and a tile's products.
// A k-step's 8 logical columns are a permutation of 16 physical ones (the float4 a thread
// reads): k-step s, fragment column kk holds physical column PHYS(s, kk); B is staged under the
// same permutation, so the sum over k is unchanged.
// A fragment order: a0 (g, t), a1 (g+8, t), a2 (g, t+4), a3 (g+8, t+4), g = lane/4, t = lane%4
// (the order with a1 and a2 swapped failed the float64 check on the H200).
// The including file defines K (the products' depth, a multiple of 16), BM (a tile's rows),
// PASSES (3: 3xTF32, 1: plain TF32), CS (k-steps a chunk) and SWZ (1: the buffer's rows
// unpadded, odd rows' 16-byte chunks XOR 4: conflict-free in less shared memory).
#pragma once
#include "wgmma_common.cuh"

#define XROW (K + (SWZ ? 0 : 16))  // padded (SWZ 0) so a warp's fragment reads hit 32 banks
// float offset of columns col .. col + 3 (col a multiple of 4) of row r in the x buffer
#define XOFF(r, col) ((r) * XROW + (SWZ ? ((((col) >> 2) ^ (((r) & 1) << 2)) << 2) : (col)))
#define PHYS(s, kk) (16 * ((s) >> 1) + 4 * ((kk) & 3) + 2 * ((s) & 1) + ((kk) >> 2))
static_assert(K % 16 == 0, "K in steps of 16");
static_assert(CS % 2 == 0 && (K / 8) % CS == 0, "chunks of whole float4 pairs of k-steps");

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

// B [n_valid, K] into its big and small halves wb, ws [ROWS x K] (rows past n_valid zero), in
// the core-matrix layout under the PHYS permutation, by THREADS threads with 16-byte loads, all of a
// thread's in flight: physical columns 16c + 4q .. + 3 are logical (k-step 2c, q), (2c, q + 4),
// (2c + 1, q), (2c + 1, q + 4). WS 2: lane L takes row n % 8 = L / 4 and q = L % 4, so a warp's
// stores hit 32 distinct banks (WS 1 takes 32 float4 of one row: 8-way conflicts).
template <int ROWS, int WS, int THREADS>
__device__ __forceinline__ void stage_split(float* wb, float* ws, const float* __restrict__ w,
                                            int n_valid) {
#pragma unroll 8
    for (int e = threadIdx.x; e < ROWS * K / 4; e += THREADS) {
        int n, c, q;
        if (WS == 1) {
            n = e / (K / 4), c = (e % (K / 4)) / 4, q = e % 4;
        } else {
            const int L = e % 32, blk = e / 32;
            n = 8 * (blk % (ROWS / 8)) + L / 4, c = blk / (ROWS / 8), q = L % 4;
        }
        const float4 v = n < n_valid
            ? __ldg(reinterpret_cast<const float4*>(w) + n * (K / 4) + 4 * c + q)
            : make_float4(0.f, 0.f, 0.f, 0.f);
        const float vs[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int l = 8 * (2 * c + (i >> 1)) + q + 4 * (i & 1);
            unsigned big, small;
            split(vs[i], big, small);
            wb[cm(n, l, ROWS)] = __uint_as_float(big);
            ws[cm(n, l, ROWS)] = __uint_as_float(small);
        }
    }
}

// d += A . B^T over K for the warp's 16 rows of the tile in buf (A from registers, read, split
// and multiplied CS k-steps at a time), B's halves wb, ws of ROWS = 2 * NACC rows. After the
// last chunk's fragments are read, tile_read() runs: the buffer may take the next tile.
template <int NACC, class Read>
__device__ __forceinline__ void tile_products(float (&d)[NACC], const float* buf,
                                              const float* wb, const float* ws, int warp, int g,
                                              int t, Read tile_read) {
    constexpr int ROWS = 2 * NACC;
#pragma unroll
    for (int c0 = 0; c0 < K / 8; c0 += CS) {
        float4 raw[CS / 2][2];  // physical columns 16c + 4t .. + 3 of rows g and g + 8
#pragma unroll
        for (int c = 0; c < CS / 2; ++c)
#pragma unroll
            for (int h = 0; h < 2; ++h)
                raw[c][h] = *reinterpret_cast<const float4*>(
                    buf + XOFF(16 * warp + g + 8 * h, 16 * (c0 / 2 + c) + 4 * t));
        if (c0 + CS == K / 8) tile_read();
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
            const unsigned lb = ROWS * 16;
            const int kb = 2 * (c0 + s) * (ROWS / 8) * 32;
#if PASSES == 3
            wgmma_rs(d, small[s], desc(wb + kb, lb, 128));
            wgmma_rs(d, big[s], desc(ws + kb, lb, 128));
#endif
            wgmma_rs(d, big[s], desc(wb + kb, lb, 128));
        }
        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
        asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");  // A's registers free
    }
}
