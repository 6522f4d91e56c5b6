// FRD head forward in one launch on Hopper's warpgroup MMA with FP16 pieces (wgmma_f16.cuh), the
// forward roles' engine WGMMA = 2, for the model's head shape (frdhead_wgmma.cuh's restriction):
//   frdhead_f16_forward       hidden = ReLU(h_t w1^T + b1), logits = hidden w2^T + b2
//   frdhead_f16_forward_loss  the same, then softmax_ce_row on each (row, horizon)
// In FP16 both weights' pieces fit one block (w1 64 KB, w2 56 KB), so the layers share a launch
// and hidden never comes back from memory: layer 1's m64n128 accumulator fragment is, column
// for column, layer 2's A fragment (acc_f16), scaled by a power of two a row and split in place.
// hidden is still stored once, for the backward.
// A block stages both weights once (each row of w1 and w2 scaled by its own power of two), then
// each of its WG warpgroups walks 64-row tiles, grid-strided, as frdhead_wgmma.cuh's do: the
// next tile of h_t by cp.async into the warpgroup's row buffer (WG_XOFF's layout, knob SWZ)
// while this one is multiplied. A tile is 24 m64n128k16 and 24 m64n112k16 products (three a
// 16-wide k step), issued at once and waited for, then its epilogue; the other warpgroup's
// products fill that time. The epilogues divide by both scales. Fixed sums: bitwise reruns.

// dynamic shared memory in floats: w1's and w2's pieces (halves), their rows' inverse scales,
// b1 and b2 (padded to WG_N2), then per warpgroup a row buffer and 4 warps' staged logits rows
#define WF_FLOATS (FRD_HIDDEN * WG_K + WG_N2 * WG_K + 2 * (FRD_HIDDEN + WG_N2) \
                   + WG * (WG_ROWS * WG_XROW + 4 * WG_STAGE))


