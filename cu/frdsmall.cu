// The FRD head for small batches: the same three stages as frdhead.cu (forward, grad_w2 = F.3b,
// grad_w1 = F.3c; w1 [F, D_IN], w2 [HA, F], row-major), written for B too small to fill the GPU
// with frdhead.cu's row chunks, whose every block stages all the weights before its first row.
// Here the work is spread over outputs instead, in FP32 FMAs (float32 accuracy, no TF32):
//   forward   a block takes ROWS rows; a warp takes one hidden unit (then one logit) at a time,
//             its lanes stride the reduction axis, and a butterfly ends the sum.
//   backward  one launch computes two independent parts: the weight and bias gradients (one
//             output per lane, the batch split in SPLIT contiguous ranges over warps, partials
//             added in warp order) and the row gradient (dhidden or grad_h_t, ROWS rows a block).
//   forward_loss  the forward, then the FRD loss of the block's rows: frd.cu's softmax-CE and
//             its gradient, from logits kept in shared memory (one launch where there were two).
// Every sum has a fixed order and every output one writer: no scratch, no reduce, no atomics.
// The weight gradients land in one row [weights | biases], the layout frdhead's reduce leaves.
// Template constants: D_IN, FRD_HIDDEN, N_HORIZONS, N_ATOMS; knobs WARPS (a block's warps),
// ROWS (rows per block), SPLIT (warps sharing one output's batch sum; divides WARPS).
#include "pdl.cuh"

#define THREADS (32 * WARPS)
#define HA (N_HORIZONS * N_ATOMS)
#define LANES(n) (((n) + 31) / 32)
#define GROUPS (WARPS / SPLIT)
// weight-part outputs per block: 32 per group of SPLIT warps
#define PER_BLOCK (32 * GROUPS)

extern __shared__ float smem[];

// sum over lanes of v; lane 0's value is the one used (a fixed order on every run)
__device__ __forceinline__ float lane_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// rows [r0, r0 + ROWS) of src[B, N] into dst[ROWS][N], zero past B
template <int N>
__device__ __forceinline__ void load_rows(float* dst, const float* __restrict__ src, int r0,
                                          int B) {
    for (int i = threadIdx.x; i < ROWS * N; i += THREADS) {
        const int r = r0 + i / N;
        dst[i] = r < B ? src[(size_t)r * N + i % N] : 0.f;
    }
}

// A warp's rows j = warp + WARPS * n of w [M][K], and their biases, loaded DEPTH rows ahead: a
// block of few rows is bound by the latency of these loads, not by its arithmetic, so as many
// as 16 registers a lane hold are in flight at once (every row of the warp's where K <= 128 and
// M <= 4 * WARPS).
template <int K, int M>
struct WeightRing {
    static constexpr int AHEAD = 16 / LANES(K) > 1 ? 16 / LANES(K) : 1;
    static constexpr int PER_WARP = (M + WARPS - 1) / WARPS;
    static constexpr int DEPTH = PER_WARP < AHEAD ? PER_WARP : AHEAD;
    float v[DEPTH][LANES(K)];
    float b[DEPTH];

    __device__ __forceinline__ void load(const float* __restrict__ w,
                                         const float* __restrict__ bias, int slot, int j) {
        const int lane = threadIdx.x % 32;
#pragma unroll
        for (int i = 0; i < LANES(K); i++) {
            const int k = lane + 32 * i;
            v[slot][i] = j < M && k < K ? w[(size_t)j * K + k] : 0.f;
        }
        b[slot] = j < M ? bias[j] : 0.f;
    }

    __device__ __forceinline__ void start(const float* __restrict__ w,
                                          const float* __restrict__ bias) {
#pragma unroll
        for (int s = 0; s < DEPTH; s++) load(w, bias, s, threadIdx.x / 32 + s * WARPS);
    }
};

// out[r][j] (r < ROWS) = sum_k x[r][k] * w[j][k] + bias[j] for j < M, warp by warp from a
// started ring of w; ``relu`` cuts at zero. The result goes to dst[r * M + j] (shared) and, for
// rows below B, to global[r0 + r].
template <int K, int M, bool RELU>
__device__ __forceinline__ void rows_times_wt(WeightRing<K, M>& ring, const float* x,
                                              const float* __restrict__ w,
                                              const float* __restrict__ bias, float* dst,
                                              float* __restrict__ global, int r0, int B) {
    constexpr int DEPTH = WeightRing<K, M>::DEPTH;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (int j0 = warp; j0 < M; j0 += DEPTH * WARPS) {
#pragma unroll
        for (int slot = 0; slot < DEPTH; slot++) {
            const int j = j0 + slot * WARPS;
            if (j >= M) break;
            for (int r = 0; r < ROWS; r++) {
                float s = 0.f;
#pragma unroll
                for (int i = 0; i < LANES(K); i++) {
                    const int k = lane + 32 * i;
                    if (k < K) s = fmaf(ring.v[slot][i], x[r * K + k], s);
                }
                s = lane_sum(s) + ring.b[slot];
                if (RELU) s = fmaxf(s, 0.f);
                if (lane == 0) {
                    if (dst) dst[r * M + j] = s;
                    if (r0 + r < B) global[(size_t)(r0 + r) * M + j] = s;
                }
            }
            ring.load(w, bias, slot, j + DEPTH * WARPS);
        }
    }
}

