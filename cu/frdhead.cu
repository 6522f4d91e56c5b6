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
// traffic stays below the FMA rate.
// Weight gradients: block c owns rows [c*CHUNK, (c+1)*CHUNK), sums them in a fixed order into
// its scratch row (with the bias gradient: column sums of the staged left operand), and the
// host adds the scratch rows with one reduce_axis0. No atomics; one writer per element.
// Template constants: D_IN, HIDDEN, N_HORIZONS, N_ATOMS; knobs BM (rows per tile), BK (k per
// staged slice), CHUNK (rows per block of the weight-gradient kernels; its presence selects
// them over the forward).
#include "heads_common.cuh"

// Every kernel is launched with __launch_bounds__(THREADS, 1): a bound of one block per SM lifts
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
// Words of one staged operand slice in the weight-gradient kernels (the Python launch computes
// the same): wide enough for every operand either phase stages.
#define SLICE_W2 (BK * IMAX(IMAX(LDA(HA), LD(HIDDEN)), LDA(BM)))
#define SLICE_W1 (BK * IMAX(IMAX(LDA(HIDDEN), LD(D_IN)), LDA(BM)))

// dst[k * LDD + c] = src[k][c] (k < n_rows, c < WIDTH), optionally zeroed where mask <= 0;
// rows past n_rows are 0 (slots past WIDTH feed only accumulators that are never stored).
template <int WIDTH, int LDD>
__device__ __forceinline__ void stage_rows(float* dst, const float* __restrict__ src, int n_rows,
                                           const float* __restrict__ mask) {
    for (int e = threadIdx.x; e < BK * WIDTH; e += THREADS) {
        const int k = e / WIDTH, c = e % WIDTH;
        float v = 0.f;
        if (k < n_rows) {
            v = src[(size_t)k * WIDTH + c];
            if (mask != nullptr && !(mask[(size_t)k * WIDTH + c] > 0.f)) v = 0.f;
        }
        dst[k * LDD + c] = v;
    }
}

// dst[k * LDD + m] = src[m][k0 + k] (m < n_rows, k0 + k < cols), optionally masked; zero
// elsewhere in the BK x ROWS slice.
template <int ROWS, int LDD>
__device__ __forceinline__ void stage_cols(float* dst, const float* __restrict__ src, int cols,
                                           int n_rows, int k0, const float* __restrict__ mask) {
    for (int e = threadIdx.x; e < BK * ROWS; e += THREADS) {
        const int k = e % BK, m = e / BK;
        float v = 0.f;
        if (m < n_rows && k0 + k < cols) {
            const size_t at = (size_t)m * cols + k0 + k;
            v = src[at];
            if (mask != nullptr && !(mask[at] > 0.f)) v = 0.f;
        }
        dst[k * LDD + m] = v;
    }
}

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

// out[m][n] = A[m][:] . W[n][:] for the BM rows of A starting at a (n_rows of them live):
// both operands are row-major with K contiguous and staged transposed.
template <int N, int K>
__device__ __forceinline__ void rows_times_wt(float (&acc)[TM][TILES16(N)],
                                              const float* __restrict__ a, int n_rows,
                                              const float* __restrict__ w, float* as, float* bs) {
    zero(acc);
    for (int k0 = 0; k0 < K; k0 += BK) {
        stage_cols<BM, LDA(BM)>(as, a, K, n_rows, k0, nullptr);
        stage_cols<N, LD(N)>(bs, w, K, N, k0, nullptr);
        __syncthreads();
        mma_slice<TM, TILES16(N), LDA(BM), LD(N)>(acc, as, bs);
        __syncthreads();
    }
}

