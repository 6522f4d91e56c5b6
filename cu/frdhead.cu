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
// (as[k][i], bs[k][j]) and thread (tx, ty) of a 16 x 16 grid owns the outputs (ty + 16 i,
// tx + 16 j), so a warp reads 16 consecutive words of bs and 2 words of as per k.
// Weight gradients: block c owns rows [c*CHUNK, (c+1)*CHUNK), sums them in a fixed order into
// its scratch row (the bias gradient rides along as a column of ones in the other operand), and
// the host adds the scratch rows with one reduce_axis0. No atomics; one writer per element.
// Template constants: D_IN, HIDDEN, N_HORIZONS, N_ATOMS; knobs BM (rows per tile), BK (k per
// staged slice), CHUNK (rows per block of the weight-gradient kernels; its presence selects
// them over the forward).
#include "heads_common.cuh"

#define THREADS 256
#define HA (N_HORIZONS * N_ATOMS)
#define TILES16(n) (((n) + 15) / 16)
// Shared row length of an operand with n columns: whole 16-column groups, plus one word so a
// transposed store (consecutive k, one column) falls in distinct banks.
#define LD(n) (16 * TILES16(n) + 1)
#define TM (BM / 16)
#define IMAX(a, b) ((a) > (b) ? (a) : (b))
// Words of one staged operand slice in the weight-gradient kernels (the Python launch computes
// the same): wide enough for every operand either phase stages.
#define SLICE_W2 (BK * LD(IMAX(IMAX(HA, HIDDEN + 1), BM)))
#define SLICE_W1 (BK * LD(IMAX(IMAX(HIDDEN, D_IN + 1), BM)))

// dst[k][c] = src[k][c] (k < n_rows, c < cols), optionally zeroed where mask <= 0; column
// ones_col is 1 on live rows; every other slot of the BK x WIDTH slice is 0.
template <int WIDTH>
__device__ __forceinline__ void stage_rows(float* dst, const float* __restrict__ src, int cols,
                                           int n_rows, int ones_col,
                                           const float* __restrict__ mask) {
    for (int e = threadIdx.x; e < BK * WIDTH; e += THREADS) {
        const int k = e / WIDTH, c = e % WIDTH;
        float v = 0.f;
        if (k < n_rows) {
            if (c < cols) {
                v = src[(size_t)k * cols + c];
                if (mask != nullptr && !(mask[(size_t)k * cols + c] > 0.f)) v = 0.f;
            } else if (c == ones_col) {
                v = 1.f;
            }
        }
        dst[k * LD(WIDTH) + c] = v;
    }
}

// dst[k][m] = src[m][k0 + k] (m < n_rows, k0 + k < cols), optionally masked; zero elsewhere.
template <int ROWS>
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
        dst[k * LD(ROWS) + m] = v;
    }
}

// acc[i][j] += sum_k as[k][ty + 16 i] * bs[k][tx + 16 j], k ascending (a fixed order).
template <int TI, int TJ, int LDA, int LDB>
__device__ __forceinline__ void mma_slice(float (&acc)[TI][TJ], const float* as,
                                          const float* bs) {
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
#pragma unroll
    for (int k = 0; k < BK; ++k) {
        float a[TI], b[TJ];
#pragma unroll
        for (int i = 0; i < TI; ++i) a[i] = as[k * LDA + ty + 16 * i];
#pragma unroll
        for (int j = 0; j < TJ; ++j) b[j] = bs[k * LDB + tx + 16 * j];
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
        stage_cols<BM>(as, a, K, n_rows, k0, nullptr);
        stage_cols<N>(bs, w, K, N, k0, nullptr);
        __syncthreads();
        mma_slice<TM, TILES16(N), LD(BM), LD(N)>(acc, as, bs);
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
        stage_cols<BM>(as, a, K, n_rows, k0, mask);
        stage_rows<N>(bs, w + (size_t)k0 * N, N, min(BK, K - k0), -1, nullptr);
        __syncthreads();
        mma_slice<TM, TILES16(N), LD(BM), LD(N)>(acc, as, bs);
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
            const int m = ty + 16 * i, n = tx + 16 * j;
            if (m < n_rows && n < N) out[(size_t)m * N + n] = acc[i][j];
        }
}

#ifndef CHUNK
#define K_HIDDEN (BK * ((HIDDEN + BK - 1) / BK))

