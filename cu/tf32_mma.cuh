// 3xTF32 products on the tensor cores (mma.sync m16n8k8, float32 accumulators): each operand x
// is split into big (x cut to tf32) and small = x - big, and a*b is accumulated as
// a_small*b_big + a_big*b_small + a_big*b_big. The dropped a_small*b_small term is about 2^-20
// of the product, so the result has float32 accuracy. Every sum has a fixed order (the mma
// shape, then k ascending), so results are bitwise reproducible.
// big keeps x's top 10 mantissa bits (a truncation, one instruction); small = x - big is exact,
// and the mma reads its top bits as tf32.
__device__ __forceinline__ void tf32_split(float x, unsigned& big, unsigned& small)
{
    big = __float_as_uint(x) & 0xffffe000u;
    small = __float_as_uint(x - __uint_as_float(big));
}

__device__ __forceinline__ void tf32_mma(float (&c)[4], const unsigned (&a)[4],
                                         const unsigned (&b)[2])
{
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Elements (i, k) and (i, k + 1) of an operand, i its row (A) or column (B): s[k * ld + i] when
// k runs down the array ("k-major"), else s[i * ld + k], one 8-byte load.
template <bool K_MAJOR>
__device__ __forceinline__ float2 tf32_pair(const float* s, int ld, int i, int k)
{
    if (K_MAJOR) return make_float2(s[k * ld + i], s[(k + 1) * ld + i]);
    return *reinterpret_cast<const float2*>(s + i * ld + k);
}

// acc[i][j] (the m16 x n8 tile at rows 16 i, columns 8 j of the warp's block) += one k-step
// (k0 to k0 + 7) of A(m, k) B(k, n), g and t the lane's group and thread: A's elements
// (16 i + g + 8 h, k0 + 2t) and (.., k0 + 2t + 1) as a(i, h), B's (8 j + g, k0 + 2t) and
// (.., k0 + 2t + 1) as b(j).
template <int MT, int NT, class AFrag, class BFrag>
__device__ __forceinline__ void tf32_step(float (&acc)[MT][NT][4], AFrag a, BFrag b)
{
    // fragment k = t + 4e is column k0 + 2t + e, for A and B alike (a permutation of the
    // k-step's sum, the same every time)
    unsigned a_big[MT][4], a_small[MT][4], b_big[NT][2], b_small[NT][2];
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int h = 0; h < 2; ++h) {  // rows g and g + 8: registers h and h + 2
            const float2 v = a(i, h);
            tf32_split(v.x, a_big[i][h], a_small[i][h]);
            tf32_split(v.y, a_big[i][h + 2], a_small[i][h + 2]);
        }
#pragma unroll
    for (int j = 0; j < NT; ++j) {
        const float2 v = b(j);
        tf32_split(v.x, b_big[j][0], b_small[j][0]);
        tf32_split(v.y, b_big[j][1], b_small[j][1]);
    }
    // the three products of a tile are issued apart, so consecutive mmas are independent
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < NT; ++j) tf32_mma(acc[i][j], a_small[i], b_big[j]);
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < NT; ++j) tf32_mma(acc[i][j], a_big[i], b_small[j]);
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < NT; ++j) tf32_mma(acc[i][j], a_big[i], b_big[j]);
}

// acc[i][j] += sum over k < 8 KSTEPS of A(m, k) B(k, n), k ascending; a and b point at the
// warp's first row/column, lda and ldb their strides.
template <int MT, int NT, int KSTEPS, bool KA, bool KB>
__device__ __forceinline__ void tf32_gemm(float (&acc)[MT][NT][4], const float* a, int lda,
                                          const float* b, int ldb)
{
    const int g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
#pragma unroll 8
    for (int k0 = 0; k0 < 8 * KSTEPS; k0 += 8)
        tf32_step<MT, NT>(
            acc,
            [&](int i, int h) { return tf32_pair<KA>(a, lda, 16 * i + g + 8 * h, k0 + 2 * t); },
            [&](int j) { return tf32_pair<KB>(b, ldb, 8 * j + g, k0 + 2 * t); });
}

template <int MT, int NT>
__device__ __forceinline__ void tf32_zero(float (&acc)[MT][NT][4])
{
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;
}

// f(m, n, value) for every accumulator, m and n relative to the warp's first row and column.
template <int MT, int NT, class F>
__device__ __forceinline__ void tf32_each(float (&acc)[MT][NT][4], F f)
{
    const int g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e)
                f(16 * i + g + 8 * (e / 2), 8 * j + 2 * t + e % 2, acc[i][j][e]);
}