// out[m][n] = A[m][:] . W[:][n] for the BM rows of A starting at a: W is [K][N] row-major.
template <int N, int K>
__device__ __forceinline__ void rows_times_w(float (&acc)[TM][TILES16(N)],
                                             const float* __restrict__ a, int n_rows,
                                             const float* __restrict__ w, float* as, float* bs,
                                             const float* __restrict__ mask) {
    zero(acc);
    for (int k0 = 0; k0 < K; k0 += BK) {
        stage_cols<BM, LDA(BM)>(as, a, K, n_rows, k0, mask);
        stage_rows<N, LD(N)>(bs, w + (size_t)k0 * N, min(BK, K - k0), nullptr);
        __syncthreads();
        mma_slice<TM, TILES16(N), LDA(BM), LD(N)>(acc, as, bs);
        __syncthreads();
    }
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

// Forward: block per BM rows. Layer 1 lands in shared memory k-major (hs[f][m]) and is the
// staged left operand of layer 2 as it is. Dynamic shared memory:
// hs[K_HIDDEN][LDA(BM)], as[BK][LDA(BM)], bs[BK][LD(max(HIDDEN, HA))].
extern "C" __global__ void __launch_bounds__(THREADS, 1)
frdhead_forward(const float* __restrict__ h_t, const float* __restrict__ w1,
                const float* __restrict__ b1, const float* __restrict__ w2,
                const float* __restrict__ b2, float* __restrict__ hidden,
                float* __restrict__ logits, const int B)
{
    extern __shared__ float smem[];
    float* hs = smem;
    float* as = hs + K_HIDDEN * LDA(BM);
    float* bs = as + BK * LDA(BM);
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    const int r0 = blockIdx.x * BM;
    const int n_rows = min(BM, B - r0);
    {
        float acc[TM][TILES16(HIDDEN)];
        rows_times_wt<HIDDEN, D_IN>(acc, h_t + (size_t)r0 * D_IN, n_rows, w1, as, bs);
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
    zero(acc);
    for (int k0 = 0; k0 < HIDDEN; k0 += BK) {
        stage_cols<HA, LD(HA)>(bs, w2, HIDDEN, HA, k0, nullptr);
        __syncthreads();
        mma_slice<TM, TILES16(HA), LDA(BM), LD(HA)>(acc, hs + k0 * LDA(BM), bs);
        __syncthreads();
    }
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
// The block's weight-gradient partial: P[m][n] = sum_r A[r][m] * X[r][n] and the bias
// sum_r A[r][m] over its rows, k ascending; written to scratch[blockIdx.x] as M*N values then
// the M bias sums.
template <int M, int N>
__device__ __forceinline__ void chunk_weight_grad(const float* __restrict__ a,
                                                  const float* __restrict__ x,
                                                  const float* __restrict__ mask, int B,
                                                  float* __restrict__ scratch, float* as,
                                                  float* bs) {
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    const int r0 = blockIdx.x * CHUNK, r1 = min(B, r0 + CHUNK);
    constexpr int BIAS = (M + THREADS - 1) / THREADS;
    float acc[ROWS4(M)][TILES16(N)], bias[BIAS];
    zero(acc);
#pragma unroll
    for (int u = 0; u < BIAS; ++u) bias[u] = 0.f;
    for (int k0 = r0; k0 < r1; k0 += BK) {
        const int n_rows = min(BK, r1 - k0);
        stage_rows<M, LDA(M)>(as, a + (size_t)k0 * M, n_rows,
                              mask == nullptr ? nullptr : mask + (size_t)k0 * M);
        stage_rows<N, LD(N)>(bs, x + (size_t)k0 * N, n_rows, nullptr);
        __syncthreads();
        mma_slice<ROWS4(M), TILES16(N), LDA(M), LD(N)>(acc, as, bs);
#pragma unroll
        for (int u = 0; u < BIAS; ++u) {
            const int m = threadIdx.x + u * THREADS;
            if (m < M)
#pragma unroll
                for (int k = 0; k < BK; ++k) bias[u] += as[k * LDA(M) + m];
        }
        __syncthreads();
    }
    float* out = scratch + (size_t)blockIdx.x * (M * N + M);
#pragma unroll
    for (int i = 0; i < ROWS4(M); ++i) {
        const int m = ty * ROWS4(M) + i;
#pragma unroll
        for (int j = 0; j < TILES16(N); ++j) {
            const int n = tx + 16 * j;
            if (m < M && n < N) out[m * N + n] = acc[i][j];
        }
    }
#pragma unroll
    for (int u = 0; u < BIAS; ++u) {
        const int m = threadIdx.x + u * THREADS;
        if (m < M) out[M * N + m] = bias[u];
    }
}

// One backward stage over the block's CHUNK rows of A[B][M] (zeroed where mask <= 0): the
// weight and bias partials sum_r A[r]^T X[r], sum_r A[r] into scratch, then out[r] = A[r] . W (W is [M][N]) for its
// rows, BM at a time. Dynamic shared memory: as and bs of SLICE words each.
template <int M, int N, int SLICE>
__device__ __forceinline__ void backward_stage(const float* __restrict__ a,
                                               const float* __restrict__ x,
                                               const float* __restrict__ w,
                                               const float* __restrict__ mask,
                                               float* __restrict__ scratch,
                                               float* __restrict__ out, int B) {
    extern __shared__ float smem[];
    float* as = smem;
    float* bs = smem + SLICE;
    chunk_weight_grad<M, N>(a, x, mask, B, scratch, as, bs);
    const int r1 = min(B, (int)(blockIdx.x + 1) * CHUNK);
    for (int m0 = blockIdx.x * CHUNK; m0 < r1; m0 += BM) {
        const int n_rows = min(BM, r1 - m0);
        float acc[TM][TILES16(N)];
        rows_times_w<N, M>(acc, a + (size_t)m0 * M, n_rows, w, as, bs,
                           mask == nullptr ? nullptr : mask + (size_t)m0 * M);
        store_rows<N>(out + (size_t)m0 * N, acc, n_rows);
    }
}

// F.3b: dW2/db2 partials and dhidden = G w2.
extern "C" __global__ void __launch_bounds__(THREADS, 1)
frdhead_grad_w2(const float* __restrict__ hidden, const float* __restrict__ w2,
                const float* __restrict__ grad_logits, float* __restrict__ scratch,
                float* __restrict__ dhidden, const int B)
{
    backward_stage<HA, HIDDEN, SLICE_W2>(grad_logits, hidden, w2, nullptr, scratch, dhidden, B);
}

// F.3c: dW1/db1 partials and dh_t = dpre w1; the ReLU mask is applied as dhidden is staged.
extern "C" __global__ void __launch_bounds__(THREADS, 1)
frdhead_grad_w1(const float* __restrict__ h_t, const float* __restrict__ w1,
                const float* __restrict__ hidden, const float* __restrict__ dhidden,
                float* __restrict__ scratch, float* __restrict__ grad_h_t, const int B)
{
    backward_stage<HIDDEN, D_IN, SLICE_W1>(dhidden, h_t, w1, hidden, scratch, grad_h_t, B);
}
#endif
