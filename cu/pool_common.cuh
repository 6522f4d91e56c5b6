// The pool's pieces shared by its layouts: the launch wait, row loads and asynchronous copies.
#define LOG2E 1.4426950408889634f

// Programmatic dependent launch (sm_90 on; the host launches this family with it where it can):
// nothing touches memory before the stream's previous kernel has finished and its writes are
// visible, so its tail and this launch overlap. There is no early trigger for the next kernel:
// its blocks would take SM slots while this grid still runs (a B=4096,K=64 forward measured
// 57 against 47 us with one). On a plain launch the wait does nothing.
__device__ __forceinline__ void pdl_wait()
{
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

#ifndef POOL_SPLIT  // the layouts' pieces; split-K's joins take only the wait
// Rows k0 .. k0+UNROLL-1 of one batch row's ln (those below K), laid out over the warp by load_row.
__device__ __forceinline__ void load_keys(const float* __restrict__ lnb, const int k0, const int K,
                                          const int lane, float (*x)[ROW_PER_LANE])
{
#pragma unroll
    for (int u = 0; u < UNROLL; ++u)
        if (k0 + u < K) load_row(lnb + (size_t)(k0 + u) * HIDDEN_DIM, lane, x[u]);
}

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