// The forward of the block's rows: hidden (shared and global) and logits (global, and to lg in
// shared memory unless null). x and hid: the first ROWS * (D_IN + FRD_HIDDEN) floats of smem.
__device__ __forceinline__ void forward_rows(const float* __restrict__ h_t,
                                             const float* __restrict__ w1,
                                             const float* __restrict__ b1,
                                             const float* __restrict__ w2,
                                             const float* __restrict__ b2,
                                             float* __restrict__ hidden,
                                             float* __restrict__ logits, float* lg, int r0, int B)
{
    float* x = smem;                   // [ROWS][D_IN]
    float* hid = smem + ROWS * D_IN;   // [ROWS][FRD_HIDDEN]
    // both layers' first weight rows are requested before any arithmetic: w2's do not wait
    // for the hidden layer
    WeightRing<D_IN, FRD_HIDDEN> ring1;
    WeightRing<FRD_HIDDEN, HA> ring2;
    ring1.start(w1, b1);
    ring2.start(w2, b2);
    load_rows<D_IN>(x, h_t, r0, B);
    __syncthreads();
    rows_times_wt<D_IN, FRD_HIDDEN, true>(ring1, x, w1, b1, hid, hidden, r0, B);
    __syncthreads();
    rows_times_wt<FRD_HIDDEN, HA, false>(ring2, hid, w2, b2, lg, logits, r0, B);
}

// hidden[B, F] = ReLU(h_t w1^T + b1), logits[B, HA] = hidden w2^T + b2; grid: ceil(B / ROWS)
extern "C" __global__ void __launch_bounds__(THREADS)
frdsmall_forward(const float* __restrict__ h_t, const float* __restrict__ w1,
                 const float* __restrict__ b1, const float* __restrict__ w2,
                 const float* __restrict__ b2, float* __restrict__ hidden,
                 float* __restrict__ logits, const int B)
{
    pdl_enter();
    forward_rows(h_t, w1, b1, w2, b2, hidden, logits, nullptr, blockIdx.x * ROWS, B);
}

// max over lanes (exact in any order)
__device__ __forceinline__ float lane_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// The forward and the FRD loss's gradient in one launch, grid ceil(B / ROWS): the forward (its
// logits also kept in shared memory), then per (row, horizon), a warp each, frd.cu's
// softmax-CE: p = softmax(logits), ce = -log(max(p[label], 1e-30)), grad_logits = (p - onehot)
// * inv_b; label -1: zero row and loss; a label outside [-1, N_ATOMS): NaN.
extern "C" __global__ void __launch_bounds__(THREADS)
frdsmall_forward_loss(const float* __restrict__ h_t, const float* __restrict__ w1,
                      const float* __restrict__ b1, const float* __restrict__ w2,
                      const float* __restrict__ b2, const int* __restrict__ labels,
                      float* __restrict__ hidden, float* __restrict__ logits,
                      float* __restrict__ grad_logits, float* __restrict__ ce, const int B,
                      const float inv_b)
{
    pdl_enter();
    float* lg = smem + ROWS * (D_IN + FRD_HIDDEN);  // [ROWS][HA]
    const int r0 = blockIdx.x * ROWS;
    forward_rows(h_t, w1, b1, w2, b2, hidden, logits, lg, r0, B);
    __syncthreads();
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (int q = warp; q < ROWS * N_HORIZONS && r0 + q / N_HORIZONS < B; q += WARPS) {
        const size_t at = (size_t)r0 * N_HORIZONS + q;  // q = r * N_HORIZONS + h
        const float* z = lg + q * N_ATOMS;
        const int label = labels[at];
        const bool bad = label < -1 || label >= N_ATOMS;
        float e[LANES(N_ATOMS)];
        float mx = -INFINITY;
#pragma unroll
        for (int i = 0; i < LANES(N_ATOMS); i++) {
            const int a = lane + 32 * i;
            e[i] = a < N_ATOMS ? z[a] : -INFINITY;
            mx = fmaxf(mx, e[i]);
        }
        mx = lane_max(mx);
        float sum = 0.f;
#pragma unroll
        for (int i = 0; i < LANES(N_ATOMS); i++) {
            const int a = lane + 32 * i;
            e[i] = a < N_ATOMS ? expf(e[i] - mx) : 0.f;
            sum += e[i];
        }
        sum = __shfl_sync(0xffffffffu, lane_sum(sum), 0);  // lane 0's sum on every lane
        float* g = grad_logits + at * N_ATOMS;
#pragma unroll
        for (int i = 0; i < LANES(N_ATOMS); i++) {
            const int a = lane + 32 * i;
            if (a >= N_ATOMS) continue;
            const float p = e[i] / sum;
            g[a] = label == -1 ? 0.f : bad ? NAN : (p - (a == label ? 1.f : 0.f)) * inv_b;
            if (a == label) ce[at] = -logf(fmaxf(p, 1e-30f));
        }
        if (lane == 0 && (label == -1 || bad)) ce[at] = label == -1 ? 0.f : NAN;
    }
}

