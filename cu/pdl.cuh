// Programmatic dependent launch (sm_90 on; the host launches a family with it where it can, when
// its op sets PDL). Every entry starts with one of these, before it touches memory: a PDL launch
// may begin while the stream's previous kernel still writes. On a plain launch they do nothing.

// The next kernel may begin launching now, and nothing after this touches memory before the
// previous kernel has finished and its writes are visible: what it saves is the launch latency
// between small kernels.
__device__ __forceinline__ void pdl_enter()
{
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// The wait alone, for grids that fill the GPU or feed one that does: an early trigger would let
// the next grid's blocks take SM slots while this one still runs (a pool forward at B=4096, K=64
// measured 57 against 47 us with one), so the next launch overlaps only this grid's tail.
__device__ __forceinline__ void pdl_wait()
{
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
