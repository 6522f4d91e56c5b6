// Issue 34 probe: the pool's forward at many horizons (N_HORIZONS = 32, HIDDEN_DIM = 128,
// K <= 64) on Hopper's warpgroup MMA (wgmma, sm_90a), in 3xTF32 as LAYOUT 4. LAYOUT 4's H=32
// passes issue about 9 warp instructions an mma.sync (operand loads and splits by every warp,
// 16 warps an SM at IPC 1.5); a wgmma m64n32k8 does the work of 16 of them from one
// instruction a warp, B straight from shared memory. This measures whether that takes the
// forward under LAYOUT 4's 18.6 us (B = 512, K = 64) before a layout is built on it.
//
// A warpgroup a row (WG a block, grid-strided over the rows), its next row's cp.async in flight:
//   S [KP x H] = LN . Q^T     m64n32, A = the row from registers (float4 reads, k permuted in
//                             pairs of k-steps as q's halves are staged), B = q's halves, split
//                             once a block
//   softmax over the keys     from the accumulators: a quad's shuffles, then 4 warps' partial
//                             max and sum through shared memory, in warp order
//   ctx^T [D x H] = LN^T . P^T  two m64n32 tiles of D, A = the row's columns from registers,
//                             B = P's halves, written by the softmax
// Outside the library; run.py compiles it with -D WG and checks it against float64.
#include "wgmma.cuh"

#define NH 32                 // horizons: the n of every product
#define DD 128                // HIDDEN_DIM
#define KP 64                 // keys a row holds (zeros past K)
#define LDW (DD + 16)         // a row buffer's key stride: float4 fragment reads conflict-free
#define THREADS (128 * WG)
#define CS 4                  // k-steps a chunk of A fragments
// dynamic shared memory (floats): q's halves, then per warpgroup two row buffers, P's halves,
// the warps' partial max and sum
#define WG_FLOATS (2 * KP * LDW + 2 * NH * KP + 2 * 4 * NH)
#define SHARED_FLOATS (2 * NH * DD + WG * WG_FLOATS)

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

__device__ __forceinline__ void fence_async() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void commit_wait()
{
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
}