// The weight part: out[e] for e < M * N is sum_b a(b, e / N) * x[b, e % N], for e < M * N + M
// the bias sum_b a(b, e - M * N). Block: PER_BLOCK consecutive e; warp s of each group sums the
// rows [s * span, s * span + span), and the group's partials are added in s order.
template <int M, int N, class A>
__device__ __forceinline__ void weight_part(A a, const float* __restrict__ x,
                                            float* __restrict__ out, int block, int B) {
    float* partial = smem;  // [WARPS][32]
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int group = warp / SPLIT, s = warp % SPLIT;
    const int e = block * PER_BLOCK + group * 32 + lane;
    const int span = (B + SPLIT - 1) / SPLIT, b1 = min(B, (s + 1) * span);
    float acc = 0.f;
    if (e < M * N) {
        const int m = e / N, n = e % N;
        for (int b = s * span; b < b1; b++) acc = fmaf(a(b, m), x[(size_t)b * N + n], acc);
    } else if (e < M * N + M) {
        for (int b = s * span; b < b1; b++) acc += a(b, e - M * N);
    }
    partial[warp * 32 + lane] = acc;
    __syncthreads();
    if (s == 0 && e < M * N + M) {
        float sum = partial[warp * 32 + lane];
        for (int t = 1; t < SPLIT; t++) sum += partial[(warp + t) * 32 + lane];
        out[e] = sum;
    }
}

// The row part: out[r0 + r, n] = sum_m p[r][m] * w[m, n] (m ascending), for ROWS rows whose
// p[ROWS][M] is already in shared memory.
template <int M, int N>
__device__ __forceinline__ void row_part(const float* p, const float* __restrict__ w,
                                         float* __restrict__ out, int r0, int B) {
    for (int i = threadIdx.x; i < ROWS * N; i += THREADS) {
        const int r = i / N, n = i % N;
        if (r0 + r >= B) break;
        float acc = 0.f;
        for (int m = 0; m < M; m++) acc = fmaf(p[r * M + m], w[(size_t)m * N + n], acc);
        out[(size_t)(r0 + r) * N + n] = acc;
    }
}

// blocks of the weight part, then ceil(B / ROWS) of the row part
#define WEIGHT_BLOCKS(M, N) (((M) * (N) + (M) + PER_BLOCK - 1) / PER_BLOCK)

// F.3b: grads = [dW2 = G^T hidden | db2 = sum_b G], dhidden = G w2 (G = grad_logits [B, HA])
extern "C" __global__ void __launch_bounds__(THREADS)
frdsmall_grad_w2(const float* __restrict__ hidden, const float* __restrict__ w2,
                 const float* __restrict__ grad_logits, float* __restrict__ grads,
                 float* __restrict__ dhidden, const int B)
{
    pdl_enter();
    const int blocks = WEIGHT_BLOCKS(HA, FRD_HIDDEN);
    if ((int)blockIdx.x < blocks) {
        weight_part<HA, FRD_HIDDEN>(
            [=](int b, int m) { return grad_logits[(size_t)b * HA + m]; }, hidden, grads,
            blockIdx.x, B);
        return;
    }
    const int r0 = (blockIdx.x - blocks) * ROWS;
    load_rows<HA>(smem, grad_logits, r0, B);
    __syncthreads();
    row_part<HA, FRD_HIDDEN>(smem, w2, dhidden, r0, B);
}

// F.3c, dpre = dhidden where hidden > 0, else 0: grads = [dW1 = dpre^T h_t | db1 = sum_b dpre],
// grad_h_t = dpre w1
extern "C" __global__ void __launch_bounds__(THREADS)
frdsmall_grad_w1(const float* __restrict__ h_t, const float* __restrict__ w1,
                 const float* __restrict__ hidden, const float* __restrict__ dhidden,
                 float* __restrict__ grads, float* __restrict__ grad_h_t, const int B)
{
    pdl_enter();
    const int blocks = WEIGHT_BLOCKS(FRD_HIDDEN, D_IN);
    if ((int)blockIdx.x < blocks) {
        weight_part<FRD_HIDDEN, D_IN>(
            [=](int b, int m) {
                const size_t i = (size_t)b * FRD_HIDDEN + m;
                return hidden[i] > 0.f ? dhidden[i] : 0.f;
            }, h_t, grads, blockIdx.x, B);
        return;
    }
    const int r0 = (blockIdx.x - blocks) * ROWS;
    float* p = smem;  // [ROWS][FRD_HIDDEN] of dpre
    for (int i = threadIdx.x; i < ROWS * FRD_HIDDEN; i += THREADS) {
        const int r = r0 + i / FRD_HIDDEN;
        const size_t at = (size_t)r * FRD_HIDDEN + i % FRD_HIDDEN;
        p[i] = r < B && hidden[at] > 0.f ? dhidden[at] : 0.f;
    }
    __syncthreads();
    row_part<FRD_HIDDEN, D_IN>(p, w1, grad_h_t, r0, B);
}
