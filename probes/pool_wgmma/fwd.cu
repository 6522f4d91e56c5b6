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
// Outside the library; run.py compiles it with -D WG, NBUF, CS and checks it against float64.
#include "pool_wg.cuh"

// -D knobs: WG (warpgroups a block), NBUF (row buffers a warpgroup: 2 keeps the next row's
// copies in flight, 1 leaves room for more warpgroups), CS (k-steps a chunk of A fragments).
// Dynamic shared memory (floats): q's halves, then per warpgroup its row buffers, P's halves,
// the warps' partial max and sum.
#define WG_FLOATS (NBUF * KP * LDW + 2 * NH * KP + 2 * 4 * NH)

extern "C" __global__ void __launch_bounds__(THREADS, 1)
pool_wg_forward(const float* __restrict__ q_h, const float* __restrict__ ln,
                float* __restrict__ ctx, float* __restrict__ attn, const int K, const float scale,
                const int B)
{
    extern __shared__ __align__(128) float sm[];
    float *qb = sm, *qs = qb + NH * DD;
    const int wg = threadIdx.x / 128, tid = threadIdx.x % 128;
    float* mine = qs + NH * DD + wg * WG_FLOATS;
    float* bufs = mine;                       // [NBUF][KP][LDW]
    float *pb = bufs + NBUF * KP * LDW, *ps = pb + NH * KP;
    float *rmax = ps + NH * KP, *rsum = rmax + 4 * NH;
    const int warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
    const float to_log2 = scale * 1.4426950408889634f;
    const int stride = gridDim.x * WG;
    int b = blockIdx.x * WG + wg;
    if (b < B) load_row(bufs, ln, b, K, tid);
    if (wg == 0) {  // q's halves, the block's
        float4 v[8];
        load_share(v, q_h, warp, lane);
        stage_by_d(qb, qs, v, warp, lane);
    }
    fence_proxy();
    __syncthreads();
    for (int i = 0; b < B; b += stride, ++i) {
        float* buf = bufs + (NBUF == 2 ? (i & 1) * KP * LDW : 0);
        if (NBUF == 2) {
            if (b + stride < B)
                load_row(bufs + ((i + 1) & 1) * KP * LDW, ln, b + stride, K, tid);
            else
                asm volatile("cp.async.commit_group;\n" ::: "memory");
            asm volatile("cp.async.wait_group 1;\n" ::: "memory");
        } else {
            asm volatile("cp.async.wait_group 0;\n" ::: "memory");
        }
        wg_barrier(wg);

        float s[16];  // scores of the warp's keys 16 warp + g (+ 8), every horizon
        rows_by_horizons(s, buf, qb, qs, warp, g, t);

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
                    s[4 * j + 2 * r + e] = p;
                    if (key < K) attnb[h * K + key] = p;
                }
            }
        stage_by_keys(pb, ps, s, warp, g, t);
        fence_proxy();
        wg_barrier(wg);

        // ctx^T: tiles of 64 columns, the warp's columns 64 mt + 16 warp + g (+ 8)
        float* ctxb = ctx + (size_t)b * NH * DD;
#pragma unroll
        for (int mt = 0; mt < DD / 64; ++mt) {
            float a[16];
#pragma unroll
            for (int e = 0; e < 16; ++e) a[e] = 0.f;
            columns_by_horizons(a, buf, pb, ps, mt, warp, g, t);
            const int dm = 64 * mt + 16 * warp + g;
#pragma unroll
            for (int j = 0; j < 4; ++j)
#pragma unroll
                for (int r = 0; r < 2; ++r)
#pragma unroll
                    for (int e = 0; e < 2; ++e)
                        ctxb[(8 * j + 2 * t + e) * DD + dm + 8 * r] = a[4 * j + 2 * r + e];
        }
        wg_barrier(wg);  // the buffer, P and the partials are free for the row after next
        if (NBUF == 1 && b + stride < B) load_row(buf, ln, b + stride, K, tid);
    }
}