template <bool LOSS>
__device__ __forceinline__ void wf_forward(const float* __restrict__ h_t,
                                           const float* __restrict__ w1,
                                           const float* __restrict__ b1,
                                           const float* __restrict__ w2,
                                           const float* __restrict__ b2,
                                           const int* __restrict__ labels,
                                           float* __restrict__ hidden, float* __restrict__ logits,
                                           float* __restrict__ grad_logits,
                                           float* __restrict__ ce, const int B, const float inv_b) {
    __half* w1b = reinterpret_cast<__half*>(dynamic_smem);
    __half* w1s = w1b + FRD_HIDDEN * WG_K;
    __half* w2b = w1s + FRD_HIDDEN * WG_K;
    __half* w2s = w2b + WG_N2 * WG_K;
    float* inv_t1 = reinterpret_cast<float*>(w2s + WG_N2 * WG_K);
    float* inv_t2 = inv_t1 + FRD_HIDDEN;
    float* b1s = inv_t2 + WG_N2;
    float* b2s = b1s + FRD_HIDDEN;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, wg = threadIdx.x / 128;
    const int tid = threadIdx.x % 128, w4 = warp % 4, g = lane / 4, t = lane % 4;
    float* buf = b2s + WG_N2 + wg * (WG_ROWS * WG_XROW + 4 * WG_STAGE);
    float* stage = buf + WG_ROWS * WG_XROW + w4 * WG_STAGE;
    const int tiles = (B + WG_ROWS - 1) / WG_ROWS, stride = gridDim.x * WG;
    int tile = blockIdx.x * WG + wg;
    if (tile < tiles) wg_load_tile(buf, h_t, tile * WG_ROWS, B, tid);
    stage_f16<FRD_HIDDEN, WG_K, WG_THREADS, true>(w1b, w1s, inv_t1, w1, FRD_HIDDEN);
    stage_f16<WG_N2, WG_K, WG_THREADS, false>(w2b, w2s, inv_t2, w2, HA);
    for (int c = threadIdx.x; c < FRD_HIDDEN + WG_N2; c += WG_THREADS)
        b1s[c] = c < FRD_HIDDEN ? b1[c] : c - FRD_HIDDEN < HA ? b2[c - FRD_HIDDEN] : 0.f;
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // seen by wgmma's reads
    __syncthreads();
    for (; tile < tiles; tile += stride) {
        const int r8 = tile * WG_ROWS + 16 * w4, r0 = r8 + g;  // the thread's rows r0, r0 + 8
        wait_copies<0>();
        wg_barrier(wg);
        float d[FRD_HIDDEN / 2];
        {
            unsigned big[WG_K / 16][4], small[WG_K / 16][4];
            float sc[2];
            {
                float4 raw[WG_K / 16][2];  // physical columns 16s + 4t .. + 3 of rows r0, r0 + 8
#pragma unroll
                for (int s = 0; s < WG_K / 16; ++s)
#pragma unroll
                    for (int h = 0; h < 2; ++h)
                        raw[s][h] = *reinterpret_cast<const float4*>(
                            buf + WG_XOFF(16 * w4 + g + 8 * h, 16 * s + 4 * t));
                wg_barrier(wg);  // every thread has read the tile: the buffer takes the next
                if (tile + stride < tiles)
                    wg_load_tile(buf, h_t, (tile + stride) * WG_ROWS, B, tid);
                split_rows_f16<WG_K>(raw, big, small, sc);
            }
            products_f16<FRD_HIDDEN, WG_K, 3>(d, big, small, w1b, w1s);
            // hidden = ReLU(d / (sc t1) + b1): kept in d for layer 2, stored for the backward
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int r = r0 + 8 * h;
                const float inv = 1.f / sc[h];
#pragma unroll
                for (int j = 0; j < FRD_HIDDEN / 8; ++j) {
                    const int c = 8 * j + 2 * t;
                    float2 v;
                    v.x = d[4 * j + 2 * h] =
                        fmaxf(d[4 * j + 2 * h] * inv * inv_t1[c] + b1s[c], 0.f);
                    v.y = d[4 * j + 2 * h + 1] =
                        fmaxf(d[4 * j + 2 * h + 1] * inv * inv_t1[c + 1] + b1s[c + 1], 0.f);
                    if (r < B) *reinterpret_cast<float2*>(hidden + (size_t)r * FRD_HIDDEN + c) = v;
                }
            }
        }
        float d2[WG_N2 / 2];
        float sh[2];
        {
            unsigned big[FRD_HIDDEN / 16][4], small[FRD_HIDDEN / 16][4];
            acc_f16(d, big, small, sh);
            products_f16<WG_N2, FRD_HIDDEN, 3>(d2, big, small, w2b, w2s);
        }
        // logits = d2 / (sh t2) + b2, a warp's 8 rows at a time through its staging area, as
        // frdhead_wgmma.cuh's wg_logits does
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int rh = r8 + 8 * h;
            const float inv = 1.f / sh[h];
#pragma unroll
            for (int j = 0; j < WG_N2 / 8; ++j)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const int c = 8 * j + 2 * t + e;
                    if (c < HA) stage[g * HA + c] = d2[4 * j + 2 * h + e] * inv * inv_t2[c] + b2s[c];
                }
            wg_store_rows(logits, stage, rh, B, lane);
            if (LOSS) {
                for (int p = lane; p < 8 * N_HORIZONS; p += 32) {
                    const bool in = rh + p / N_HORIZONS < B;
                    const float loss = softmax_ce_row(
                        stage + N_ATOMS * p, in ? labels[(size_t)rh * N_HORIZONS + p] : -1, inv_b);
                    if (in) ce[(size_t)rh * N_HORIZONS + p] = loss;
                }
                wg_store_rows(grad_logits, stage, rh, B, lane);
            }
        }
    }
}

extern "C" __global__ void __launch_bounds__(WG_THREADS, 1)
frdhead_f16_forward(const float* __restrict__ h_t, const float* __restrict__ w1,
                    const float* __restrict__ b1, const float* __restrict__ w2,
                    const float* __restrict__ b2, float* __restrict__ hidden,
                    float* __restrict__ logits, const int B)
{
    wf_forward<false>(h_t, w1, b1, w2, b2, nullptr, hidden, logits, nullptr, nullptr, B, 0.f);
}

extern "C" __global__ void __launch_bounds__(WG_THREADS, 1)
frdhead_f16_forward_loss(const float* __restrict__ h_t, const float* __restrict__ w1,
                         const float* __restrict__ b1, const float* __restrict__ w2,
                         const float* __restrict__ b2, const int* __restrict__ labels,
                         float* __restrict__ hidden, float* __restrict__ logits,
                         float* __restrict__ grad_logits, float* __restrict__ ce, const int B,
                         const float inv_b)
{
    wf_forward<true>(h_t, w1, b1, w2, b2, labels, hidden, logits, grad_logits, ce, B, inv_b);
}
