// The probes' names for the library's 3xTF32 tile product (cu/tf32_mma.cuh), shared by
// probes/frdhead_mma and probes/pool_wide: their kernels pass the strides as template constants.
// (TF32_RN, both operand halves rounded to tf32, and warp_mma_split, each product in
// accumulators of its own, were measured here and dropped: probes/pool_wide/NOTES.md.)
#pragma once
#include "../cu/tf32_mma.cuh"

__device__ __forceinline__ void split(float x, unsigned& big, unsigned& small) {
    tf32_split(x, big, small);
}

__device__ __forceinline__ void mma_tf32(float (&c)[4], const unsigned (&a)[4],
                                         const unsigned (&b)[2]) {
    tf32_mma(c, a, b);
}

// Operand elements (i, k) and (i, k+1); i is A's row or B's column. KM: k runs down the array.
template <bool KM, int LD>
__device__ __forceinline__ float2 ld_pair(const float* s, int i, int k) {
    return tf32_pair<KM>(s, LD, i, k);
}

// acc[i][j] (m16 x n8 tile at warp rows 16i, columns 8j) += sum_k A(m,k) B(k,n), k < 8*KS.
template <int MT, int NT, int KS, bool KA, int LDA, bool KB, int LDB>
__device__ __forceinline__ void warp_mma(float (&acc)[MT][NT][4], const float* a, const float* b) {
    tf32_gemm<MT, NT, KS, KA, KB>(acc, a, LDA, b, LDB);
}

template <int MT, int NT>
__device__ __forceinline__ void zero_acc(float (&acc)[MT][NT][4]) {
    tf32_zero(acc);
}

// f(m, n, v) per accumulator; m, n relative to the warp's first row and column.
template <int MT, int NT, class F>
__device__ __forceinline__ void each_acc(float (&acc)[MT][NT][4], F f) {
    tf32_each(acc, f);
}
