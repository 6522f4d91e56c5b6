// Issue 32 probe: the FRD head's first layer, hidden = ReLU(x w^T + b) for x [M, K] and w [N, K],
// on wgmma with FP16 pieces at the 16-bit tensor rate (twice TF32's). precision.py's "fp16x2_one"
// scheme: each operand scaled by a power of two (x a row, w a row of w: an output column) so that
// its largest element is in [2^14, 2^15); big = fp16(x s), small = fp16(x s - big) (may be
// subnormal); small.big + big.small + big.big into one float32 accumulator, then divided by both
// scales. Three k16 products a 16-wide k step: half the tensor time of 3xTF32's three k8 products
// a k8 step. Outside the library; run.py compiles it with -D options and checks it against
// float64 with the library's rule.
//
// A block of WG warpgroups stages w's two pieces once (FP16, 64 KB) in wgmma's no-swizzle K-major
// layout (core matrices of 8 rows by 16 bytes: 8 halves of k), then each warpgroup walks 64-row
// tiles, grid-strided. A comes from registers: a warp's 16 rows, each thread a float4 of a row
// per k16 step straight from global memory (a quad reads 64 contiguous bytes). The float4 at
// physical columns 16s + 4t .. + 3 holds logical columns 2t, 2t + 1, 2t + 8, 2t + 9 of step s
// (the f16 A fragment's), and w is staged under the same permutation, so the sum over k is the
// same sum. PASSES 1 (big.big only) checks the layouts at the plain FP16 bound.
// Template constants: N (= 128), K (a multiple of 16), WG.
#ifndef PASSES
#define PASSES 3
#endif
#define BM 64
#define NT (128 * WG)
static_assert(N == 128, "the accumulator fragment below is m64n128");
static_assert(K % 128 == 0, "K in steps of 16; w staged 128 floats a warp at a time");

#include <cuda_fp16.h>
#include "wgmma.cuh"

// half offset of element (r, k) of an R-row FP16 operand, no-swizzle K-major: core matrices of
// 8 rows by 8 halves (128 contiguous bytes), k groups R * 16 bytes apart
__device__ __forceinline__ int core_offset_h(int r, int k, int rows) {
    return ((k >> 3) * (rows >> 3) + (r >> 3)) * 64 + (r & 7) * 8 + (k & 7);
}

// the logical k (within its 16-wide step) of physical column p % 16 = 4t + j
__device__ __forceinline__ int logical_k(int p) {
    const int t = (p & 15) >> 2, j = p & 3;
    return (p & ~15) + 2 * t + (j & 1) + 8 * (j >> 1);
}

// 2^e with max * 2^e in [2^14, 2^15) (1 for max == 0; clamped for a max below 2^-113)
__device__ __forceinline__ float pow2_scale(float max) {
    const int e = (__float_as_int(max) >> 23) & 0xff;
    return max > 0.f ? __int_as_float(min(268 - e, 254) << 23) : 1.f;
}

// big and small FP16 pieces of a (already scaled) pair, packed for the A fragment
__device__ __forceinline__ void split_pair(float lo, float hi, unsigned& big, unsigned& small) {
    const __half2 b = __floats2half2_rn(lo, hi);
    const float2 bf = __half22float2(b);
    const __half2 s = __floats2half2_rn(lo - bf.x, hi - bf.y);
    big = *reinterpret_cast<const unsigned*>(&b);
    small = *reinterpret_cast<const unsigned*>(&s);
}

