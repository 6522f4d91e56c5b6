// FRD head: a two-layer MLP from h_t[B, D_IN] to N_HORIZONS x N_ATOMS logits, and its backward
// in two stages (the softmax-CE gradient between them is frd.cu's):
//   forward   hidden[B,F] = ReLU(h_t w1^T + b1), logits[B,HA] = hidden w2^T + b2
//   grad_w2   (F.3b) dW2 = G^T hidden, db2 = sum_b G, dhidden = G w2        (G = grad_logits)
//   grad_w1   (F.3c) dpre = dhidden * [hidden > 0], dW1 = dpre^T h_t, db1 = sum_b dpre,
//             dh_t = dpre w1
// w1 is [F, D_IN], w2 is [HA, F] (HA = N_HORIZONS * N_ATOMS), all row-major. hidden > 0 is the
// same mask as pre > 0, so the forward keeps no pre-activation.
//
// Every product is one shared-memory tiled SIMT GEMM step: both operands are staged k-major
// (as[k][i], bs[k][j]) and thread (tx, ty) of a 16 x 16 grid owns the outputs (ty * TI + i,
// tx + 16 j) for i < TI (a multiple of 4), j < TJ: per k a warp reads its TI left values as
// float4s of two addresses (broadcast) and 16 consecutive words of bs per j, so shared-memory
// traffic stays below the FMA rate. Operand slices are double-buffered: slice k+1 is loaded
// from global memory into registers while slice k is multiplied, then stored to the other
// shared buffer, so one block per SM still overlaps its loads with its arithmetic.
// Weight gradients: block c owns rows [c*CHUNK, (c+1)*CHUNK), sums them in a fixed order into
// its scratch row (with the bias gradient: column sums of the staged left operand), and the
// host adds the scratch rows with one reduce_axis0. No atomics; one writer per element.
// Template constants: D_IN, HIDDEN, N_HORIZONS, N_ATOMS; knobs BM (rows per tile), BK (k per
// staged slice), CHUNK (rows per block of the weight-gradient kernels; its presence selects
// them over the forward).
#include "heads_common.cuh"

// Every kernel is declared __launch_bounds__(THREADS, 1): a bound of one block per SM lifts
// ptxas's register target, which otherwise caps these register tiles at 128 and spills on sm_90.
#define THREADS 256
#define HA (N_HORIZONS * N_ATOMS)
#define TILES16(n) (((n) + 15) / 16)
// Right operand (n columns, 16 lanes strided): whole 16-column groups plus one word, so a
// transposed store (consecutive k, one column) falls in distinct banks.
#define LD(n) (16 * TILES16(n) + 1)
// Left operand (n rows, 4-row runs per thread): its rows per thread, and a row length that keeps
// float4 reads aligned (+4: transposed stores spread over 8 banks).
#define ROWS4(n) (4 * (((n) + 63) / 64))
#define LDA(n) (16 * ROWS4(n) + 4)
#define TM (BM / 16)
#define IMAX(a, b) ((a) > (b) ? (a) : (b))
#define PER_THREAD(n) ((BK * (n) + THREADS - 1) / THREADS)

// A staged operand. Slice k0 is the BK x EXTENT block dst[k * LDD + c] of the row-major src
// (rows of `stride` floats, live below row_end x col_end, zeroed where mask <= 0): with
// ALONG_ROWS, src row k0 + k and column c; otherwise the transpose, src row c and column k0 + k.
// Either way consecutive threads read consecutive floats of a src row. Slots past EXTENT feed
// only accumulators that are never stored.
template <int EXTENT, int LDD, bool ALONG_ROWS>
struct Slices {
    const float* __restrict__ src;
    const float* __restrict__ mask;
    int stride, row_end, col_end;
    float v[PER_THREAD(EXTENT)];

    __device__ __forceinline__ static int k_of(int e) { return ALONG_ROWS ? e / EXTENT : e % BK; }
    __device__ __forceinline__ static int c_of(int e) { return ALONG_ROWS ? e % EXTENT : e / BK; }

