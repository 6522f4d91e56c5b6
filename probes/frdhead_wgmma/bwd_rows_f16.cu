// Issue 32 probe: the FRD head backward's two row products in one launch on FP16 pieces:
//   dpre     = (G w2) . [hidden > 0]        (G = grad_logits [B, HA], w2 [HA, F])
//   grad_h_t = dpre w1                      (w1 [F, D])
// where the library runs them in two launches (frdhead_wg_dhidden, frdhead_wg_grad_h_t), each
// beside its stage's weight gradient. dpre is stored for grad_w1's weight gradient (dW1 =
// dpre^T h_t), which the library's launch computes unchanged from it (its mask is then a no-op).
// Both weights are staged once a block as the forward stages them (stage_f16: rows n scaled by
// a power of two, K-major core matrices), and read transposed (wgmma's imm-trans-b, the
// MN-major reading mn_major.cu proved: leading byte offset = the k step, 128 bytes; stride =
// the n step, ROWS * 16). A weight row's scale lies along these products' k, so it is folded
// into A's columns (G by 1 / t2, dpre by 1 / t1: powers of two, exact) before A's own row scale.
// dhidden's accumulator fragment, masked and folded, is grad_h_t's A fragment (acc_f16): dpre
// never comes back from memory. A warpgroup's G tiles (rows of HA floats, copied as one span a
// tile, the library's wb_copy_rows) come by cp.async a tile ahead; the mask is read from
// hidden at the accumulator's positions as a tile starts, under its products.
// bwd_rows_f16.py renders the frdhead family with its backward knobs (wb_copy_rows and the WB_*
// sizes come from there), then appends this file.
#include "wgmma_f16.cuh"
#define BR_THREADS (128 * WG)
#define BR_KG 112                           // G's k: HA padded to whole k16 steps
static_assert(HA <= BR_KG && HA > BR_KG - 8, "the w2 staging's rows: 105..112 logits");