// d (m64n128, f32) += A (64 x 16, registers) . B (descriptor db)^T, FP16 operands
__device__ __forceinline__ void wgmma_f16(float (&d)[64], const unsigned (&a)[4],
                                          unsigned long long db) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {" WG_REGS_56
                 ", %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, "
                 "0;\n}\n"
                 : WG_ACC_56, "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]),
                   "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}

extern "C" __global__ void __launch_bounds__(NT, 1)
wg_layer_f16(const float* __restrict__ x, const float* __restrict__ w,
             const float* __restrict__ bias, float* __restrict__ y, const int M)
{
    extern __shared__ __align__(128) unsigned char smem[];
    __half* wb = reinterpret_cast<__half*>(smem);  // w big   [N x K], core layout
    __half* ws = wb + N * K;                       // w small
    float* inv_t = reinterpret_cast<float*>(ws + N * K);  // 1 / column scale, [N]
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    // w: a warp a row at a time, a lane 4 consecutive floats of it at a time
    for (int n = warp; n < N; n += NT / 32) {
        float4 v[K / 128];
        float top = 0.f;
#pragma unroll
        for (int i = 0; i < K / 128; ++i) {
            v[i] = __ldg(reinterpret_cast<const float4*>(w + (size_t)n * K) + 32 * i + lane);
            top = fmaxf(top, fmaxf(fmaxf(fabsf(v[i].x), fabsf(v[i].y)),
                                   fmaxf(fabsf(v[i].z), fabsf(v[i].w))));
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) top = fmaxf(top, __shfl_xor_sync(0xffffffffu, top, o));
        const float t = pow2_scale(top);
        if (lane == 0) inv_t[n] = 1.f / t;
#pragma unroll
        for (int i = 0; i < K / 128; ++i) {
            const float vs[4] = {v[i].x, v[i].y, v[i].z, v[i].w};
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const int k = logical_k(128 * i + 4 * lane + j);
                const float s = vs[j] * t;
                const __half big = __float2half_rn(s);
                wb[core_offset_h(n, k, N)] = big;
                ws[core_offset_h(n, k, N)] = __float2half_rn(s - __half2float(big));
            }
        }
    }
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // seen by wgmma's reads
    __syncthreads();
    const int wg = threadIdx.x / 128, g = lane / 4, t = lane % 4, w4 = warp % 4;
    const int tiles = (M + BM - 1) / BM, stride = gridDim.x * WG;
    for (int tile = blockIdx.x * WG + wg; tile < tiles; tile += stride) {
        const int r0 = tile * BM + 16 * w4 + g;  // the thread's rows r0 and r0 + 8
        float4 raw[K / 16][2];
        float top[2] = {0.f, 0.f};
#pragma unroll
        for (int s = 0; s < K / 16; ++s)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                raw[s][h] = r0 + 8 * h < M
                    ? __ldg(reinterpret_cast<const float4*>(x + (size_t)(r0 + 8 * h) * K
                                                            + 16 * s + 4 * t))
                    : make_float4(0.f, 0.f, 0.f, 0.f);
                top[h] = fmaxf(top[h], fmaxf(fmaxf(fabsf(raw[s][h].x), fabsf(raw[s][h].y)),
                                             fmaxf(fabsf(raw[s][h].z), fabsf(raw[s][h].w))));
            }
        float sc[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {  // the row's max over the quad's four threads
            top[h] = fmaxf(top[h], __shfl_xor_sync(0xffffffffu, top[h], 1));
            top[h] = fmaxf(top[h], __shfl_xor_sync(0xffffffffu, top[h], 2));
            sc[h] = pow2_scale(top[h]);
        }
        // every step's pieces before the first product: an in-flight wgmma reads its A
        // registers, so none is rewritten until the wait
        unsigned big[K / 16][4], small[K / 16][4];  // a0 (g, 2t..), a1 (g + 8, 2t..), a2 (g,
#pragma unroll                                      // 2t + 8..), a3 (g + 8, 2t + 8..)
        for (int s = 0; s < K / 16; ++s) {
            const float4 u = raw[s][0], v = raw[s][1];
            split_pair(u.x * sc[0], u.y * sc[0], big[s][0], small[s][0]);
            split_pair(v.x * sc[1], v.y * sc[1], big[s][1], small[s][1]);
            split_pair(u.z * sc[0], u.w * sc[0], big[s][2], small[s][2]);
            split_pair(v.z * sc[1], v.w * sc[1], big[s][3], small[s][3]);
        }
        float d[64];
#pragma unroll
        for (int i = 0; i < 64; ++i) d[i] = 0.f;
        asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
        for (int s = 0; s < K / 16; ++s) {
            const int kb = 2 * s * (N / 8) * 64;  // halves to this step's first core matrix
#if PASSES == 3
            wgmma_f16(d, small[s], wg_desc(reinterpret_cast<const float*>(wb + kb), N * 16, 128));
            wgmma_f16(d, big[s], wg_desc(reinterpret_cast<const float*>(ws + kb), N * 16, 128));
#endif
            wgmma_f16(d, big[s], wg_desc(reinterpret_cast<const float*>(wb + kb), N * 16, 128));
        }
        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
        asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
        // d[4j + 2h + e]: row r0 + 8h, column 8j + 2t + e
#pragma unroll
        for (int j = 0; j < N / 8; ++j)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int r = r0 + 8 * h, c = 8 * j + 2 * t;
                if (r < M) {
                    const float inv_s = 1.f / sc[h];
                    float2 o;
                    o.x = fmaxf(d[4 * j + 2 * h] * inv_s * inv_t[c] + bias[c], 0.f);
                    o.y = fmaxf(d[4 * j + 2 * h + 1] * inv_s * inv_t[c + 1] + bias[c + 1], 0.f);
                    *reinterpret_cast<float2*>(y + (size_t)r * N + c) = o;
                }
            }
    }
}
