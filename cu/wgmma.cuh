// Hopper's warpgroup MMA (wgmma, sm_90a) with TF32 operands and f32 accumulators: the layout of
// a shared-memory operand, its descriptor, the products of a warpgroup with A from registers, and
// a warpgroup's barrier. A family that includes it builds its WGMMA variants for sm_90a
// (core.compile.variant_arch).

// float offset of element (r, k) of an R-row operand in the no-swizzle K-major layout: core
// matrices of 8 rows by 4 floats of k (128 contiguous bytes), k groups R * 16 bytes apart
__device__ __forceinline__ int core_offset(int r, int k, int rows) {
    return ((k >> 2) * (rows >> 3) + (r >> 3)) * 32 + (r & 7) * 4 + (k & 3);
}

// shared-memory matrix descriptor, no swizzle: leading byte offset = the k-group step, stride
// byte offset = the 8-row step
__device__ __forceinline__ unsigned long long wg_desc(const float* p, unsigned lead,
                                                      unsigned stride) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(p);
    return (unsigned long long)((a & 0x3FFFF) >> 4) | (unsigned long long)(lead >> 4) << 16
           | (unsigned long long)(stride >> 4) << 32;
}

// Accumulator operands of m64n112 (56 a thread) and m64n128 (64: the 56 and 8 more).
#define WG_REGS_56 \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, " \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
    "%48, %49, %50, %51, %52, %53, %54, %55"
#define WG_ACC_56 \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
    "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
    "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
    "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
    "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
    "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
    "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55])
#define WG_OPEN(n) "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n" \
    "wgmma.mma_async.sync.aligned.m64n" #n "k8.f32.tf32.tf32 {" WG_REGS_56

// d (m64n128 or m64n112, f32) += A (64 x 8, registers: a0 (g, t), a1 (g+8, t), a2 (g, t+4),
// a3 (g+8, t+4), g = lane / 4, t = lane % 4 within the warp's 16 rows) . B (descriptor db)^T
__device__ __forceinline__ void wgmma_rs(float (&d)[64], const unsigned (&a)[4],
                                         unsigned long long db) {
    asm volatile(WG_OPEN(128) ", %56, %57, %58, %59, %60, %61, %62, %63}, "
                 "{%64, %65, %66, %67}, %68, p, 1, 1;\n}\n"
                 : WG_ACC_56, "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]),
                   "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}
__device__ __forceinline__ void wgmma_rs(float (&d)[56], const unsigned (&a)[4],
                                         unsigned long long db) {
    asm volatile(WG_OPEN(112) "}, {%56, %57, %58, %59}, %60, p, 1, 1;\n}\n"
                 : WG_ACC_56 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}

// d += A . B^T over one k-step in 3xTF32 (small.big + big.small + big.big, the dropped
// small.small term as everywhere): A's halves from registers, B's at wb and ws (this k-step's
// core matrices of a rows-row operand)
template <int NACC>
__device__ __forceinline__ void wgmma_3xtf32(float (&d)[NACC], const unsigned (&big)[4],
                                             const unsigned (&small)[4], const float* wb,
                                             const float* ws, unsigned rows) {
    wgmma_rs(d, small, wg_desc(wb, rows * 16, 128));
    wgmma_rs(d, big, wg_desc(ws, rows * 16, 128));
    wgmma_rs(d, big, wg_desc(wb, rows * 16, 128));
}

__device__ __forceinline__ void wg_barrier(int wg) {
    asm volatile("bar.sync %0, 128;\n" :: "r"(wg + 1) : "memory");
}
