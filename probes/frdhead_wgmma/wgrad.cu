// Issue 32 probe, the backward's shape: a weight gradient g[m][n] = sum_b a[b][m] x[b][n]
// (grad_w1 = dhidden^T h_t: a [B, M], x [B, N]) on wgmma in 3xTF32, the sum over the batch
// split across blocks with no atomics: block j writes its rows' sum to part[j], and wg_reduce
// adds the parts in block order.
// - 2 warpgroups a block: warpgroup w owns output rows [64w, 64w + 64), both read one x tile.
// - BK batch rows a step: cp.async brings the raw a and x tiles (padded rows) one step ahead.
// - The product's K is the batch: B (x) must be K-major in shared memory, so every step the
//   block transposes its x tile into wgmma's core-matrix layout, split into big and small
//   halves (each warp's writes and reads hit 32 distinct banks: lane L takes n % 8 = L / 4 and
//   k % 4 = L % 4).
// - A (a^T) comes from registers: a thread's fragment is a[b = 8s + t (+4)][m = g (+8)], read
//   from the raw tile (rows padded by 8 floats: conflict-free) and split in registers.
// Template constants: M = N = 128, BK (multiple of 8).
#define NT 256
#define RAW (128 + 8)  // padded raw row
static_assert(M == 128 && N == 128, "two m64 warpgroups by one n128 accumulator");
static_assert(BK % 8 == 0, "BK in k-steps of 8");

#include "wgmma_common.cuh"

// rows [b0, b0 + BK) of a [B, 128] array into a padded raw tile (rows past `end` read as 0)
__device__ __forceinline__ void load_raw(float* raw, const float* __restrict__ src, int b0,
                                         int end) {
    for (int e = threadIdx.x; e < BK * 32; e += NT) {
        const int r = e / 32, c = 4 * (e % 32);
        const bool in = b0 + r < end;
        const float* from = in ? src + (size_t)(b0 + r) * 128 + c : src;
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                     :: "r"((unsigned)__cvta_generic_to_shared(raw + r * RAW + c)), "l"(from),
                        "r"(in ? 16 : 0) : "memory");
    }
}

extern "C" __global__ void __launch_bounds__(NT, 2)
wg_wgrad(const float* __restrict__ a, const float* __restrict__ x, float* __restrict__ part,
         const int B, const int rows_per_block)
{
    extern __shared__ __align__(128) float sm[];
    float* xb = sm;                 // x tile big, [N x BK] core-matrix layout (K = batch)
    float* xs = xb + N * BK;        // x tile small
    float* raw = xs + N * BK;       // 2 stages of (a tile, x tile), padded rows
    const int wg = threadIdx.x / 128, warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
    const int g = lane / 4, t = lane % 4;
    const int begin = blockIdx.x * rows_per_block;
    const int end = min(B, begin + rows_per_block);
    float d[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) d[i] = 0.f;
    if (begin < end) {
        load_raw(raw, a, begin, end);
        load_raw(raw + BK * RAW, x, begin, end);
        asm volatile("cp.async.commit_group;\n" ::: "memory");
    }
    for (int b0 = begin, stage = 0; b0 < end; b0 += BK, stage ^= 1) {
        float* ra = raw + stage * 2 * BK * RAW;
        float* rx = ra + BK * RAW;
        asm volatile("cp.async.wait_all;\n" ::: "memory");
        __syncthreads();  // this step's tiles are in; last step's products are done with xb, xs
        if (b0 + BK < end) {
            float* next = raw + (stage ^ 1) * 2 * BK * RAW;
            load_raw(next, a, b0 + BK, end);
            load_raw(next + BK * RAW, x, b0 + BK, end);
            asm volatile("cp.async.commit_group;\n" ::: "memory");
        }
        // x tile transposed and split: lane L takes n = 8j + L / 4, k = 4i + L % 4
        for (int e = threadIdx.x; e < N * BK; e += NT) {
            const int w = e / 32, L = e % 32;  // w: which 8 n x 4 k block
            const int n = 8 * (w % (N / 8)) + L / 4, k = 4 * (w / (N / 8)) + L % 4;
            unsigned big, small;
            split(rx[k * RAW + n], big, small);
            xb[core_offset(n, k, N)] = __uint_as_float(big);
            xs[core_offset(n, k, N)] = __uint_as_float(small);
        }
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        __syncthreads();
        unsigned big[BK / 8][4], small[BK / 8][4];
        const int m = 64 * wg + 16 * warp + g;
#pragma unroll
        for (int s = 0; s < BK / 8; ++s) {
            split(ra[(8 * s + t) * RAW + m], big[s][0], small[s][0]);
            split(ra[(8 * s + t) * RAW + m + 8], big[s][1], small[s][1]);
            split(ra[(8 * s + t + 4) * RAW + m], big[s][2], small[s][2]);
            split(ra[(8 * s + t + 4) * RAW + m + 8], big[s][3], small[s][3]);
        }
        asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
        for (int s = 0; s < BK / 8; ++s) {
            const int kb = 2 * s * (N / 8) * 32;
            wgmma_rs(d, small[s], wg_desc(xb + kb, N * 16, 128));
            wgmma_rs(d, big[s], wg_desc(xs + kb, N * 16, 128));
            wgmma_rs(d, big[s], wg_desc(xb + kb, N * 16, 128));
        }
        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
        asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    }
    float* out = part + (size_t)blockIdx.x * M * N;
#pragma unroll
    for (int j = 0; j < N / 8; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            float2 v;
            v.x = d[4 * j + 2 * h];
            v.y = d[4 * j + 2 * h + 1];
            *reinterpret_cast<float2*>(out + (64 * wg + 16 * warp + g + 8 * h) * N + 8 * j + 2 * t) = v;
        }
}

// g[i] = sum over the parts in block order (one thread an element: a fixed order)
extern "C" __global__ void wg_reduce(const float* __restrict__ part, float* __restrict__ g,
                                     const int parts)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= M * N) return;
    float s = 0.f;
    for (int j = 0; j < parts; ++j) s += part[(size_t)j * M * N + i];
    g[i] = s;
}
