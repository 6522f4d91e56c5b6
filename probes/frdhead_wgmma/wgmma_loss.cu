// Issue 32 probe, fifth step: the FRD head's second layer fused with the loss on wgmma.
// logits = hidden w2^T + b2 ([M, HA], HA = NH * NA = 105 padded to 112 columns), then per
// (row, horizon) the softmax over NA atoms, grad_logits = (p - onehot) * inv_b and
// ce = -log(max(p[label], 1e-30)) (label -1: zero row and loss; outside [-1, NA): NaN), either
// straight from the accumulator fragment (EPI 1: a row's 112 columns sit in the 4 lanes of a
// quad, so a horizon's max and sum are butterflies over the quad) or from the logits rows the
// warp stages for their stores anyway (EPI 2: one lane a row and horizon). Step 5 measured EPI 1
// at 69.8 us for B = 65536, plain TF32 at 63: the predicated walk, not the products, set it.
// Why a kernel of its own and not the first layer's: w1's and w2's split halves take 128 + 112 KB
// of shared memory, more than a block has (227 KB); hidden goes to memory for the backward
// anyway, so the second layer reads it back (32 MB at B = 65536, about 8 us).
// Logits and gradient rows leave through a per-warp staging area of 8 rows, stored coalesced
// (a row is 105 floats, so a fragment's float2 is not aligned in global memory).
// Template constants: NH, NA, WG (warpgroups a block), CS, SWZ, PASSES (see wgmma_tile.cuh),
// EPI (the loss from the fragment: 1, or from the staged rows: 2), LOSS (0: logits only).
#ifndef PASSES
#define PASSES 3
#endif
#ifndef CS
#define CS 4
#endif
#ifndef SWZ
#define SWZ 1
#endif
#ifndef EPI
#define EPI 2
#endif
#ifndef LOSS
#define LOSS 1
#endif
#define K 128  // FRD_HIDDEN
#define BM 64
#define HA (NH * NA)
#define N2 112
#define NT (128 * WG)
static_assert(HA <= N2 && HA > N2 - 8, "the m64n112 accumulator holds 105..112 logits");

#include "wgmma_tile.cuh"

__device__ __forceinline__ float quad_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
    return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}