extern "C" __global__ void __launch_bounds__(THREADS, 1)
pool_wg_forward(const float* __restrict__ q_h, const float* __restrict__ ln,
                float* __restrict__ ctx, float* __restrict__ attn, const int K, const float scale,
                const int B)
{
    extern __shared__ __align__(128) float sm[];
    float *qb = sm, *qs = qb + NH * DD;
    const int wg = threadIdx.x / 128, tid = threadIdx.x % 128;
    float* mine = qs + NH * DD + wg * WG_FLOATS;
    float* bufs = mine;                       // [2][KP][LDW]
    float *pb = bufs + 2 * KP * LDW, *ps = pb + NH * KP;
    float *rmax = ps + NH * KP, *rsum = rmax + 4 * NH;
    const int warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
    const float to_log2 = scale * 1.4426950408889634f;
    const int stride = gridDim.x * WG;
    int b = blockIdx.x * WG + wg;
    if (b < B) load_row(bufs, ln, b, K, tid);
    // q's halves: physical columns 16c + 4j + i of a row are logical (k-step 2c + i / 2,
    // j + 4 (i % 2)), the order the A fragments are read in
    for (int e = threadIdx.x; e < NH * DD / 4; e += THREADS) {
        const int h = e / (DD / 4), c = (e % (DD / 4)) / 4, j = e % 4;
        const float4 v = reinterpret_cast<const float4*>(q_h)[e];
        const float vs[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int l = 8 * (2 * c + i / 2) + j + 4 * (i % 2);
            unsigned big, small;
            split(vs[i], big, small);
            qb[core_offset(h, l, NH)] = __uint_as_float(big);
            qs[core_offset(h, l, NH)] = __uint_as_float(small);
        }
    }
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
    for (int i = 0; b < B; b += stride, ++i) {
        const float* buf = bufs + (i & 1) * KP * LDW;
        if (b + stride < B)
            load_row(bufs + ((i + 1) & 1) * KP * LDW, ln, b + stride, K, tid);
        else
            asm volatile("cp.async.commit_group;\n" ::: "memory");
        asm volatile("cp.async.wait_group 1;\n" ::: "memory");
        wg_barrier(wg);

        // scores: the warp's keys 16 warp + g (+ 8), every horizon
        float s[16];
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
            fence_async();
#pragma unroll
            for (int k = 0; k < CS; ++k) {
                const int off = 2 * (c0 + k) * (NH / 8) * 32;
                wg3(s, big[k], small[k], qb + off, qs + off);
            }
            commit_wait();
        }

        // softmax over the keys, in log2 units; s[4 j + 2 r + e]: key 16 warp + g + 8 r,
        // horizon 8 j + 2 t + e
        const int k0 = 16 * warp + g;
        float m[8];
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
#pragma unroll
                for (int r = 0; r < 2; ++r) {
                    float& v = s[4 * j + 2 * r + e];
                    v = k0 + 8 * r < K ? v * to_log2 : -INFINITY;
                }
                float x = fmaxf(s[4 * j + e], s[4 * j + 2 + e]);
#pragma unroll
                for (int o = 4; o < 32; o *= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
                m[2 * j + e] = x;
            }
        if (g == 0)
#pragma unroll
            for (int j = 0; j < 4; ++j)
#pragma unroll
                for (int e = 0; e < 2; ++e) rmax[warp * NH + 8 * j + 2 * t + e] = m[2 * j + e];
        wg_barrier(wg);
        float sum[8];
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int h = 8 * j + 2 * t + e;
                const float top = fmaxf(fmaxf(rmax[h], rmax[NH + h]),
                                        fmaxf(rmax[2 * NH + h], rmax[3 * NH + h]));
                float x = 0.f;
#pragma unroll
                for (int r = 0; r < 2; ++r) {
                    float& v = s[4 * j + 2 * r + e];
                    v = exp2f(v - top);  // 0 past K
                    x += v;
                }
#pragma unroll
                for (int o = 4; o < 32; o *= 2) x += __shfl_xor_sync(0xffffffffu, x, o);
                sum[2 * j + e] = x;
            }
        if (g == 0)
#pragma unroll
            for (int j = 0; j < 4; ++j)
#pragma unroll
                for (int e = 0; e < 2; ++e) rsum[warp * NH + 8 * j + 2 * t + e] = sum[2 * j + e];
        wg_barrier(wg);
        float* attnb = attn + (size_t)b * NH * K;
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int h = 8 * j + 2 * t + e;
                const float inv =
                    1.f / (((rsum[h] + rsum[NH + h]) + rsum[2 * NH + h]) + rsum[3 * NH + h]);
#pragma unroll
                for (int r = 0; r < 2; ++r) {
                    const int key = k0 + 8 * r;
                    const float p = s[4 * j + 2 * r + e] * inv;
                    if (key < K) attnb[h * K + key] = p;
                    unsigned big, small;
                    split(p, big, small);
                    pb[core_offset(h, key, NH)] = __uint_as_float(big);
                    ps[core_offset(h, key, NH)] = __uint_as_float(small);
                }
            }
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        wg_barrier(wg);

        // ctx^T: tiles of 64 columns, the warp's columns 64 mt + 16 warp + g (+ 8)
        float* ctxb = ctx + (size_t)b * NH * DD;
#pragma unroll
        for (int mt = 0; mt < DD / 64; ++mt) {
            float a[16];
#pragma unroll
            for (int e = 0; e < 16; ++e) a[e] = 0.f;
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
                fence_async();
#pragma unroll
                for (int k = 0; k < CS; ++k) {
                    const int off = 2 * (c0 + k) * (NH / 8) * 32;
                    wg3(a, big[k], small[k], pb + off, ps + off);
                }
                commit_wait();
            }
#pragma unroll
            for (int j = 0; j < 4; ++j)
#pragma unroll
                for (int r = 0; r < 2; ++r)
#pragma unroll
                    for (int e = 0; e < 2; ++e)
                        ctxb[(8 * j + 2 * t + e) * DD + dm + 8 * r] = a[4 * j + 2 * r + e];
        }
        wg_barrier(wg);  // the buffer, P and the partials are free for the row after next
    }
}
