// The pieces fwd.cu and bwd.cu share: N_HORIZONS = 32, HIDDEN_DIM = 128, rows of up to 64 keys,
// a warpgroup a row, 3xTF32 on wgmma with A from registers (cu/wgmma.cuh: the operand layout,
// the descriptor, the warpgroup's barrier).
#pragma once
#include "wgmma.cuh"

#define NH 32                 // horizons: the n of the m64n32 products
#define DD 128                // HIDDEN_DIM
#define KP 64                 // keys a row holds (zeros past K): one m64 tile
#define LDW (DD + 16)         // a row buffer's key stride: float4 fragment reads conflict-free
#define THREADS (128 * WG)
#ifndef CS
#define CS 4                  // k-steps a chunk of A fragments
#endif

__device__ __forceinline__ void split(float x, unsigned& big, unsigned& small)
{
    big = __float_as_uint(x) & 0xffffe000u;
    small = __float_as_uint(x - __uint_as_float(big));
}

__device__ __forceinline__ void wgmma_n32(float (&d)[16], const unsigned (&a)[4],
                                          unsigned long long db)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n32k8.f32.tf32.tf32 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
                 "{%16, %17, %18, %19}, %20, p, 1, 1;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),
                   "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
                   "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}

// d += A . B^T over one k-step, 3xTF32; B's halves of NH rows at this k-step's core matrices
__device__ __forceinline__ void wg3(float (&d)[16], const unsigned (&big)[4],
                                    const unsigned (&small)[4], const float* wb, const float* ws)
{
    wgmma_n32(d, small, wg_desc(wb, NH * 16, 128));
    wgmma_n32(d, big, wg_desc(ws, NH * 16, 128));
    wgmma_n32(d, big, wg_desc(wb, NH * 16, 128));
}

__device__ __forceinline__ void fence_operands()
{
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void commit_wait()
{
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
}
// generic-proxy stores to shared memory, then read by wgmma (the async proxy)
__device__ __forceinline__ void fence_proxy()
{
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

__device__ __forceinline__ void copy16(float* dst, const float* src, bool valid)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(
                     (unsigned)__cvta_generic_to_shared(dst)),
                 "l"(src), "r"(valid ? 16 : 0) : "memory");
}

