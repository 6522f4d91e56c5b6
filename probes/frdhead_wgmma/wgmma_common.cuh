// Pieces of this folder's wgmma probes beside the library's cu/wgmma.cuh (the operand layout,
// descriptor and register-A products): the probes' tf32 split and the product with both
// operands in shared memory (wgmma.cu).
#pragma once
#include "wgmma.cuh"

// big = x rounded to the nearest tf32, small = the rest (the MMA reads its top 19 bits)
__device__ __forceinline__ void split(float x, unsigned& big, unsigned& small) {
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(big) : "f"(x));
    small = __float_as_uint(x - __uint_as_float(big));
}

// d[64] (m64n128, f32) += A (64 x 8, descriptor da) . B (128 x 8, descriptor db)^T
__device__ __forceinline__ void wgmma_ss(float (&d)[64], unsigned long long da,
                                         unsigned long long db) {
    asm volatile(WG_OPEN(128) ", %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1;\n}\n"
                 : WG_ACC_56, "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]),
                   "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "l"(da), "l"(db));
}
