// Issue 32 probe: the FRD head's first layer, hidden = ReLU(x w^T + b) for x [M, K] and w [N, K],
// on Hopper's warpgroup MMA (wgmma, sm_90a) in 3xTF32 (a*b ~ a_small*b_big + a_big*b_small +
// a_big*b_big, float32 accumulators), to measure what wgmma gives over mma.sync
// (probes/frdhead_mma) before a head is built on it. Outside the library; run.py compiles it
// with -D options and checks it against float64.
//
// One warpgroup (128 threads) a block, persistent over tiles of BM = 64 rows. w is split once a
// block into big and small halves in shared memory; each x tile is split into its own two halves
// there. Operands sit in wgmma's no-swizzle K-major layout: "core matrices" of 8 rows by 16
// bytes (4 floats of K), 128 contiguous bytes each; core matrix (row group g, k group c) of an
// R-row operand at ((c * R/8) + g) * 128 bytes, so 8-row groups are 128 bytes apart (the
// descriptor's stride byte offset) and k groups R*16 bytes apart (its leading byte offset).
// DESC_SWAP 1 exchanges the two fields (the probe tries both readings of the PTX manual).
// PASSES 3 is 3xTF32; PASSES 1 (big*big only) times plain TF32 for comparison.
// Template constants: N (= 128: the accumulator is m64n128), K (multiple of 8).
#ifndef DESC_SWAP
#define DESC_SWAP 0
#endif
#ifndef PASSES
#define PASSES 3
#endif
#define NT 128
#define BM 64
static_assert(N == 128, "the accumulator fragment below is m64n128");
static_assert(K % 8 == 0, "K in steps of 8");

// float offset of element (r, k) of an R-row operand in the core-matrix layout
__device__ __forceinline__ int cm(int r, int k, int rows) {
    return ((k >> 2) * (rows >> 3) + (r >> 3)) * 32 + (r & 7) * 4 + (k & 3);
}

// big = x rounded to the nearest tf32, small = the rest (the MMA reads its top 19 bits)
__device__ __forceinline__ void split(float x, float& big, float& small) {
    unsigned b;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(b) : "f"(x));
    big = __uint_as_float(b);
    small = x - big;
}

// wgmma's shared-memory matrix descriptor, no swizzle
__device__ __forceinline__ unsigned long long desc(const float* p, unsigned lead, unsigned stride) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(p);
#if DESC_SWAP
    const unsigned t = lead; lead = stride; stride = t;
#endif
    return (unsigned long long)((a & 0x3FFFF) >> 4) | (unsigned long long)(lead >> 4) << 16
           | (unsigned long long)(stride >> 4) << 32;
}

// d[64] (m64n128, f32) += A (64 x 8, descriptor da) . B (128 x 8, descriptor db)^T
__device__ __forceinline__ void wgmma_tf32(float (&d)[64], unsigned long long da,
                                           unsigned long long db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
        "%64, %65, p, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "l"(da), "l"(db));
}

extern "C" __global__ void __launch_bounds__(NT, 1)
wg_layer(const float* __restrict__ x, const float* __restrict__ w, const float* __restrict__ bias,
         float* __restrict__ y, const int M)
{
    extern __shared__ __align__(128) float sm[];
    float* wb = sm;             // w big   [N x K]
    float* ws = wb + N * K;     // w small
    float* xb = ws + N * K;     // x tile big [BM x K]
    float* xs = xb + BM * K;    // x tile small
    for (int e = threadIdx.x; e < N * K; e += NT) {
        const int n = e / K, k = e % K;
        split(w[e], wb[cm(n, k, N)], ws[cm(n, k, N)]);
    }
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (int tile = blockIdx.x; tile * BM < M; tile += gridDim.x) {
        const int r0 = tile * BM;
        __syncthreads();  // the last tile's MMAs have read xb and xs (they were waited for)
        for (int e = threadIdx.x; e < BM * K; e += NT) {
            const int r = e / K, k = e % K;
            const float v = r0 + r < M ? x[(size_t)(r0 + r) * K + k] : 0.f;
            split(v, xb[cm(r, k, BM)], xs[cm(r, k, BM)]);
        }
        // generic-proxy writes to shared memory, then read by wgmma (the async proxy)
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        __syncthreads();
        float d[64];
#pragma unroll
        for (int i = 0; i < 64; ++i) d[i] = 0.f;
        asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
        for (int s = 0; s < K / 8; ++s) {  // k groups 2s and 2s + 1
            const unsigned la = BM * 16, lb = N * 16;
            const int ka = 2 * s * (BM / 8) * 32, kb = 2 * s * (N / 8) * 32;
#if PASSES == 3
            wgmma_tf32(d, desc(xs + ka, la, 128), desc(wb + kb, lb, 128));
            wgmma_tf32(d, desc(xb + ka, la, 128), desc(ws + kb, lb, 128));
#endif
            wgmma_tf32(d, desc(xb + ka, la, 128), desc(wb + kb, lb, 128));
        }
        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
        asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
        // d[4j + 2h + e]: row 16*warp + lane/4 + 8h, column 8j + 2*(lane%4) + e
#pragma unroll
        for (int j = 0; j < N / 8; ++j)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int r = r0 + 16 * warp + lane / 4 + 8 * h, c = 8 * j + 2 * (lane % 4);
                if (r < M) {
                    float2 v;
                    v.x = fmaxf(d[4 * j + 2 * h] + bias[c], 0.f);
                    v.y = fmaxf(d[4 * j + 2 * h + 1] + bias[c + 1], 0.f);
                    *reinterpret_cast<float2*>(y + (size_t)r * N + c) = v;
                }
            }
    }
}