// d (m64n128, f32) += A (registers) . B^T, B = a K-major FP16 operand read transposed
__device__ __forceinline__ void wgmma_f16_t(float (&d)[64], const unsigned (&a)[4],
                                            unsigned long long db) {
    asm volatile(WG_F16_OPEN(128) ", %56, %57, %58, %59, %60, %61, %62, %63}, "
                 "{%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
                 : WG_ACC_56, "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]),
                   "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}

// d = A . W over KS k16 steps, W's pieces [KROWS x 128] staged K-major (rows = this product's
// k) and read transposed; three products a step, then waited for
template <int KROWS, int KS>
__device__ __forceinline__ void products_t(float (&d)[64], const unsigned (&big)[KS][4],
                                           const unsigned (&small)[KS][4], const __half* wb,
                                           const __half* ws) {
#pragma unroll
    for (int i = 0; i < 64; ++i) d[i] = 0.f;
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
    for (int s = 0; s < KS; ++s) {
        const int kb = 2 * s * 64;  // halves to this step's first core matrix
        wgmma_f16_t(d, small[s], wg_desc(reinterpret_cast<const float*>(wb + kb), 128, KROWS * 16));
        wgmma_f16_t(d, big[s], wg_desc(reinterpret_cast<const float*>(ws + kb), 128, KROWS * 16));
        wgmma_f16_t(d, big[s], wg_desc(reinterpret_cast<const float*>(wb + kb), 128, KROWS * 16));
    }
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
}

extern "C" __global__ void __launch_bounds__(BR_THREADS, 1)
bwd_rows_f16(const float* __restrict__ grad_logits, const float* __restrict__ hidden,
             const float* __restrict__ w1, const float* __restrict__ w2,
             float* __restrict__ dpre, float* __restrict__ grad_h_t, const int B)
{
    __half* w2b = reinterpret_cast<__half*>(dynamic_smem);  // [BR_KG x F]
    __half* w2s = w2b + BR_KG * FRD_HIDDEN;
    __half* w1b = w2s + BR_KG * FRD_HIDDEN;                  // [F x D]
    __half* w1s = w1b + FRD_HIDDEN * D_IN;
    float* inv_t2 = reinterpret_cast<float*>(w1s + FRD_HIDDEN * D_IN);
    float* inv_t1 = inv_t2 + BR_KG;
    const int wg = threadIdx.x / 128, tid = threadIdx.x % 128;
    const int warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
    float* buf = inv_t1 + FRD_HIDDEN + wg * WB_ROWS * HA;  // G's tile, rows at stride HA
    const int tiles = (B + WB_ROWS - 1) / WB_ROWS, stride = gridDim.x * WG;
    auto load = [&](int tile) {  // one commit group a tile (empty past the last)
        if (tile < tiles) wb_copy_rows<WB_ROWS, HA, HA, 128>(buf, grad_logits, tile * WB_ROWS, B, tid);
        commit_copies();
    };
    int tile = blockIdx.x * WG + wg;
    load(tile);
    stage_f16<BR_KG, FRD_HIDDEN, BR_THREADS, false>(w2b, w2s, inv_t2, w2, HA);
    stage_f16<FRD_HIDDEN, D_IN, BR_THREADS, false>(w1b, w1s, inv_t1, w1, FRD_HIDDEN);
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // seen by wgmma's reads
    __syncthreads();
    for (; tile < tiles; tile += stride) {
        const int r0 = tile * WB_ROWS + 16 * warp + g;  // the thread's rows r0, r0 + 8
        // the mask at the accumulator's positions (row r0 + 8h, columns 8j + 2t, + 1)
        float2 hv[FRD_HIDDEN / 8][2];
#pragma unroll
        for (int j = 0; j < FRD_HIDDEN / 8; ++j)
#pragma unroll
            for (int h = 0; h < 2; ++h)
                hv[j][h] = r0 + 8 * h < B
                    ? __ldg(reinterpret_cast<const float2*>(
                          hidden + (size_t)(r0 + 8 * h) * FRD_HIDDEN + 8 * j + 2 * t))
                    : make_float2(0.f, 0.f);
        wait_copies<0>();
        wg_barrier(wg);
        float d[64];
        {
            unsigned big[BR_KG / 16][4], small[BR_KG / 16][4];
            float sc[2];
            {
                // G's fragments (a_q: row + 8 (q & 1), columns 16s + 2t + 8 (q >> 1), + 1),
                // each column divided by its w2 row's scale; columns past HA zero
                float2 raw[BR_KG / 16][4];
#pragma unroll
                for (int s = 0; s < BR_KG / 16; ++s)
#pragma unroll
                    for (int q = 0; q < 4; ++q) {
                        const int r = 16 * warp + g + 8 * (q & 1), c = 16 * s + 2 * t + 8 * (q >> 1);
                        const float x = buf[r * HA + min(c, HA - 1)];
                        const float y = buf[r * HA + min(c + 1, HA - 1)];
                        raw[s][q] = make_float2(c < HA ? x * inv_t2[c] : 0.f,
                                                c + 1 < HA ? y * inv_t2[c + 1] : 0.f);
                    }
                wg_barrier(wg);  // every thread has read the tile: the buffer takes the next
                load(tile + stride);
                float top[2] = {0.f, 0.f};
#pragma unroll
                for (int s = 0; s < BR_KG / 16; ++s)
#pragma unroll
                    for (int q = 0; q < 4; ++q)
                        top[q & 1] = fmaxf(top[q & 1], fmaxf(fabsf(raw[s][q].x), fabsf(raw[s][q].y)));
#pragma unroll
                for (int h = 0; h < 2; ++h) sc[h] = pow2_scale(quad_max(top[h]));
#pragma unroll
                for (int s = 0; s < BR_KG / 16; ++s)
#pragma unroll
                    for (int q = 0; q < 4; ++q)
                        split_pair(raw[s][q].x * sc[q & 1], raw[s][q].y * sc[q & 1], big[s][q],
                                   small[s][q]);
            }
            products_t<BR_KG, BR_KG / 16>(d, big, small, w2b, w2s);
            // dpre = d / sc where hidden > 0: stored; then folded by 1 / t1 for grad_h_t
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int r = r0 + 8 * h;
                const float inv = 1.f / sc[h];
#pragma unroll
                for (int j = 0; j < FRD_HIDDEN / 8; ++j) {
                    const int c = 8 * j + 2 * t;
                    float2 v;
                    v.x = hv[j][h].x > 0.f ? d[4 * j + 2 * h] * inv : 0.f;
                    v.y = hv[j][h].y > 0.f ? d[4 * j + 2 * h + 1] * inv : 0.f;
                    if (r < B) *reinterpret_cast<float2*>(dpre + (size_t)r * FRD_HIDDEN + c) = v;
                    d[4 * j + 2 * h] = v.x * inv_t1[c];
                    d[4 * j + 2 * h + 1] = v.y * inv_t1[c + 1];
                }
            }
        }
        float d2[64];
        float sh[2];
        {
            unsigned big[FRD_HIDDEN / 16][4], small[FRD_HIDDEN / 16][4];
            acc_f16(d, big, small, sh);
            products_t<FRD_HIDDEN, FRD_HIDDEN / 16>(d2, big, small, w1b, w1s);
        }
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int r = r0 + 8 * h;
            const float inv = 1.f / sh[h];
            if (r < B)
#pragma unroll
                for (int j = 0; j < D_IN / 8; ++j)
                    *reinterpret_cast<float2*>(grad_h_t + (size_t)r * D_IN + 8 * j + 2 * t) =
                        make_float2(d2[4 * j + 2 * h] * inv, d2[4 * j + 2 * h + 1] * inv);
        }
    }
}
