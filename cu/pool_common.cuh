// The pool's pieces shared by its layouts: the launch wait, the entry points' parameter lists,
// row loads, the warp-per-key loop and asynchronous copies.
#define LOG2E 1.4426950408889634f

// pdl_wait: the layouts and the joins start with it
#include "pdl.cuh"

#ifndef POOL_SPLIT  // the layouts' pieces; split-K's joins take only the wait
// Split-K (pool_split.cuh): with SPLIT_COUNT > 1 a layout's row b is split b % SPLIT_COUNT of
// batch row b / SPLIT_COUNT, and K is a split's keys. ln, grad_ln and the forward's ctx are the
// splits' own (a batch row's keys are contiguous in ln); attn and grad_attn are the batch rows'
// arrays, read and written in place at the split's keys, ATTN_STRIDE apart between horizons;
// the backward reads the batch row's grad_ctx and ctx. Two arrays ride behind others, so that
// every variant has the same parameters: the forward keeps each split's log-sum-exp behind the
// splits' ctx rows (SPLIT_LSE), and the backward takes its correction's sum_k attn*grad_attn
// over all the batch row's keys (pool_attn_dot's) from behind the blocks' rows of gq_scratch
// (SPLIT_ATTN_DOT).
#ifndef SPLIT_COUNT
#define SPLIT_COUNT 1
#endif
#if SPLIT_COUNT > 1
#define ATTN_STRIDE (SPLIT_COUNT * K)
#define ATTN_ROW(b) \
    ((size_t)((b) / SPLIT_COUNT) * N_HORIZONS * ATTN_STRIDE + (size_t)((b) % SPLIT_COUNT) * K)
#define ATTN_AT(e) ((size_t)((e) / K) * ATTN_STRIDE + (e) % K)  // e = h*K + k
#define ATTN_HROW(b, h) (ATTN_ROW(b) + (size_t)(h) * ATTN_STRIDE)
#define BATCH_ROW(b) ((b) / SPLIT_COUNT)
#define SPLIT_ATTN_DOT(b, h) \
    gq_scratch[((size_t)gridDim.x * HIDDEN_DIM + BATCH_ROW(b)) * N_HORIZONS + (h)]
// split b's log-sum-exp of horizon h's scores (natural units) as lse[batch row][h][split]
#define SPLIT_LSE(b, h)                                                                       \
    ctx[(size_t)B * N_HORIZONS * HIDDEN_DIM                                                   \
        + ((size_t)BATCH_ROW(b) * N_HORIZONS + (h)) * SPLIT_COUNT + (b) % SPLIT_COUNT]
#else  // the plain rows' very tokens: unsplit variants compile as they always have
#define ATTN_STRIDE K
#define ATTN_ROW(b) (size_t)b * N_HORIZONS * K
#define ATTN_AT(e) e
#define ATTN_HROW(b, h) ((size_t)b * N_HORIZONS + h) * K
#define BATCH_ROW(b) b
#endif

// The entry points' bounds in the layouts that read MIN_BLOCKS (2 and 4): 0 leaves registers to
// ptxas; an explicit minimum of 1 would let it take 255.
#if MIN_BLOCKS > 0
#define POOL_BOUNDS __launch_bounds__(BLOCK, MIN_BLOCKS)
#else
#define POOL_BOUNDS __launch_bounds__(BLOCK)
#endif

// The entry points' parameters, the same in every layout: the host launches them all alike.
#define POOL_FORWARD_PARAMS                                                                   \
    const float* __restrict__ q_h, const float* __restrict__ ln, float* __restrict__ ctx,     \
        float* __restrict__ attn, const int K, const float scale, const int B
#define POOL_BACKWARD_PARAMS                                                                  \
    const float* __restrict__ q_h, const float* __restrict__ ln, const float* __restrict__ attn, \
        const float* __restrict__ grad_ctx, const float* __restrict__ grad_attn,              \
        const float* __restrict__ ctx, float* __restrict__ grad_ln,                           \
        float* __restrict__ gq_scratch, float* __restrict__ ds_scratch, const int K,          \
        const float scale, const int B

// Rows k0 .. k0+UNROLL-1 of one batch row's ln (those below K), laid out over the warp by load_row.
__device__ __forceinline__ void load_keys(const float* __restrict__ lnb, const int k0, const int K,
                                          const int lane, float (*x)[ROW_PER_LANE])
{
#pragma unroll
    for (int u = 0; u < UNROLL; ++u)
        if (k0 + u < K) load_row(lnb + (size_t)(k0 + u) * HIDDEN_DIM, lane, x[u]);
}

// Warp per key (LAYOUT 0 and 1), while `on`: the statement after FOR_WARP_KEYS(on) runs for each
// of the warp's keys k0 + u below K (k0 = warp*UNROLL + i*NWARPS*UNROLL, u < UNROLL), x[u] its
// row of lnb, loaded UNROLL rows at a time; warp, lane, K and lnb are the kernel's. A macro: as a
// helper taking the body as a lambda, the kernels compiled to other code.
#define FOR_WARP_KEYS(on)                                                              \
    for (int k0 = warp * UNROLL; (on) && k0 < K; k0 += NWARPS * UNROLL)                \
        if (float x[UNROLL][ROW_PER_LANE]; load_keys(lnb, k0, K, lane, x), true)       \
            _Pragma("unroll") for (int u = 0; u < UNROLL; ++u)                         \
                if (k0 + u < K)

// BYTES from global src to shared dst, asynchronously; valid == false writes zeros.
template <int BYTES>
__device__ __forceinline__ void copy_async(float* dst, const float* src, const bool valid)
{
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    const int n = valid ? BYTES : 0;
    if (BYTES == 16)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" :: "r"(d), "l"(src), "r"(n));
    else
        asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n"
                     :: "r"(d), "l"(src), "n"(BYTES), "r"(n));
}

__device__ __forceinline__ void copy_commit() { asm volatile("cp.async.commit_group;\n" ::); }
#endif