    __device__ __forceinline__ void load(int k0) {
#pragma unroll
        for (int u = 0; u < PER_THREAD(EXTENT); ++u) {
            const int e = threadIdx.x + u * THREADS;
            const int row = ALONG_ROWS ? k0 + k_of(e) : c_of(e);
            const int col = ALONG_ROWS ? c_of(e) : k0 + k_of(e);
            const size_t at = (size_t)row * stride + col;
            float x = 0.f;
            if (e < BK * EXTENT && row < row_end && col < col_end) {
                x = src[at];
                if (mask != nullptr && !(mask[at] > 0.f)) x = 0.f;
            }
            v[u] = x;
        }
    }
    __device__ __forceinline__ void store(float* dst) const {
#pragma unroll
        for (int u = 0; u < PER_THREAD(EXTENT); ++u) {
            const int e = threadIdx.x + u * THREADS;
            if (e < BK * EXTENT) dst[k_of(e) * LDD + c_of(e)] = v[u];
        }
    }
    __device__ __forceinline__ const float* tile(const float* dst, int) const { return dst; }
};

// A left operand already in shared memory, k-major with rows of LDD (the forward's hidden tile).
template <int LDD>
struct Resident {
    const float* base;

    __device__ __forceinline__ void load(int) {}
    __device__ __forceinline__ void store(float*) const {}
    __device__ __forceinline__ const float* tile(const float*, int k0) const {
        return base + k0 * LDD;
    }
};

struct NoHook {
    __device__ __forceinline__ void operator()(const float*) const {}
};

// acc[i][j] += sum_k as[k][ty * TI + i] * bs[k][tx + 16 j], k ascending (a fixed order).
template <int TI, int TJ, int LDL, int LDR>
__device__ __forceinline__ void mma_slice(float (&acc)[TI][TJ], const float* as,
                                          const float* bs) {
    static_assert(TI % 4 == 0 && LDL % 4 == 0, "left operand rows are read as float4");
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
#pragma unroll
    for (int k = 0; k < BK; ++k) {
        float a[TI], b[TJ];
#pragma unroll
        for (int i = 0; i < TI; i += 4) {
            const float4 t = *reinterpret_cast<const float4*>(as + k * LDL + ty * TI + i);
            a[i] = t.x; a[i + 1] = t.y; a[i + 2] = t.z; a[i + 3] = t.w;
        }
#pragma unroll
        for (int j = 0; j < TJ; ++j) b[j] = bs[k * LDR + tx + 16 * j];
#pragma unroll
        for (int i = 0; i < TI; ++i)
#pragma unroll
            for (int j = 0; j < TJ; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
    }
}

template <int TI, int TJ>
__device__ __forceinline__ void zero(float (&acc)[TI][TJ]) {
#pragma unroll
    for (int i = 0; i < TI; ++i)
#pragma unroll
        for (int j = 0; j < TJ; ++j) acc[i][j] = 0.f;
}

// acc = sum over the slices k0 in [k_begin, k_end) of a-slice x b-slice, slices in order.
// as and bs hold two buffers of sa and sb words; hook sees each left slice after its products.
template <int TI, int TJ, int LDL, int LDR, class A, class Bop, class Hook>
__device__ __forceinline__ void gemm(float (&acc)[TI][TJ], A& a, Bop& b, int k_begin,
                                     int k_end, float* as, int sa, float* bs, int sb,
                                     Hook& hook) {
    zero(acc);
    a.load(k_begin);
    b.load(k_begin);
    int buf = 0;
    for (int k0 = k_begin; k0 < k_end; k0 += BK, buf ^= 1) {
        // buffer buf was last read two slices ago, before the barrier of the previous slice
        a.store(as + buf * sa);
        b.store(bs + buf * sb);
        __syncthreads();
        if (k0 + BK < k_end) {
            a.load(k0 + BK);
            b.load(k0 + BK);
        }
        const float* left = a.tile(as + buf * sa, k0);
        mma_slice<TI, TJ, LDL, LDR>(acc, left, bs + buf * sb);
        hook(left);
    }
    __syncthreads();  // the buffers are free again for the caller
}

template <int N>
__device__ __forceinline__ void store_rows(float* __restrict__ out, const float (&acc)[TM][TILES16(N)],
                                           int n_rows) {
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TILES16(N); ++j) {
            const int m = ty * TM + i, n = tx + 16 * j;
            if (m < n_rows && n < N) out[(size_t)m * N + n] = acc[i][j];
        }
}

