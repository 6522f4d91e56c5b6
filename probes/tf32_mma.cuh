// 3xTF32 tensor-core pieces the probes' kernels share (probes/frdhead_mma, probes/pool_wide):
// operand split, mma.sync m16n8k8, a warp's tile product and its accumulators. Products keep
// float32 accuracy as a*b ~ a_small*b_big + a_big*b_small + a_big*b_big.
#pragma once

#ifndef TF32_RN
#define TF32_RN 0
#endif
// TF32_RN 0: big = x with its low 13 mantissa bits cleared (exactly a tf32 value); small =
// x - big is exact, and the mma drops its low 13 bits (about 2^-20 of x lost a product).
// TF32_RN 1: big and small both rounded to the nearest tf32 (cvt.rna), about 2^-22.
__device__ __forceinline__ void split(float x, unsigned& big, unsigned& small) {
#if TF32_RN
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(big) : "f"(x));
    const float rest = x - __uint_as_float(big);
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(small) : "f"(rest));
#else
    big = __float_as_uint(x) & 0xffffe000u;
    small = __float_as_uint(x - __uint_as_float(big));
#endif
}

__device__ __forceinline__ void mma_tf32(float (&c)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Operand elements (i, k) and (i, k+1); i is A's row or B's column. KM: k runs down the array.
template <bool KM, int LD>
__device__ __forceinline__ float2 ld_pair(const float* s, int i, int k) {
    if (KM) return make_float2(s[k * LD + i], s[(k + 1) * LD + i]);
    return *reinterpret_cast<const float2*>(s + i * LD + k);
}

// acc[i][j] (m16 x n8 tile at warp rows 16i, columns 8j) += sum_k A(m,k) B(k,n), k < 8*KS.
// Within a k-step the mma's k slot t + 4e holds column 2t + e for A and B alike (a fixed
// permutation of the step's sum), so each lane loads 8-byte pairs.
template <int MT, int NT, int KS, bool KA, int LDA, bool KB, int LDB>
__device__ __forceinline__ void warp_mma(float (&acc)[MT][NT][4], const float* a, const float* b) {
    const int g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
#pragma unroll 2
    for (int k0 = 0; k0 < 8 * KS; k0 += 8) {
        unsigned ab[MT][4], as[MT][4], bb[NT][2], bs[NT][2];
#pragma unroll
        for (int i = 0; i < MT; ++i)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const float2 v = ld_pair<KA, LDA>(a, 16 * i + g + 8 * h, k0 + 2 * t);
                split(v.x, ab[i][h], as[i][h]);
                split(v.y, ab[i][h + 2], as[i][h + 2]);
            }
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            const float2 v = ld_pair<KB, LDB>(b, 8 * j + g, k0 + 2 * t);
            split(v.x, bb[j][0], bs[j][0]);
            split(v.y, bb[j][1], bs[j][1]);
        }
        // small terms first, big*big last; the three passes keep back-to-back mmas independent
#pragma unroll
        for (int i = 0; i < MT; ++i)
#pragma unroll
            for (int j = 0; j < NT; ++j) mma_tf32(acc[i][j], as[i], bb[j]);
#pragma unroll
        for (int i = 0; i < MT; ++i)
#pragma unroll
            for (int j = 0; j < NT; ++j) mma_tf32(acc[i][j], ab[i], bs[j]);
#pragma unroll
        for (int i = 0; i < MT; ++i)
#pragma unroll
            for (int j = 0; j < NT; ++j) mma_tf32(acc[i][j], ab[i], bb[j]);
    }
}

template <int MT, int NT>
__device__ __forceinline__ void zero_acc(float (&acc)[MT][NT][4]) {
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;
}

// f(m, n, v) per accumulator; m, n relative to the warp's first row and column.
template <int MT, int NT, class F>
__device__ __forceinline__ void each_acc(float (&acc)[MT][NT][4], F f) {
    const int g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) f(16 * i + g + 8 * (e / 2), 8 * j + 2 * t + e % 2, acc[i][j][e]);
}

// warp_mma with each of the three products in accumulators of its own, added to acc at the end
// (acc += big*big + (small*big + big*small)): a k-step's mmas wait only on the step before, not
// on each other, so a warp with few tiles is held less by the mma's latency.
template <int MT, int NT, int KS, bool KA, int LDA, bool KB, int LDB>
__device__ __forceinline__ void warp_mma_split(float (&acc)[MT][NT][4], const float* a,
                                               const float* b) {
    const int g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
    float sb[MT][NT][4], bs[MT][NT][4], bb[MT][NT][4];
    zero_acc(sb);
    zero_acc(bs);
    zero_acc(bb);
#pragma unroll 2
    for (int k0 = 0; k0 < 8 * KS; k0 += 8) {
        unsigned ah[MT][4], al[MT][4], bh[NT][2], bl[NT][2];
#pragma unroll
        for (int i = 0; i < MT; ++i)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const float2 v = ld_pair<KA, LDA>(a, 16 * i + g + 8 * h, k0 + 2 * t);
                split(v.x, ah[i][h], al[i][h]);
                split(v.y, ah[i][h + 2], al[i][h + 2]);
            }
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            const float2 v = ld_pair<KB, LDB>(b, 8 * j + g, k0 + 2 * t);
            split(v.x, bh[j][0], bl[j][0]);
            split(v.y, bh[j][1], bl[j][1]);
        }
#pragma unroll
        for (int i = 0; i < MT; ++i)
#pragma unroll
            for (int j = 0; j < NT; ++j) {
                mma_tf32(sb[i][j], al[i], bh[j]);
                mma_tf32(bs[i][j], ah[i], bl[j]);
                mma_tf32(bb[i][j], ah[i], bh[j]);
            }
    }
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] += bb[i][j][e] + (sb[i][j][e] + bs[i][j][e]);
}