// row b of ln [B, K, DD] into buf [KP][LDW] (keys past K zeros), one commit group
__device__ __forceinline__ void load_row(float* buf, const float* __restrict__ ln, int b, int K,
                                         int tid)
{
    const float* src = ln + (size_t)b * K * DD;
    for (int e = tid; e < KP * DD / 4; e += 128) {
        const int r = e / (DD / 4), c = 4 * (e % (DD / 4));
        copy16(buf + r * LDW + c, r < K ? src + (size_t)r * DD + c : src, r < K);
    }
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// A warpgroup's share of x [NH, DD] (row-major): thread (warp, lane) holds row 8 warp + lane / 4,
// float4 lane % 4 of each 16 columns (v[i]: columns 16 i + 4 (lane % 4) ..), so that both
// stagings below store conflict-free
__device__ __forceinline__ void load_share(float4 (&v)[8], const float* __restrict__ x, int warp,
                                           int lane)
{
    const float4* row = reinterpret_cast<const float4*>(x + (8 * warp + lane / 4) * DD);
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = row[4 * i + lane % 4];
}

__device__ __forceinline__ float component(const float4& v, int i)
{
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// The share into halves wb, ws as the B operand of rows_by_horizons ([NH rows x DD], K-major):
// physical columns 16c + 4j + i of a row are logical (k-step 2c + i / 2, j + 4 (i % 2)), the
// order rows_by_horizons reads A's float4s in. A warp's stores take rows n % 8 = lane / 4 and
// k % 4 = lane % 4: 32 banks.
__device__ __forceinline__ void stage_by_d(float* wb, float* ws, const float4 (&v)[8], int warp,
                                           int lane)
{
    const int h = 8 * warp + lane / 4, j = lane % 4;
#pragma unroll
    for (int c = 0; c < 8; ++c)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int l = 8 * (2 * c + i / 2) + j + 4 * (i % 2);
            unsigned big, small;
            split(component(v[c], i), big, small);
            wb[core_offset(h, l, NH)] = __uint_as_float(big);
            ws[core_offset(h, l, NH)] = __uint_as_float(small);
        }
}

// s [key x h] = LN . X^T over DD for the warp's keys 16 warp + g (+ 8), X's halves staged by
// stage_by_d; s[4 j + 2 r + e] is key 16 warp + g + 8 r, horizon 8 j + 2 t + e
__device__ __forceinline__ void rows_by_horizons(float (&s)[16], const float* buf, const float* xb,
                                                 const float* xs, int warp, int g, int t)
{
#pragma unroll
    for (int e = 0; e < 16; ++e) s[e] = 0.f;
#pragma unroll
    for (int c0 = 0; c0 < DD / 8; c0 += CS) {
        unsigned big[CS][4], small[CS][4];
#pragma unroll
        for (int c = 0; c < CS / 2; ++c) {
            const int col = 16 * (c0 / 2 + c) + 4 * t;
            const float4 r0 = *reinterpret_cast<const float4*>(buf + (16 * warp + g) * LDW + col);
            const float4 r1 =
                *reinterpret_cast<const float4*>(buf + (16 * warp + g + 8) * LDW + col);
            split(r0.x, big[2 * c][0], small[2 * c][0]);
            split(r1.x, big[2 * c][1], small[2 * c][1]);
            split(r0.y, big[2 * c][2], small[2 * c][2]);
            split(r1.y, big[2 * c][3], small[2 * c][3]);
            split(r0.z, big[2 * c + 1][0], small[2 * c + 1][0]);
            split(r1.z, big[2 * c + 1][1], small[2 * c + 1][1]);
            split(r0.w, big[2 * c + 1][2], small[2 * c + 1][2]);
            split(r1.w, big[2 * c + 1][3], small[2 * c + 1][3]);
        }
        fence_operands();
#pragma unroll
        for (int k = 0; k < CS; ++k) {
            const int off = 2 * (c0 + k) * (NH / 8) * 32;
            wg3(s, big[k], small[k], xb + off, xs + off);
        }
        commit_wait();
    }
}

// a [d x h] += LN^T . Y^T over the row's KP keys for columns 64 mt + 16 warp + g (+ 8), Y's
// halves [NH rows x KP keys] in core-matrix layout, keys in order
__device__ __forceinline__ void columns_by_horizons(float (&a)[16], const float* buf,
                                                    const float* yb, const float* ys, int mt,
                                                    int warp, int g, int t)
{
    const int dm = 64 * mt + 16 * warp + g;
#pragma unroll
    for (int c0 = 0; c0 < KP / 8; c0 += CS) {
        unsigned big[CS][4], small[CS][4];
#pragma unroll
        for (int k = 0; k < CS; ++k) {
            const float* r0 = buf + (8 * (c0 + k) + t) * LDW + dm;
            const float* r4 = r0 + 4 * LDW;
            split(r0[0], big[k][0], small[k][0]);
            split(r0[8], big[k][1], small[k][1]);
            split(r4[0], big[k][2], small[k][2]);
            split(r4[8], big[k][3], small[k][3]);
        }
        fence_operands();
#pragma unroll
        for (int k = 0; k < CS; ++k) {
            const int off = 2 * (c0 + k) * (NH / 8) * 32;
            wg3(a, big[k], small[k], yb + off, ys + off);
        }
        commit_wait();
    }
}

// v [key x h] (the accumulator layout above) into Y's halves [NH x KP] for columns_by_horizons
__device__ __forceinline__ void stage_by_keys(float* yb, float* ys, const float (&v)[16],
                                              int warp, int g, int t)
{
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int r = 0; r < 2; ++r)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int h = 8 * j + 2 * t + e, key = 16 * warp + g + 8 * r;
                unsigned big, small;
                split(v[4 * j + 2 * r + e], big, small);
                yb[core_offset(h, key, NH)] = __uint_as_float(big);
                ys[core_offset(h, key, NH)] = __uint_as_float(small);
            }
}