#ifndef CHUNK
#define K_HIDDEN (BK * ((HIDDEN + BK - 1) / BK))
#define SLICE_A (BK * LDA(BM))
#define SLICE_B (BK * LD(IMAX(HIDDEN, HA)))

// Forward: block per BM rows. Layer 1 lands in shared memory k-major (hs[f][m]) and is the
// left operand of layer 2 as it is. Dynamic shared memory (the Python launch computes the
// same): hs[K_HIDDEN][LDA(BM)], then two left and two right slice buffers.
extern "C" __global__ void __launch_bounds__(THREADS, 1)
frdhead_forward(const float* __restrict__ h_t, const float* __restrict__ w1,
                const float* __restrict__ b1, const float* __restrict__ w2,
                const float* __restrict__ b2, float* __restrict__ hidden,
                float* __restrict__ logits, const int B)
{
    extern __shared__ float smem[];
    float* hs = smem;
    float* as = hs + K_HIDDEN * LDA(BM);
    float* bs = as + 2 * SLICE_A;
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    const int r0 = blockIdx.x * BM;
    const int n_rows = min(BM, B - r0);
    NoHook none;
    {
        float acc[TM][TILES16(HIDDEN)];
        Slices<BM, LDA(BM), false> a{h_t + (size_t)r0 * D_IN, nullptr, D_IN, n_rows, D_IN};
        Slices<HIDDEN, LD(HIDDEN), false> w{w1, nullptr, D_IN, HIDDEN, D_IN};
        gemm<TM, TILES16(HIDDEN), LDA(BM), LD(HIDDEN)>(acc, a, w, 0, D_IN, as, SLICE_A, bs,
                                                      SLICE_B, none);
#pragma unroll
        for (int i = 0; i < TM; ++i)
#pragma unroll
            for (int j = 0; j < TILES16(HIDDEN); ++j) {
                const int m = ty * TM + i, f = tx + 16 * j;
                if (f < HIDDEN) {
                    acc[i][j] = fmaxf(acc[i][j] + b1[f], 0.f);
                    hs[f * LDA(BM) + m] = acc[i][j];
                }
            }
        store_rows<HIDDEN>(hidden + (size_t)r0 * HIDDEN, acc, n_rows);
    }
    // k-slices of layer 2 past HIDDEN multiply zero-staged w2 columns: keep them finite
    for (int e = HIDDEN * LDA(BM) + threadIdx.x; e < K_HIDDEN * LDA(BM); e += THREADS) hs[e] = 0.f;
    __syncthreads();
    float acc[TM][TILES16(HA)];
    Resident<LDA(BM)> a{hs};
    Slices<HA, LD(HA), false> w{w2, nullptr, HIDDEN, HA, HIDDEN};
    gemm<TM, TILES16(HA), LDA(BM), LD(HA)>(acc, a, w, 0, HIDDEN, as, SLICE_A, bs, SLICE_B, none);
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TILES16(HA); ++j) {
            const int n = tx + 16 * j;
            if (n < HA) acc[i][j] += b2[n];
        }
    store_rows<HA>(logits + (size_t)r0 * HA, acc, n_rows);
}

#else
// Bias partials: column sums of each staged left slice [BK][M], k ascending.
template <int M, int LDD>
struct ColumnSums {
    float v[(M + THREADS - 1) / THREADS];

    __device__ __forceinline__ void operator()(const float* as) {
#pragma unroll
        for (int u = 0; u < (M + THREADS - 1) / THREADS; ++u) {
            const int m = threadIdx.x + u * THREADS;
            if (m < M)
#pragma unroll
                for (int k = 0; k < BK; ++k) v[u] += as[k * LDD + m];
        }
    }
};

