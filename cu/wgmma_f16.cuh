// Hopper's warpgroup MMA (wgmma, sm_90a) with FP16 operands and f32 accumulators, on float32
// values cut in two FP16 pieces: big = fp16(x s), small = fp16(x s - big), s a power of two that
// puts the largest |x| of a row in [2^14, 2^15), so no piece overflows (a value far below its
// row's largest keeps fewer bits: its small piece is subnormal, which the float64 checks bound).
// small.big + big.small + big.big into one f32 accumulator, then divided by both operands'
// scales: FP16's 11-bit significand is TF32's and it rounds where the TF32 cut truncates, so
// three products keep 3xTF32's accuracy at the 16-bit tensor rate (twice TF32's). Here: the
// K-major operand layout in halves, the scales, the pair split, a weight's staging, the A pieces
// from a row or from an accumulator fragment, and the register-A products (m64n128k16,
// m64n112k16; and m64n128k16 on a K-major operand read transposed). Include it after wgmma.cuh.
#include <cuda_fp16.h>

// half offset of element (r, k) of an R-row FP16 operand, no-swizzle K-major: core matrices of
// 8 rows by 8 halves (128 contiguous bytes), k groups R * 16 bytes apart
__device__ __forceinline__ int core_offset_h(int r, int k, int rows) {
    return ((k >> 3) * (rows >> 3) + (r >> 3)) * 64 + (r & 7) * 8 + (k & 7);
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

// d (m64n128 or m64n112, f32) += A (64 x 16, registers: a0 (g, 2t..2t + 1), a1 (g + 8, ..),
// a2 (g, 2t + 8..), a3 (g + 8, ..) of the warp's 16 rows, low half the lower k) . B (descriptor
// db, K-major)^T, FP16 operands
#define WG_F16_OPEN(n) "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n" \
    "wgmma.mma_async.sync.aligned.m64n" #n "k16.f32.f16.f16 {" WG_REGS_56
__device__ __forceinline__ void wgmma_f16(float (&d)[64], const unsigned (&a)[4],
                                          unsigned long long db) {
    asm volatile(WG_F16_OPEN(128) ", %56, %57, %58, %59, %60, %61, %62, %63}, "
                 "{%64, %65, %66, %67}, %68, p, 1, 1, 0;\n}\n"
                 : WG_ACC_56, "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]),
                   "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}
__device__ __forceinline__ void wgmma_f16(float (&d)[56], const unsigned (&a)[4],
                                          unsigned long long db) {
    asm volatile(WG_F16_OPEN(112) "}, {%56, %57, %58, %59}, %60, p, 1, 1, 0;\n}\n"
                 : WG_ACC_56 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}

// the operand at p (FP16, ROWS rows, K-major core matrices) as wgmma's descriptor
template <int ROWS>
__device__ __forceinline__ unsigned long long f16_desc(const __half* p) {
    return wg_desc(reinterpret_cast<const float*>(p), ROWS * 16, 128);
}

// the row's max over a quad (the four threads that hold its fragments)
__device__ __forceinline__ float quad_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
    return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}

// The float4 a thread reads at physical columns 16s + 4t .. + 3 holds logical columns 2t, 2t + 1,
// 2t + 8, 2t + 9 of k16 step s (the FP16 A fragment's a0 and a2 pairs); an operand staged for it
// takes logical pair (k, k + 1), k even, from physical columns physical_k(k), + 1.
__device__ __forceinline__ int physical_k(int k) {
    return (k & ~15) + 4 * ((k & 7) >> 1) + 2 * ((k >> 3) & 1);
}

// w [n_valid, KD] into its FP16 pieces wb, ws [ROWS x KD] (rows past n_valid zero), each row
// scaled by its own power of two (1 / scale into inv_t[n]), by the block's NTH threads. A warp
// takes 8-row groups: lane L row L / 4 and the logical pairs k = 8c + 2 (L % 4), so each of its
// half2 stores fills one core matrix (128 bytes, 32 banks), and the quad that holds a row
// finds its max with two shuffles. All of a warp's loads go out before the first split (one
// round trip to L2, not one a row). PERMUTE stages logical k from physical column physical_k(k)
// (an A operand read as float4s), else in place.
template <int ROWS, int KD, int NTH, bool PERMUTE>
__device__ __forceinline__ void stage_f16(__half* wb, __half* ws, float* inv_t,
                                          const float* __restrict__ w, int n_valid) {
    constexpr int GROUPS = ROWS / 8, WARPS = NTH / 32, PER = (GROUPS + WARPS - 1) / WARPS;
    static_assert(ROWS % 8 == 0 && KD % 16 == 0, "whole core matrices");
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, q = lane % 4;
    float2 v[PER][KD / 8];
#pragma unroll
    for (int i = 0; i < PER; ++i) {
        const int grp = warp + i * WARPS, n = 8 * grp + lane / 4;
#pragma unroll
        for (int c = 0; c < KD / 8; ++c) {
            const int k = 8 * c + 2 * q;
            v[i][c] = grp < GROUPS && n < n_valid
                ? __ldg(reinterpret_cast<const float2*>(w + (size_t)n * KD
                                                        + (PERMUTE ? physical_k(k) : k)))
                : make_float2(0.f, 0.f);
        }
    }
#pragma unroll
    for (int i = 0; i < PER; ++i) {
        const int grp = warp + i * WARPS, n = 8 * grp + lane / 4;
        if (grp >= GROUPS) break;  // the same for the whole warp
        float top = 0.f;
#pragma unroll
        for (int c = 0; c < KD / 8; ++c)
            top = fmaxf(top, fmaxf(fabsf(v[i][c].x), fabsf(v[i][c].y)));
        const float t = pow2_scale(quad_max(top));
        if (q == 0) inv_t[n] = 1.f / t;
#pragma unroll
        for (int c = 0; c < KD / 8; ++c) {
            unsigned big, small;
            split_pair(v[i][c].x * t, v[i][c].y * t, big, small);
            const int at = core_offset_h(n, 8 * c + 2 * q, ROWS);
            *reinterpret_cast<unsigned*>(wb + at) = big;
            *reinterpret_cast<unsigned*>(ws + at) = small;
        }
    }
}

// A's pieces (every k16 step's, before any product: an in-flight wgmma reads its A registers)
// of the thread's rows r0 and r0 + 8 from their float4s at physical columns 16s + 4t (physical_k's
// permutation): each row scaled by its power of two sc[h] (the quad's max)
template <int KD>
__device__ __forceinline__ void split_rows_f16(const float4 (&raw)[KD / 16][2],
                                               unsigned (&big)[KD / 16][4],
                                               unsigned (&small)[KD / 16][4], float (&sc)[2]) {
    float top[2] = {0.f, 0.f};
#pragma unroll
    for (int s = 0; s < KD / 16; ++s)
#pragma unroll
        for (int h = 0; h < 2; ++h)
            top[h] = fmaxf(top[h], fmaxf(fmaxf(fabsf(raw[s][h].x), fabsf(raw[s][h].y)),
                                         fmaxf(fabsf(raw[s][h].z), fabsf(raw[s][h].w))));
#pragma unroll
    for (int h = 0; h < 2; ++h) sc[h] = pow2_scale(quad_max(top[h]));
#pragma unroll
    for (int s = 0; s < KD / 16; ++s) {
        const float4 u = raw[s][0], v = raw[s][1];
        split_pair(u.x * sc[0], u.y * sc[0], big[s][0], small[s][0]);
        split_pair(v.x * sc[1], v.y * sc[1], big[s][1], small[s][1]);
        split_pair(u.z * sc[0], u.w * sc[0], big[s][2], small[s][2]);
        split_pair(v.z * sc[1], v.w * sc[1], big[s][3], small[s][3]);
    }
}

// The next layer's A pieces from an m64n128 accumulator fragment (d[4j + 2h + e]: row g + 8h,
// column 8j + 2t + e), columns in place (no permutation): k16 step s's a0 is d[8s .. 8s + 1],
// a1 d[8s + 2 ..], a2 d[8s + 4 ..], a3 d[8s + 6 ..]; each row scaled by its power of two sc[h]
__device__ __forceinline__ void acc_f16(const float (&d)[64], unsigned (&big)[8][4],
                                        unsigned (&small)[8][4], float (&sc)[2]) {
    float top[2] = {0.f, 0.f};
#pragma unroll
    for (int i = 0; i < 64; ++i) top[(i >> 1) & 1] = fmaxf(top[(i >> 1) & 1], fabsf(d[i]));
#pragma unroll
    for (int h = 0; h < 2; ++h) sc[h] = pow2_scale(quad_max(top[h]));
#pragma unroll
    for (int s = 0; s < 8; ++s)
#pragma unroll
        for (int q = 0; q < 4; ++q)  // a_q: row g + 8 (q & 1), columns + 8 (q >> 1)
            split_pair(d[8 * s + 2 * q] * sc[q & 1], d[8 * s + 2 * q + 1] * sc[q & 1], big[s][q],
                       small[s][q]);
}

// d = A . B^T over KD (KD / 16 k16 steps): A's pieces from registers, B's (ROWS rows, K-major) at
// wb, ws; small.big + big.small + big.big a step (NPASS 1: big.big alone), then waited for
template <int ROWS, int KD, int NPASS, int NACC>
__device__ __forceinline__ void products_f16(float (&d)[NACC], const unsigned (&big)[KD / 16][4],
                                             const unsigned (&small)[KD / 16][4],
                                             const __half* wb, const __half* ws) {
#pragma unroll
    for (int i = 0; i < NACC; ++i) d[i] = 0.f;
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
    for (int s = 0; s < KD / 16; ++s) {
        const int kb = 2 * s * (ROWS / 8) * 64;  // halves to this step's first core matrix
        if (NPASS == 3) {
            wgmma_f16(d, small[s], f16_desc<ROWS>(wb + kb));
            wgmma_f16(d, big[s], f16_desc<ROWS>(ws + kb));
        }
        wgmma_f16(d, big[s], f16_desc<ROWS>(wb + kb));
    }
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
}

// d (m64n128, f32) += A (registers) . B^T, B a K-major FP16 operand read transposed (wgmma's
// imm-trans-b: the operand's rows are this product's k, its k this product's n)
__device__ __forceinline__ void wgmma_f16_t(float (&d)[64], const unsigned (&a)[4],
                                            unsigned long long db) {
    asm volatile(WG_F16_OPEN(128) ", %56, %57, %58, %59, %60, %61, %62, %63}, "
                 "{%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
                 : WG_ACC_56, "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]),
                   "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}

// d = A . W over KS k16 steps, W's pieces [KROWS x 128] staged K-major (rows = this product's
// k) and read transposed: the descriptor's leading byte offset is the k step (one core
// matrix, 128 bytes), its stride the n step (KROWS * 16 bytes); three products a step, then
// waited for
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