__device__ __forceinline__ float quad_sum(float v) {
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// rows [r0, r0 + 8) of out [M, HA] from the warp's staging area (8 x HA, contiguous)
__device__ __forceinline__ void store_rows(float* __restrict__ out, const float* stage, int r0,
                                           int M, int lane) {
    __syncwarp();
    const int n = min(8, M - r0) * HA;
    for (int i = lane; i < n; i += 32) out[(size_t)r0 * HA + i] = stage[i];
    __syncwarp();
}

// EPI 1: a horizon's max, sum and p[label] from the fragment, butterflies over the quad. Every
// lane walks all its 28 columns once per horizon under a run-time predicate (the horizon of a
// column depends on t): about 3 x 5 x 28 predicated steps a row.
__device__ __forceinline__ void fragment_loss(float (&z)[N2 / 4], float* stage,
                                              const int* __restrict__ labels,
                                              float* __restrict__ ce, int r, int M, int g, int t,
                                              float inv_b) {
#pragma unroll
    for (int hz = 0; hz < NH; ++hz) {
        float mx = -INFINITY, sum = 0.f, p_label = 0.f;
#pragma unroll
        for (int i = 0; i < N2 / 4; ++i) {
            const int c = 8 * (i / 2) + 2 * t + i % 2;
            if (c >= hz * NA && c < hz * NA + NA) mx = fmaxf(mx, z[i]);
        }
        mx = quad_max(mx);
#pragma unroll
        for (int i = 0; i < N2 / 4; ++i) {
            const int c = 8 * (i / 2) + 2 * t + i % 2;
            if (c >= hz * NA && c < hz * NA + NA) {
                z[i] = expf(z[i] - mx);  // each column is one horizon's: z is free
                sum += z[i];
            }
        }
        const float inv_sum = 1.f / quad_sum(sum);
        const int label = r < M ? labels[(size_t)r * NH + hz] : -1;
        const bool bad = label < -1 || label >= NA;
#pragma unroll
        for (int i = 0; i < N2 / 4; ++i) {
            const int c = 8 * (i / 2) + 2 * t + i % 2, a = c - hz * NA;
            if (a >= 0 && a < NA) {
                const float p = z[i] * inv_sum;
                if (a == label) p_label = p;
                stage[g * HA + c] = label == -1 ? 0.f : bad ? NAN
                                  : (p - (a == label ? 1.f : 0.f)) * inv_b;
            }
        }
        p_label = quad_sum(p_label);  // one lane holds it, the others add zeros
        if (t == 0 && r < M)
            ce[(size_t)r * NH + hz] = label == -1 ? 0.f : bad ? NAN
                                    : -logf(fmaxf(p_label, 1e-30f));
    }
}

// EPI 2: from the warp's 8 staged logits rows, one lane a (row, horizon) pair p = row * NH + hz,
// whose atoms sit at stage[NA * p ..]: lanes read addresses NA apart (NA odd: 32 banks), labels
// and ce are contiguous in p, and no step is predicated away. The gradient replaces the logits.
__device__ __forceinline__ void staged_loss(float* stage, const int* __restrict__ labels,
                                            float* __restrict__ ce, int r0, int M, int lane,
                                            float inv_b) {
    __syncwarp();
    for (int p = lane; p < 8 * NH; p += 32) {
        float* z = stage + NA * p;
        const bool in = r0 + p / NH < M;
        const int label = in ? labels[(size_t)r0 * NH + p] : -1;
        const bool bad = label < -1 || label >= NA;
        float mx = z[0];
#pragma unroll
        for (int a = 1; a < NA; ++a) mx = fmaxf(mx, z[a]);
        float sum = 0.f;
#pragma unroll
        for (int a = 0; a < NA; ++a) {
            z[a] = expf(z[a] - mx);
            sum += z[a];
        }
        const float inv_sum = 1.f / sum;
        const float p_label = label >= 0 && !bad ? z[label] * inv_sum : 0.f;
#pragma unroll
        for (int a = 0; a < NA; ++a)
            z[a] = label == -1 ? 0.f : bad ? NAN : (z[a] * inv_sum - (a == label ? 1.f : 0.f)) * inv_b;
        if (in)
            ce[(size_t)r0 * NH + p] = label == -1 ? 0.f : bad ? NAN : -logf(fmaxf(p_label, 1e-30f));
    }
}

extern "C" __global__ void __launch_bounds__(NT, 1)
wg_layer2_loss(const float* __restrict__ hidden, const float* __restrict__ w2,
               const float* __restrict__ b2, const int* __restrict__ labels,
               float* __restrict__ logits, float* __restrict__ grad_logits,
               float* __restrict__ ce, const int M, const float inv_b)
{
    extern __shared__ __align__(128) float sm[];
    float* wb = sm;            // w2 big   [N2 x K], core-matrix layout, k permuted
    float* ws = wb + N2 * K;   // w2 small
    const int wg = threadIdx.x / 128, tid = threadIdx.x % 128;
    const int warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
    float* buf = ws + N2 * K + wg * (BM * XROW + 4 * 8 * HA);  // this warpgroup's hidden tile
    float* stage = buf + BM * XROW + warp * 8 * HA;            // and its warps' staging
    const int tiles = (M + BM - 1) / BM, stride = gridDim.x * WG;
    int tile = blockIdx.x * WG + wg;
    if (tile < tiles) load_tile(buf, hidden, tile * BM, M, tid);
    stage_split<N2, 2, NT>(wb, ws, w2, HA);
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
    for (; tile < tiles; tile += stride) {
        asm volatile("cp.async.wait_all;\n" ::: "memory");
        wg_barrier(wg);
        float d[N2 / 2];
#pragma unroll
        for (int i = 0; i < N2 / 2; ++i) d[i] = 0.f;
        tile_products(d, buf, wb, ws, warp, g, t, [&] {
            wg_barrier(wg);  // every thread has read the tile: the buffer takes the next
            if (tile + stride < tiles) load_tile(buf, hidden, (tile + stride) * BM, M, tid);
        });
        const int r8 = tile * BM + 16 * warp;  // the warp's first row
#pragma unroll
        for (int h = 0; h < 2; ++h) {  // rows g (h 0) and g + 8 (h 1) of the warp's 16
            const int r = r8 + 8 * h + g;
            float z[N2 / 4];  // this lane's columns 8j + 2t + e, as z[2j + e]
#pragma unroll
            for (int j = 0; j < N2 / 8; ++j)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const int c = 8 * j + 2 * t + e;
                    z[2 * j + e] = c < HA ? d[4 * j + 2 * h + e] + __ldg(b2 + c) : 0.f;
                    if (c < HA) stage[g * HA + c] = z[2 * j + e];
                }
            store_rows(logits, stage, r8 + 8 * h, M, lane);
#if LOSS
#if EPI == 1
            fragment_loss(z, stage, labels, ce, r, M, g, t, inv_b);
#else
            staged_loss(stage, labels, ce, r8 + 8 * h, M, lane, inv_b);
#endif
            store_rows(grad_logits, stage, r8 + 8 * h, M, lane);
#endif
        }
    }
}
