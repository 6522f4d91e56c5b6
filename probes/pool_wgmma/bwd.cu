// Issue 34 probe: the pool's backward at N_HORIZONS = 32, HIDDEN_DIM = 128, K <= 64 on wgmma
// (3xTF32), against LAYOUT 4's 37 us (B = 512, K = 64; fwd.cu is the forward). A warpgroup a
// row, WG a block, grid-strided; per row:
//   DW [key x h] = LN . G^T        m64n32, A = the row from registers, B = G's halves (staged
//                                  from grad_ctx as fwd.cu stages q)
//   c = sum_k A DW, DS = scale A (DW - c)   in the accumulator layout: A read from attn there,
//                                  c by a quad's shuffles and 4 warps' partials in warp order
//   GQ^T [d x h] += LN^T . DS^T    two m64n32 tiles, A = the row's columns from registers,
//                                  B = DS's halves; over the warpgroup's rows, one scratch row
//                                  a warpgroup at the end (reduce_axis0 sums them)
//   grad_ln [key x d] = A^T G + DS^T Q   m64n128 over the horizons: A = attn and DS straight
//                                  from their registers (the accumulator layout is an A fragment
//                                  with k permuted: hk below), B = G's and q's halves [d x h]
// The row buffer takes the next row's copies once GQ has read it, so they overlap grad_ln.
// Outside the library; run.py compiles it with -D WG, CS and checks it against float64.
#include "pool_wg.cuh"

// Dynamic shared memory (floats): q's halves [DD x NH], then per warpgroup the row buffer, G's
// halves (by d for DW, then by h for grad_ln), DS's halves, the warps' partial c.
#define WG_FLOATS (KP * LDW + 2 * NH * DD + 2 * NH * KP + 4 * NH)

// k index of horizon h in grad_ln's products: a lane's accumulators hold horizons 8 j + 2 t
// and 8 j + 2 t + 1, which k-step j's A fragment takes as its k = t and t + 4
__device__ __forceinline__ int hk(int h) { return 8 * (h / 8) + (h % 8) / 2 + 4 * (h % 2); }

// A share (load_share) into halves [DD rows x NH] (k = hk(h)) for grad_ln's products. Thread
// (a = lane % 4, b = lane / 4) stores column 16 c + 4 a + jj of row 8 warp + b, jj rotated by
// 2 (a / 2) + b % 2, so that a warp's stores hit 32 banks: (d % 8, k % 4) = (4 (a % 2) + jj,
// b / 2).
__device__ __forceinline__ void stage_by_h(float* wb, float* ws, const float4 (&v)[8], int warp,
                                           int lane)
{
    const int a = lane % 4, b = lane / 4, k = hk(8 * warp + b), rot = 2 * (a / 2) + b % 2;
#pragma unroll
    for (int c = 0; c < 8; ++c)
#pragma unroll
        for (int s = 0; s < 4; ++s) {
            const int jj = (s + rot) % 4, d = 16 * c + 4 * a + jj;
            unsigned big, small;
            split(component(v[c], jj), big, small);
            wb[core_offset(d, k, DD)] = __uint_as_float(big);
            ws[core_offset(d, k, DD)] = __uint_as_float(small);
        }
}

// acc [key x d] += V^T X over the horizons: V (a lane's 16 values in the accumulator layout of
// rows_by_horizons) as A, X's halves staged by stage_by_h
__device__ __forceinline__ void keys_by_columns(float (&acc)[64], const float (&v)[16],
                                                const float* xb, const float* xs)
{
    unsigned big[4][4], small[4][4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        split(v[4 * j], big[j][0], small[j][0]);      // key g, k t
        split(v[4 * j + 2], big[j][1], small[j][1]);  // key g + 8, k t
        split(v[4 * j + 1], big[j][2], small[j][2]);  // key g, k t + 4
        split(v[4 * j + 3], big[j][3], small[j][3]);  // key g + 8, k t + 4
    }
    fence_operands();
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const int off = 2 * j * (DD / 8) * 32;
        wgmma_3xtf32(acc, big[j], small[j], xb + off, xs + off, DD);
    }
    commit_wait();
}

