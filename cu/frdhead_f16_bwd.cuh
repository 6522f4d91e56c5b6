// FRD head backward's row products in one launch on FP16 pieces (wgmma_f16.cuh), the backward
// role's engine WGMMA = 2, for the model's head shape (frdhead_wgmma_bwd.cuh's restriction):
//   frdhead_f16_rows         dpre = (G w2) . [hidden > 0], grad_h_t = dpre w1   (G = grad_logits)
//   frdhead_wg_grad_w1_dpre  frdhead_wgmma_bwd.cuh's weight gradient over dpre and h_t, unmasked
// beside frdhead_wg_grad_w2 over G and hidden. WGMMA 1 runs the two row products as two
// launches, dhidden going to memory and back between them, and masks in the weight gradient.
// Both weights are staged once a block as the forward stages them (stage_f16: each row scaled
// by a power of two, K-major core matrices) and read transposed (products_t). A weight row's
// scale lies along these products' k, so it is folded into A's columns (G by 1 / t2, dpre by
// 1 / t1: powers of two, exact) before A's own row scale. dhidden's accumulator fragment, masked
// and folded, is grad_h_t's A fragment (acc_f16). G's tiles (rows of HA floats, copied as one
// span a tile: wb_copy_rows) come by cp.async a tile ahead; the mask is read from hidden at the
// accumulator's positions as a tile starts, under the products. Fixed sums: bitwise reruns.

#define WR_KG 112  // G's k: HA padded to whole k16 steps
// dynamic shared memory in floats: both weights' pieces (halves), their rows' inverse scales,
// then a G tile a warpgroup
#define WR_ROWS_FLOATS (WR_KG * FRD_HIDDEN + FRD_HIDDEN * D_IN + WR_KG + FRD_HIDDEN \
                        + WG * WB_ROWS * HA)
// frdhead_wg_grad_w1_dpre's: X's halves twice, then STAGES steps' raw dpre and h_t tiles
#define WR_GRAD_W1_FLOATS (4 * WB_N * BK + STAGES * 2 * BK * WB_LDT)
static_assert(HA <= WR_KG && HA > WR_KG - 8, "the w2 staging's rows: 105..112 logits");

extern "C" __global__ void __launch_bounds__(WB_RP_THREADS, 1)
frdhead_f16_rows(const float* __restrict__ grad_logits, const float* __restrict__ hidden,
                 const float* __restrict__ w1, const float* __restrict__ w2,
                 float* __restrict__ dpre, float* __restrict__ grad_h_t, const int B)
{
    __half* w2b = reinterpret_cast<__half*>(dynamic_smem);  // [WR_KG x F]
    __half* w2s = w2b + WR_KG * FRD_HIDDEN;
    __half* w1b = w2s + WR_KG * FRD_HIDDEN;                  // [F x D]
    __half* w1s = w1b + FRD_HIDDEN * D_IN;
    float* inv_t2 = reinterpret_cast<float*>(w1s + FRD_HIDDEN * D_IN);
    float* inv_t1 = inv_t2 + WR_KG;
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
    stage_f16<WR_KG, FRD_HIDDEN, WB_RP_THREADS, false>(w2b, w2s, inv_t2, w2, HA);
    stage_f16<FRD_HIDDEN, D_IN, WB_RP_THREADS, false>(w1b, w1s, inv_t1, w1, FRD_HIDDEN);
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
            unsigned big[WR_KG / 16][4], small[WR_KG / 16][4];
            float sc[2];
            {
                // G's fragments as split_rows_f16 takes them (row r0 + 8h: columns 16s + 2t,
                // + 1, + 8, + 9), each column divided by its w2 row's scale; columns past HA zero
                float4 raw[WR_KG / 16][2];
#pragma unroll
                for (int s = 0; s < WR_KG / 16; ++s)
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        const int r = 16 * warp + g + 8 * h, c = 16 * s + 2 * t;
                        const auto at = [&](int k) {  // a load, then a select (C7520)
                            const float v = buf[r * HA + min(k, HA - 1)] * inv_t2[k];
                            return k < HA ? v : 0.f;
                        };
                        raw[s][h] = make_float4(at(c), at(c + 1), at(c + 8), at(c + 9));
                    }
                wg_barrier(wg);  // every thread has read the tile: the buffer takes the next
                load(tile + stride);
                split_rows_f16<WR_KG>(raw, big, small, sc);
            }
            products_t<WR_KG, WR_KG / 16>(d, big, small, w2b, w2s);
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

// grad_w1's weight gradient over dpre, which frdhead_f16_rows has masked: scratch row j =
// [dpre^T h_t | sum_b dpre] over block j's rows, without frdhead_wg_grad_w1's mask tiles (a
// third less to read, and room for a deeper ring or a second block an SM)
extern "C" __global__ void __launch_bounds__(WB_GRAD_THREADS, OCC)
frdhead_wg_grad_w1_dpre(const float* __restrict__ dpre, const float* __restrict__ h_t,
                        float* __restrict__ scratch, const int B, const int rows_per_block)
{
    wb_weight_grad<FRD_HIDDEN, false>(dpre, nullptr, h_t, scratch, B, rows_per_block);
}