// Forward: block per BM rows. Layer 1 lands in shared memory k-major (hs[f][m]) and is the
// staged left operand of layer 2 as it is. Dynamic shared memory:
// hs[K_HIDDEN][LD(BM)], as[BK][LD(BM)], bs[BK][LD(max(HIDDEN, HA))]. The bound of one block
// per SM only lifts ptxas's register target: without it the BM=32 tile spills on sm_90.
extern "C" __global__ void __launch_bounds__(THREADS, 1)
frdhead_forward(const float* __restrict__ h_t, const float* __restrict__ w1,
                const float* __restrict__ b1, const float* __restrict__ w2,
                const float* __restrict__ b2, float* __restrict__ hidden,
                float* __restrict__ logits, const int B)
{
    extern __shared__ float smem[];
    float* hs = smem;
    float* as = hs + K_HIDDEN * LD(BM);
    float* bs = as + BK * LD(BM);
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
                const int m = ty + 16 * i, f = tx + 16 * j;
                if (f < HIDDEN) {
                    acc[i][j] = fmaxf(acc[i][j] + b1[f], 0.f);
                    hs[f * LD(BM) + m] = acc[i][j];
                }
            }
        store_rows<HIDDEN>(hidden + (size_t)r0 * HIDDEN, acc, n_rows);
    }
    // k-slices of layer 2 past HIDDEN multiply zero-staged w2 columns: keep them finite
    for (int e = HIDDEN * LD(BM) + threadIdx.x; e < K_HIDDEN * LD(BM); e += THREADS) hs[e] = 0.f;
    __syncthreads();
    float acc[TM][TILES16(HA)];
    zero(acc);
    for (int k0 = 0; k0 < HIDDEN; k0 += BK) {
        stage_cols<HA>(bs, w2, HIDDEN, HA, k0, nullptr);
        __syncthreads();
        mma_slice<TM, TILES16(HA), LD(BM), LD(HA)>(acc, hs + k0 * LD(BM), bs);
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
// The block's weight-gradient partial: P[m][n] = sum_r A[r][m] * [X[r][n] | 1] over its rows,
// written to scratch[blockIdx.x] as M*N values then the M bias sums (the ones column).
template <int M, int N>
__device__ __forceinline__ void chunk_weight_grad(const float* __restrict__ a,
                                                  const float* __restrict__ x,
                                                  const float* __restrict__ mask, int B,
                                                  float* __restrict__ scratch, float* as,
                                                  float* bs) {
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    const int r0 = blockIdx.x * CHUNK, r1 = min(B, r0 + CHUNK);
    float acc[TILES16(M)][TILES16(N + 1)];
    zero(acc);
    for (int k0 = r0; k0 < r1; k0 += BK) {
        const int n_rows = min(BK, r1 - k0);
        stage_rows<M>(as, a + (size_t)k0 * M, M, n_rows, -1,
                      mask == nullptr ? nullptr : mask + (size_t)k0 * M);
        stage_rows<N + 1>(bs, x + (size_t)k0 * N, N, n_rows, N, nullptr);
        __syncthreads();
        mma_slice<TILES16(M), TILES16(N + 1), LD(M), LD(N + 1)>(acc, as, bs);
        __syncthreads();
    }
    float* out = scratch + (size_t)blockIdx.x * (M * N + M);
#pragma unroll
    for (int i = 0; i < TILES16(M); ++i) {
        const int m = ty + 16 * i;
#pragma unroll
        for (int j = 0; j < TILES16(N + 1); ++j) {
            const int n = tx + 16 * j;
            if (m < M && n < N) out[m * N + n] = acc[i][j];
            else if (m < M && n == N) out[M * N + m] = acc[i][j];
        }
    }
}

// F.3b: block per CHUNK rows: its dW2/db2 partial, then dhidden for its rows, BM at a time.
// Dynamic shared memory: as and bs of SLICE_W2 words each.
extern "C" __global__ void __launch_bounds__(THREADS)
frdhead_grad_w2(const float* __restrict__ hidden, const float* __restrict__ w2,
                const float* __restrict__ grad_logits, float* __restrict__ scratch,
                float* __restrict__ dhidden, const int B)
{
    extern __shared__ float smem[];
    float* as = smem;
    float* bs = smem + SLICE_W2;
    chunk_weight_grad<HA, HIDDEN>(grad_logits, hidden, nullptr, B, scratch, as, bs);
    const int r1 = min(B, (int)(blockIdx.x + 1) * CHUNK);
    for (int m0 = blockIdx.x * CHUNK; m0 < r1; m0 += BM) {
        float acc[TM][TILES16(HIDDEN)];
        rows_times_w<HIDDEN, HA>(acc, grad_logits + (size_t)m0 * HA, min(BM, r1 - m0), w2, as,
                                 bs, nullptr);
        store_rows<HIDDEN>(dhidden + (size_t)m0 * HIDDEN, acc, min(BM, r1 - m0));
    }
}

// F.3c: block per CHUNK rows: its dW1/db1 partial, then dh_t for its rows, BM at a time; the
// ReLU mask is applied as dhidden is staged. Dynamic shared memory: as and bs of SLICE_W1 words.
extern "C" __global__ void __launch_bounds__(THREADS)
frdhead_grad_w1(const float* __restrict__ h_t, const float* __restrict__ w1,
                const float* __restrict__ hidden, const float* __restrict__ dhidden,
                float* __restrict__ scratch, float* __restrict__ grad_h_t, const int B)
{
    extern __shared__ float smem[];
    float* as = smem;
    float* bs = smem + SLICE_W1;
    chunk_weight_grad<HIDDEN, D_IN>(dhidden, h_t, hidden, B, scratch, as, bs);
    const int r1 = min(B, (int)(blockIdx.x + 1) * CHUNK);
    for (int m0 = blockIdx.x * CHUNK; m0 < r1; m0 += BM) {
        float acc[TM][TILES16(D_IN)];
        rows_times_w<D_IN, HIDDEN>(acc, dhidden + (size_t)m0 * HIDDEN, min(BM, r1 - m0), w1, as,
                                   bs, hidden + (size_t)m0 * HIDDEN);
        store_rows<D_IN>(grad_h_t + (size_t)m0 * D_IN, acc, min(BM, r1 - m0));
    }
}
#endif