extern "C" __global__ void __launch_bounds__(THREADS, 1)
pool_wg_backward(const float* __restrict__ q_h, const float* __restrict__ ln,
                 const float* __restrict__ attn, const float* __restrict__ grad_ctx,
                 float* __restrict__ grad_ln, float* __restrict__ gq_part, const int K,
                 const float scale, const int B)
{
    extern __shared__ __align__(128) float sm[];
    float *qtb = sm, *qts = qtb + NH * DD;
    const int wg = threadIdx.x / 128, tid = threadIdx.x % 128;
    float* buf = qts + NH * DD + wg * WG_FLOATS;
    float *gb = buf + KP * LDW, *gsm = gb + NH * DD, *db = gsm + NH * DD, *dsm = db + NH * KP;
    float* part = dsm + NH * KP;
    const int warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
    const int k0 = 16 * warp + g;  // the lane's keys k0 and k0 + 8
    const int stride = gridDim.x * WG;
    int b = blockIdx.x * WG + wg;
    if (b < B) load_row(buf, ln, b, K, tid);
    if (wg == 0) {  // q's halves, the block's
        float4 v[8];
        load_share(v, q_h, warp, lane);
        stage_by_h(qtb, qts, v, warp, lane);
    }
    fence_proxy();
    __syncthreads();
    float gq[2][16];
#pragma unroll
    for (int e = 0; e < 16; ++e) gq[0][e] = gq[1][e] = 0.f;
    for (; b < B; b += stride) {
        const float* gcb = grad_ctx + (size_t)b * NH * DD;
        float4 gv[8];  // the row's G, staged twice
        load_share(gv, gcb, warp, lane);
        float av[16];  // attn at the accumulator layout: key k0 + 8 r, horizon 8 j + 2 t + e
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int r = 0; r < 2; ++r)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const int key = k0 + 8 * r, h = 8 * j + 2 * t + e;
                    av[4 * j + 2 * r + e] =
                        key < K ? attn[((size_t)b * NH + h) * K + key] : 0.f;
                }
        stage_by_d(gb, gsm, gv, warp, lane);
        asm volatile("cp.async.wait_group 0;\n" ::: "memory");
        fence_proxy();
        wg_barrier(wg);

        float dw[16];
        rows_by_horizons(dw, buf, gb, gsm, warp, g, t);
        float c[8];
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                float x = av[4 * j + e] * dw[4 * j + e] + av[4 * j + 2 + e] * dw[4 * j + 2 + e];
#pragma unroll
                for (int o = 4; o < 32; o *= 2) x += __shfl_xor_sync(0xffffffffu, x, o);
                c[2 * j + e] = x;
            }
        if (g == 0)
#pragma unroll
            for (int j = 0; j < 4; ++j)
#pragma unroll
                for (int e = 0; e < 2; ++e) part[warp * NH + 8 * j + 2 * t + e] = c[2 * j + e];
        wg_barrier(wg);  // the partials are in; every warp's DW products are done with G's halves
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int h = 8 * j + 2 * t + e;
                const float ch = ((part[h] + part[NH + h]) + part[2 * NH + h]) + part[3 * NH + h];
#pragma unroll
                for (int r = 0; r < 2; ++r) {
                    float& v = dw[4 * j + 2 * r + e];  // DS from here on
                    v = scale * av[4 * j + 2 * r + e] * (v - ch);
                }
            }
        stage_by_keys(db, dsm, dw, warp, g, t);
        stage_by_h(gb, gsm, gv, warp, lane);
        fence_proxy();
        wg_barrier(wg);

#pragma unroll
        for (int mt = 0; mt < 2; ++mt) columns_by_horizons(gq[mt], buf, db, dsm, mt, warp, g, t);
        wg_barrier(wg);  // every warp has read the row: the buffer takes the next one
        if (b + stride < B) {  // the next row's ln; its G and attn into L2
            load_row(buf, ln, b + stride, K, tid);
            asm volatile("prefetch.global.L2 [%0];" ::"l"(grad_ctx + (size_t)(b + stride) * NH * DD
                                                           + 32 * tid));
            if (tid < NH * K / 32)
                asm volatile("prefetch.global.L2 [%0];" ::"l"(attn + (size_t)(b + stride) * NH * K
                                                               + 32 * tid));
        }

        float acc[64];
#pragma unroll
        for (int e = 0; e < 64; ++e) acc[e] = 0.f;
        keys_by_columns(acc, av, gb, gsm);
        keys_by_columns(acc, dw, qtb, qts);
        float* glb = grad_ln + (size_t)b * K * DD;
#pragma unroll
        for (int j = 0; j < 16; ++j)
#pragma unroll
            for (int r = 0; r < 2; ++r)
                if (k0 + 8 * r < K)
                    *reinterpret_cast<float2*>(glb + (size_t)(k0 + 8 * r) * DD + 8 * j + 2 * t) =
                        make_float2(acc[4 * j + 2 * r], acc[4 * j + 2 * r + 1]);
        wg_barrier(wg);  // G's and DS's halves and the partials are free for the next row
    }
    float* out = gq_part + (size_t)(blockIdx.x * WG + wg) * NH * DD;
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int r = 0; r < 2; ++r)
#pragma unroll
                for (int e = 0; e < 2; ++e)
                    out[(8 * j + 2 * t + e) * DD + 64 * mt + 16 * warp + g + 8 * r] =
                        gq[mt][4 * j + 2 * r + e];
}