// One backward stage over the block's CHUNK rows of A[B][M] (zeroed where mask <= 0): the
// weight and bias partials sum_r A[r]^T X[r] and sum_r A[r] into scratch[blockIdx.x] (M*N
// values, then M), then out[r] = A[r] . W (W is [M][N]) for its rows, BM at a time.
// Dynamic shared memory (the Python launch computes the same): two left slice buffers of
// BK * max(LDA(M), LDA(BM)) words, then two right ones of BK * LD(N).
template <int M, int N>
__device__ __forceinline__ void backward_stage(const float* __restrict__ a,
                                               const float* __restrict__ x,
                                               const float* __restrict__ w,
                                               const float* __restrict__ mask,
                                               float* __restrict__ scratch,
                                               float* __restrict__ out, int B) {
    constexpr int sa = BK * IMAX(LDA(M), LDA(BM)), sb = BK * LD(N);
    extern __shared__ float smem[];
    float* as = smem;
    float* bs = smem + 2 * sa;
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    const int r0 = blockIdx.x * CHUNK, r1 = min(B, r0 + CHUNK);
    {
        float acc[ROWS4(M)][TILES16(N)];
        Slices<M, LDA(M), true> left{a, mask, M, r1, M};
        Slices<N, LD(N), true> right{x, nullptr, N, r1, N};
        ColumnSums<M, LDA(M)> bias{};
        gemm<ROWS4(M), TILES16(N), LDA(M), LD(N)>(acc, left, right, r0, r1, as, sa, bs, sb,
                                                   bias);
        float* part = scratch + (size_t)blockIdx.x * (M * N + M);
#pragma unroll
        for (int i = 0; i < ROWS4(M); ++i)
#pragma unroll
            for (int j = 0; j < TILES16(N); ++j) {
                const int m = ty * ROWS4(M) + i, n = tx + 16 * j;
                if (m < M && n < N) part[m * N + n] = acc[i][j];
            }
#pragma unroll
        for (int u = 0; u < (M + THREADS - 1) / THREADS; ++u) {
            const int m = threadIdx.x + u * THREADS;
            if (m < M) part[M * N + m] = bias.v[u];
        }
    }
    NoHook none;
    for (int m0 = r0; m0 < r1; m0 += BM) {
        const int n_rows = min(BM, r1 - m0);
        float acc[TM][TILES16(N)];
        Slices<BM, LDA(BM), false> left{a + (size_t)m0 * M,
                                        mask == nullptr ? nullptr : mask + (size_t)m0 * M, M,
                                        n_rows, M};
        Slices<N, LD(N), true> right{w, nullptr, N, M, N};
        gemm<TM, TILES16(N), LDA(BM), LD(N)>(acc, left, right, 0, M, as, sa, bs, sb, none);
        store_rows<N>(out + (size_t)m0 * N, acc, n_rows);
    }
}

// F.3b: dW2/db2 partials and dhidden = G w2.
extern "C" __global__ void __launch_bounds__(THREADS, 1)
frdhead_grad_w2(const float* __restrict__ hidden, const float* __restrict__ w2,
                const float* __restrict__ grad_logits, float* __restrict__ scratch,
                float* __restrict__ dhidden, const int B)
{
    backward_stage<HA, HIDDEN>(grad_logits, hidden, w2, nullptr, scratch, dhidden, B);
}

// F.3c: dW1/db1 partials and dh_t = dpre w1; the ReLU mask is applied as dhidden is staged.
extern "C" __global__ void __launch_bounds__(THREADS, 1)
frdhead_grad_w1(const float* __restrict__ h_t, const float* __restrict__ w1,
                const float* __restrict__ hidden, const float* __restrict__ dhidden,
                float* __restrict__ scratch, float* __restrict__ grad_h_t, const int B)
{
    backward_stage<HIDDEN, D_IN>(dhidden, h_t, w1, hidden, scratch, grad_h_t, B);
}
#endif
