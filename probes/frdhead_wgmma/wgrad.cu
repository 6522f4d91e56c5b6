// Issue 32 probe, the backward's shape: a weight gradient g[m][n] = sum_b a[b][m] x[b][n]
// (grad_w1 = dhidden^T h_t: a [B, M], x [B, N]) on wgmma in 3xTF32, the sum over the batch
// split across blocks with no atomics: block j writes its rows' sum to part[j], and wg_reduce
// adds the parts in block order.
// - 2 warpgroups a block: warpgroup w owns output rows [64w, 64w + 64), both read one x tile.
// - BK batch rows a step: cp.async brings the raw a and x tiles (padded rows) one step ahead.
// - The product's K is the batch: B (x) must be K-major in shared memory, so every step the
//   block transposes its x tile into wgmma's core-matrix layout, split into big and small
//   halves (each warp's writes and reads hit 32 distinct banks: lane L takes n % 8 = L / 4 and
//   k % 4 = L % 4).
// - A (a^T) comes from registers: a thread's fragment is a[b = 8s + t (+4)][m = g (+8)], read
//   from the raw tile (rows padded by 8 floats: conflict-free) and split in registers.
// Template constants: M = N = 128, BK (multiple of 8).
#define NT 256
#define RAW (128 + 8)  // padded raw row
static_assert(M == 128 && N == 128, "two m64 warpgroups by one n128 accumulator");
static_assert(BK % 8 == 0, "BK in k-steps of 8");

__device__ __forceinline__ int cm(int r, int k, int rows) {
    return ((k >> 2) * (rows >> 3) + (r >> 3)) * 32 + (r & 7) * 4 + (k & 3);
}

__device__ __forceinline__ void split(float x, unsigned& big, unsigned& small) {
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(big) : "f"(x));
    small = __float_as_uint(x - __uint_as_float(big));
}

__device__ __forceinline__ unsigned long long desc(const float* p, unsigned lead, unsigned stride) {
    const unsigned a = (unsigned)__cvta_generic_to_shared(p);
    return (unsigned long long)((a & 0x3FFFF) >> 4) | (unsigned long long)(lead >> 4) << 16
           | (unsigned long long)(stride >> 4) << 32;
}

__device__ __forceinline__ void wgmma_rs(float (&d)[64], const unsigned (&a)[4],
                                         unsigned long long db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
        "{%64, %65, %66, %67}, %68, p, 1, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}

// rows [b0, b0 + BK) of a [B, 128] array into a padded raw tile (rows past `end` read as 0)
__device__ __forceinline__ void load_raw(float* raw, const float* __restrict__ src, int b0,
                                         int end) {
    for (int e = threadIdx.x; e < BK * 32; e += NT) {
        const int r = e / 32, c = 4 * (e % 32);
        const bool in = b0 + r < end;
        const float* from = in ? src + (size_t)(b0 + r) * 128 + c : src;
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                     :: "r"((unsigned)__cvta_generic_to_shared(raw + r * RAW + c)), "l"(from),
                        "r"(in ? 16 : 0) : "memory");
    }
}

extern "C" __global__ void __launch_bounds__(NT, 2)
wg_wgrad(const float* __restrict__ a, const float* __restrict__ x, float* __restrict__ part,
         const int B, const int rows_per_block)
{
    extern __shared__ __align__(128) float sm[];
    float* xb = sm;                 // x tile big, [N x BK] core-matrix layout (K = batch)
    float* xs = xb + N * BK;        // x tile small
    float* raw = xs + N * BK;       // 2 stages of (a tile, x tile), padded rows
    const int wg = threadIdx.x / 128, warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
    const int g = lane / 4, t = lane % 4;
    const int begin = blockIdx.x * rows_per_block;
    const int end = min(B, begin + rows_per_block);
    float d[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) d[i] = 0.f;
    if (begin < end) {
        load_raw(raw, a, begin, end);
        load_raw(raw + BK * RAW, x, begin, end);
        asm volatile("cp.async.commit_group;\n" ::: "memory");
    }
    for (int b0 = begin, stage = 0; b0 < end; b0 += BK, stage ^= 1) {
        float* ra = raw + stage * 2 * BK * RAW;
        float* rx = ra + BK * RAW;
        asm volatile("cp.async.wait_all;\n" ::: "memory");
        __syncthreads();  // this step's tiles are in; last step's products are done with xb, xs
        if (b0 + BK < end) {
            float* next = raw + (stage ^ 1) * 2 * BK * RAW;
            load_raw(next, a, b0 + BK, end);
            load_raw(next + BK * RAW, x, b0 + BK, end);
            asm volatile("cp.async.commit_group;\n" ::: "memory");
        }
        // x tile transposed and split: lane L takes n = 8j + L / 4, k = 4i + L % 4
        for (int e = threadIdx.x; e < N * BK; e += NT) {
            const int w = e / 32, L = e % 32;  // w: which 8 n x 4 k block
            const int n = 8 * (w % (N / 8)) + L / 4, k = 4 * (w / (N / 8)) + L % 4;
            unsigned big, small;
            split(rx[k * RAW + n], big, small);
            xb[cm(n, k, N)] = __uint_as_float(big);
            xs[cm(n, k, N)] = __uint_as_float(small);
        }
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        __syncthreads();
        unsigned big[BK / 8][4], small[BK / 8][4];
        const int m = 64 * wg + 16 * warp + g;
#pragma unroll
        for (int s = 0; s < BK / 8; ++s) {
            split(ra[(8 * s + t) * RAW + m], big[s][0], small[s][0]);
            split(ra[(8 * s + t) * RAW + m + 8], big[s][1], small[s][1]);
            split(ra[(8 * s + t + 4) * RAW + m], big[s][2], small[s][2]);
            split(ra[(8 * s + t + 4) * RAW + m + 8], big[s][3], small[s][3]);
        }
        asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
        for (int s = 0; s < BK / 8; ++s) {
            const int kb = 2 * s * (N / 8) * 32;
            wgmma_rs(d, small[s], desc(xb + kb, N * 16, 128));
            wgmma_rs(d, big[s], desc(xs + kb, N * 16, 128));
            wgmma_rs(d, big[s], desc(xb + kb, N * 16, 128));
        }
        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
        asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    }
    float* out = part + (size_t)blockIdx.x * M * N;
#pragma unroll
    for (int j = 0; j < N / 8; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            float2 v;
            v.x = d[4 * j + 2 * h];
            v.y = d[4 * j + 2 * h + 1];
            *reinterpret_cast<float2*>(out + (64 * wg + 16 * warp + g + 8 * h) * N + 8 * j + 2 * t) = v;
        }
}

// g[i] = sum over the parts in block order (one thread an element: a fixed order)
extern "C" __global__ void wg_reduce(const float* __restrict__ part, float* __restrict__ g,
                                     const int parts)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= M * N) return;
    float s = 0.f;
    for (int j = 0; j < parts; ++j) s += part[(size_t)j * M * N + i];
    g[i] = s;
}
