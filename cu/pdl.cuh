// Programmatic dependent launch (sm_90 on): the next kernel may begin launching, and nothing
// after this call touches memory before the previous kernel's writes are visible. A no-op on a
// plain launch.
__device__ __forceinline__ void pdl_enter()
{
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
