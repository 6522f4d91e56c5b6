// FRD head: a two-layer MLP from h_t[B, D_IN] to N_HORIZONS x N_ATOMS logits, and its backward
// in two stages (the softmax-CE gradient between them is frd.cu's):
//   forward   hidden[B,F] = ReLU(h_t w1^T + b1), logits[B,HA] = hidden w2^T + b2
//   forward_loss  the forward, then frd.cu's softmax-CE and its gradient over each row's atoms
//             per horizon, from the logits tile the block keeps in shared memory (one launch,
//             and the logits are not read back from global memory)
//   grad_w2   (F.3b) dW2 = G^T hidden, db2 = sum_b G, dhidden = G w2        (G = grad_logits)
//   grad_w1   (F.3c) dpre = dhidden * [hidden > 0], dW1 = dpre^T h_t, db1 = sum_b dpre,
//             dh_t = dpre w1
//   backward  both stages in turn (under WGMMA 2 their row products in one launch)
// w1 is [F, D_IN], w2 is [HA, F] (HA = N_HORIZONS * N_ATOMS), all row-major. hidden > 0 is the
// same mask as pre > 0, so the forward keeps no pre-activation.
//
// Products run on the tensor cores as 3xTF32 (mma.sync m16n8k8, float32 accumulators): each
// operand x is split into big (x cut to tf32) and small = x - big, and a*b is accumulated as
// a_small*b_big + a_big*b_small + a_big*b_big. The dropped a_small*b_small term is about 2^-20
// of the product, so the result has float32 accuracy at a fraction of the SIMT FMA cost. Every
// sum has a fixed order (the mma shape, then k ascending), so results are bitwise reproducible.
//
// A block owns CHUNK consecutive rows. It copies the weights its products need to shared memory
// once, then takes its rows in tiles of BM, the next tile's copy (cp.async) in flight while the
// current one is multiplied. Weight gradients accumulate in registers over the whole chunk and
// land in the block's scratch row (weights, then biases); the host adds the rows with one
// reduce_axis0. No atomics; one writer per element.
// Template constants: D_IN, FRD_HIDDEN, N_HORIZONS, N_ATOMS; knobs BM (rows per tile: 16, 32, 64),
// CHUNK (rows per block, a multiple of BM); WGMMA (1: frdhead_wgmma.cuh's entries for the
// forward roles, frdhead_wgmma_bwd.cuh's for the backward, with their own knobs; 2:
// frdhead_f16.cuh's, both forward layers in one launch on FP16 pieces, and frdhead_f16_bwd.cuh's,
// both backward row products in one launch).
#include "heads_common.cuh"

// One block of 8 warps per SM: the weights and two tiles fill most of shared memory, and the
// bound lets ptxas give each thread the registers of its accumulators.
#define THREADS 256
#define HA (N_HORIZONS * N_ATOMS)
#define ROUNDUP(n, m) ((((n) + (m) - 1) / (m)) * (m))
#define IMAX(a, b) ((a) > (b) ? (a) : (b))
// Row tiles (BM rows x n columns): BM/16 warps down the rows (one m16 tile each), the others
// across the columns, covering ROW_EXT(n) columns.
#define ROW_WM (BM / 16)
#define ROW_WN (8 / ROW_WM)
#define ROW_EXT(n) ROUNDUP(n, 8 * ROW_WN)
// Weight tiles (m x n, summed over rows): 2 x 4 warps, each m16 x n8 tiles up to ROUNDUP(_, 32).
#define W_EXT(n) ROUNDUP(n, 32)
// Row strides. Fragment k = t + 4e sits at column 2t + e (see pair). An array read with k down
// its rows ("k-major": lanes (g, t) read 2t*LD + g) has distinct banks when LD % 16 == 4; one
// read along its rows in 8-byte pairs (g*LD + 2t, half a warp at a time) when LD % 32 == 8.
#define LD_KMAJOR(n) (W_EXT(n) + 4)
#define LD_ROWS(n) (W_EXT(n) + 8)

__device__ __forceinline__ unsigned smem_address(const void* p) {
    return (unsigned)__cvta_generic_to_shared(p);
}

// Asynchronous copies; a copy with valid == false writes zeros and reads nothing.
__device__ __forceinline__ void copy4(float* dst, const float* src, bool valid) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_address(dst)),
                 "l"(src), "r"(valid ? 4 : 0) : "memory");
}
__device__ __forceinline__ void copy16(float* dst, const float* src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_address(dst)),
                 "l"(src), "r"(valid ? 16 : 0) : "memory");
}
__device__ __forceinline__ void commit_copies() {
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int PENDING>
__device__ __forceinline__ void wait_copies() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(PENDING) : "memory");
}

// dst[r * LD + c] = src[r * COLS + c] for r < ROWS, c < WIDTH (a multiple of 8), zero where
// r >= n_rows or c >= COLS. 16-byte copies when the rows allow, else 4-byte ones.
template <int ROWS, int WIDTH, int LD, int COLS>
__device__ __forceinline__ void stage(float* dst, const float* __restrict__ src, int n_rows) {
    if (COLS % 4 == 0 && ((size_t)src & 15) == 0) {
        constexpr int G = WIDTH / 4;
        for (int e = threadIdx.x; e < ROWS * G; e += THREADS) {
            const int r = e / G, c = (e % G) * 4;
            const bool ok = r < n_rows && c < COLS;
            copy16(dst + r * LD + c, ok ? src + (size_t)r * COLS + c : src, ok);
        }
    } else {
        for (int e = threadIdx.x; e < ROWS * WIDTH; e += THREADS) {
            const int r = e / WIDTH, c = e % WIDTH;
            const bool ok = r < n_rows && c < COLS;
            copy4(dst + r * LD + c, ok ? src + (size_t)r * COLS + c : src, ok);
        }
    }
}

// big keeps x's top 10 mantissa bits (a truncation, one instruction); small = x - big is exact,
// and the mma reads its top bits as tf32.
__device__ __forceinline__ void split(float x, unsigned& big, unsigned& small) {
    big = __float_as_uint(x) & 0xffffe000u;
    small = __float_as_uint(x - __uint_as_float(big));
}

__device__ __forceinline__ void mma(float (&c)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Elements (i, k) and (i, k + 1) of an operand in shared memory, i its row (A) or column (B):
// s[k * LD + i] when k runs down the array ("k-major"), else s[i * LD + k], one 8-byte load.
template <bool K_MAJOR, int LD>
__device__ __forceinline__ float2 pair(const float* s, int i, int k) {
    if (K_MAJOR) return make_float2(s[k * LD + i], s[(k + 1) * LD + i]);
    return *reinterpret_cast<const float2*>(s + i * LD + k);
}

// acc[i][j] (the m16 x n8 tile at rows 16 i, columns 8 j of the warp's block) += sum over
// k < 8 KSTEPS of A(m, k) B(k, n), k ascending; a and b point at the warp's first row/column.
template <int MT, int NT, int KSTEPS, bool KA, int LDA_, bool KB, int LDB_>
__device__ __forceinline__ void warp_gemm(float (&acc)[MT][NT][4], const float* a,
                                          const float* b) {
    const int g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
#pragma unroll
    for (int k0 = 0; k0 < 8 * KSTEPS; k0 += 8) {
        // fragment k = t + 4e is column k0 + 2t + e, for A and B alike (a permutation of the
        // k-step's sum, the same every time)
        unsigned a_big[MT][4], a_small[MT][4], b_big[NT][2], b_small[NT][2];
#pragma unroll
        for (int i = 0; i < MT; ++i)
#pragma unroll
            for (int h = 0; h < 2; ++h) {  // rows g and g + 8: registers h and h + 2
                const float2 v = pair<KA, LDA_>(a, 16 * i + g + 8 * h, k0 + 2 * t);
                split(v.x, a_big[i][h], a_small[i][h]);
                split(v.y, a_big[i][h + 2], a_small[i][h + 2]);
            }
#pragma unroll
        for (int j = 0; j < NT; ++j) {
            const float2 v = pair<KB, LDB_>(b, 8 * j + g, k0 + 2 * t);
            split(v.x, b_big[j][0], b_small[j][0]);
            split(v.y, b_big[j][1], b_small[j][1]);
        }
        // the three products of a tile are issued apart, so consecutive mmas are independent
#pragma unroll
        for (int i = 0; i < MT; ++i)
#pragma unroll
            for (int j = 0; j < NT; ++j) mma(acc[i][j], a_small[i], b_big[j]);
#pragma unroll
        for (int i = 0; i < MT; ++i)
#pragma unroll
            for (int j = 0; j < NT; ++j) mma(acc[i][j], a_big[i], b_small[j]);
#pragma unroll
        for (int i = 0; i < MT; ++i)
#pragma unroll
            for (int j = 0; j < NT; ++j) mma(acc[i][j], a_big[i], b_big[j]);
    }
}

template <int MT, int NT>
__device__ __forceinline__ void zero(float (&acc)[MT][NT][4]) {
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;
}

// f(m, n, value) for every accumulator, m and n relative to the warp's first row and column.
template <int MT, int NT, class F>
__device__ __forceinline__ void for_each(float (&acc)[MT][NT][4], F f) {
    const int g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) f(16 * i + g + 8 * (e / 2), 8 * j + 2 * t + e % 2, acc[i][j][e]);
}

// The dynamic shared memory of every entry, declared once: two declarations, one in an extern "C"
// entry and one in a template, would have different linkage (nvcc warning 1556).
extern __shared__ float4 dynamic_smem[];

// softmax-CE of one (row, horizon) of the logits tile, z[N_ATOMS], overwritten in place by its
// gradient: p = softmax(z), grad_logits = (p - onehot) * inv_b; returns ce = -log(max(p[label],
// 1e-30)). Label -1: zero row and loss; a label outside [-1, N_ATOMS): NaN. One thread a row,
// atoms ascending.
__device__ __forceinline__ float softmax_ce_row(float* z, int label, float inv_b) {
    float e[N_ATOMS], mx = -INFINITY, sum = 0.f, p_label = 0.f;
#pragma unroll
    for (int a = 0; a < N_ATOMS; ++a) {
        e[a] = z[a];
        mx = fmaxf(mx, e[a]);
    }
#pragma unroll
    for (int a = 0; a < N_ATOMS; ++a) {
        e[a] = expf(e[a] - mx);
        sum += e[a];
    }
    const float inv_sum = 1.f / sum;
    const bool bad = label < -1 || label >= N_ATOMS;
#pragma unroll
    for (int a = 0; a < N_ATOMS; ++a) {
        const float p = e[a] * inv_sum;
        if (a == label) p_label = p;
        z[a] = label == -1 ? 0.f : bad ? NAN : (p - (a == label ? 1.f : 0.f)) * inv_b;
    }
    return label == -1 ? 0.f : bad ? NAN : -logf(fmaxf(p_label, 1e-30f));
}

// Hopper's warpgroup MMA (sm_90a), entries frdhead_wg_*: the forward roles' engine (its knobs
// WG, CS, SWZ) or the backward's (WG, CS, BK, OCC, STAGES); under WGMMA 2 frdhead_f16_*, the
// forward roles' (WG, SWZ) or the backward's row products (WG) beside frdhead_wg_*'s weight
// gradients. The FP16 header comes before the split: a header is inlined where it is first
// included, and each module keeps one side.
#if WGMMA
#include "wgmma.cuh"
#if WGMMA == 2
#include "wgmma_f16.cuh"
#endif
#ifdef SWZ
#include "frdhead_wgmma.cuh"
#if WGMMA == 2
#include "frdhead_f16.cuh"
#endif
#else
#include "frdhead_wgmma_bwd.cuh"
#if WGMMA == 2
#include "frdhead_f16_bwd.cuh"
#endif
#endif
#endif

// Forward. Dynamic shared memory (the Python launch computes the same): w1s[ROW_EXT(FRD_HIDDEN)][LDK1],
// w2s[ROW_EXT(HA)][LDK2], two h_t tiles [BM][LDK1], the hidden tile [BM][LDK2]; with the loss,
// the logits tile [BM][HA].
#define LDK1 LD_ROWS(D_IN)
#define LDK2 LD_ROWS(FRD_HIDDEN)
template <bool LOSS>
__device__ __forceinline__ void forward_tiles(const float* __restrict__ h_t,
                                              const float* __restrict__ w1,
                                              const float* __restrict__ b1,
                                              const float* __restrict__ w2,
                                              const float* __restrict__ b2,
                                              const int* __restrict__ labels,
                                              float* __restrict__ hidden,
                                              float* __restrict__ logits,
                                              float* __restrict__ grad_logits,
                                              float* __restrict__ ce, const int B,
                                              const float inv_b)
{
    constexpr int EXT1 = ROW_EXT(FRD_HIDDEN), EXT2 = ROW_EXT(HA);
    constexpr int NT1 = EXT1 / (8 * ROW_WN), NT2 = EXT2 / (8 * ROW_WN);
    float* w1s = reinterpret_cast<float*>(dynamic_smem);
    float* w2s = w1s + EXT1 * LDK1;
    float* xs = w2s + EXT2 * LDK2;
    float* hs = xs + 2 * BM * LDK1;
    float* ls = hs + BM * LDK2;
    const int r0 = blockIdx.x * CHUNK, r1 = min(B, r0 + CHUNK);
    const int warp = threadIdx.x / 32, wm = warp % ROW_WM, wn = warp / ROW_WM;

    stage<EXT1, ROUNDUP(D_IN, 8), LDK1, D_IN>(w1s, w1, FRD_HIDDEN);
    stage<EXT2, ROUNDUP(FRD_HIDDEN, 8), LDK2, FRD_HIDDEN>(w2s, w2, HA);
    stage<BM, ROUNDUP(D_IN, 8), LDK1, D_IN>(xs, h_t + (size_t)r0 * D_IN, min(BM, r1 - r0));
    commit_copies();
    int buf = 0;
    for (int m0 = r0; m0 < r1; m0 += BM, buf ^= 1) {
        if (m0 + BM < r1) {
            stage<BM, ROUNDUP(D_IN, 8), LDK1, D_IN>(xs + (buf ^ 1) * BM * LDK1,
                                                   h_t + (size_t)(m0 + BM) * D_IN,
                                                   min(BM, r1 - m0 - BM));
            commit_copies();
            wait_copies<1>();
        } else {
            wait_copies<0>();
        }
        __syncthreads();
        const int n_rows = min(BM, r1 - m0);
        {
            float acc[1][NT1][4];
            zero(acc);
            warp_gemm<1, NT1, ROUNDUP(D_IN, 8) / 8, false, LDK1, false, LDK1>(
                acc, xs + buf * BM * LDK1 + wm * 16 * LDK1, w1s + wn * NT1 * 8 * LDK1);
            // hidden columns past FRD_HIDDEN stay 0: layer 2 reads them up to ROUNDUP(FRD_HIDDEN, 8)
            for_each(acc, [&](int m, int n, float v) {
                m += wm * 16;
                n += wn * NT1 * 8;
                v = n < FRD_HIDDEN ? fmaxf(v + b1[n], 0.f) : 0.f;
                if (n < ROUNDUP(FRD_HIDDEN, 8)) hs[m * LDK2 + n] = v;
                if (m < n_rows && n < FRD_HIDDEN) hidden[(size_t)(m0 + m) * FRD_HIDDEN + n] = v;
            });
        }
        __syncthreads();
        {
            float acc[1][NT2][4];
            zero(acc);
            warp_gemm<1, NT2, ROUNDUP(FRD_HIDDEN, 8) / 8, false, LDK2, false, LDK2>(
                acc, hs + wm * 16 * LDK2, w2s + wn * NT2 * 8 * LDK2);
            for_each(acc, [&](int m, int n, float v) {
                m += wm * 16;
                n += wn * NT2 * 8;
                if (m < n_rows && n < HA) {
                    logits[(size_t)(m0 + m) * HA + n] = v + b2[n];
                    if (LOSS) ls[m * HA + n] = v + b2[n];
                }
            });
        }
        __syncthreads();  // this tile's buffer and hs are rewritten next; ls is complete
        if (LOSS) {  // ls is rewritten after the next tile's two barriers
            for (int q = threadIdx.x; q < n_rows * N_HORIZONS; q += THREADS) {
                const size_t at = (size_t)m0 * N_HORIZONS + q;  // q = row * N_HORIZONS + horizon
                ce[at] = softmax_ce_row(ls + q * N_ATOMS, labels[at], inv_b);
            }
            __syncthreads();
            // the tile's gradient rows are contiguous in grad_logits: coalesced stores
            for (int e = threadIdx.x; e < n_rows * HA; e += THREADS)
                grad_logits[(size_t)m0 * HA + e] = ls[e];
        }
    }
}

extern "C" __global__ void __launch_bounds__(THREADS, 1)
frdhead_forward(const float* __restrict__ h_t, const float* __restrict__ w1,
                const float* __restrict__ b1, const float* __restrict__ w2,
                const float* __restrict__ b2, float* __restrict__ hidden,
                float* __restrict__ logits, const int B)
{
    forward_tiles<false>(h_t, w1, b1, w2, b2, nullptr, hidden, logits, nullptr, nullptr, B, 0.f);
}

extern "C" __global__ void __launch_bounds__(THREADS, 1)
frdhead_forward_loss(const float* __restrict__ h_t, const float* __restrict__ w1,
                     const float* __restrict__ b1, const float* __restrict__ w2,
                     const float* __restrict__ b2, const int* __restrict__ labels,
                     float* __restrict__ hidden, float* __restrict__ logits,
                     float* __restrict__ grad_logits, float* __restrict__ ce, const int B,
                     const float inv_b)
{
    forward_tiles<true>(h_t, w1, b1, w2, b2, labels, hidden, logits, grad_logits, ce, B, inv_b);
}

// One backward stage over the block's CHUNK rows of A[B][M] (zeroed where mask <= 0): the
// weight and bias partials sum_r A[r]^T X[r] and sum_r A[r] into scratch[blockIdx.x] (M*N
// values, then M), and out[r] = A[r] W for its rows (W is [M][N]).
// Dynamic shared memory (the Python launch computes the same): ws[ROUNDUP(M, 8)][LDW], two A
// tiles [BM][LD_KMAJOR(M)], two X tiles [BM][LD_KMAJOR(N)], with a mask two mask tiles like A.
template <int M, int N, bool MASKED>
__device__ __forceinline__ void backward_stage(const float* __restrict__ a,
                                               const float* __restrict__ x,
                                               const float* __restrict__ w,
                                               const float* __restrict__ mask,
                                               float* __restrict__ scratch,
                                               float* __restrict__ out, int B) {
    constexpr int LDA_ = LD_KMAJOR(M), LDX = LD_KMAJOR(N), KM = ROUNDUP(M, 8);
    constexpr int EXTO = ROW_EXT(N), LDW = LD_KMAJOR(EXTO), NTO = EXTO / (8 * ROW_WN);
    constexpr int MTW = W_EXT(M) / 32, NTW = W_EXT(N) / 32, BIAS = (M + THREADS - 1) / THREADS;
    float* ws = reinterpret_cast<float*>(dynamic_smem);
    float* as = ws + KM * LDW;
    float* xs = as + 2 * BM * LDA_;
    float* ms = xs + 2 * BM * LDX;
    const int r0 = blockIdx.x * CHUNK, r1 = min(B, r0 + CHUNK);
    const int warp = threadIdx.x / 32;
    const int wm = warp % 2, wn = warp / 2;            // weight tile
    const int om = warp % ROW_WM, on = warp / ROW_WM;  // out rows

    // the tile of rows [m0, m0 + BM) into buffer slot
    auto copy_tile = [&](int m0, int slot) {
        const int n = min(BM, r1 - m0);
        stage<BM, W_EXT(M), LDA_, M>(as + slot * BM * LDA_, a + (size_t)m0 * M, n);
        stage<BM, W_EXT(N), LDX, N>(xs + slot * BM * LDX, x + (size_t)m0 * N, n);
        if (MASKED) stage<BM, W_EXT(M), LDA_, M>(ms + slot * BM * LDA_, mask + (size_t)m0 * M, n);
        commit_copies();
    };
    stage<KM, EXTO, LDW, N>(ws, w, M);  // joins the first tile's group
    copy_tile(r0, 0);
    float accw[MTW][NTW][4];
    zero(accw);
    float bias[BIAS];
#pragma unroll
    for (int u = 0; u < BIAS; ++u) bias[u] = 0.f;
    int buf = 0;
    for (int m0 = r0; m0 < r1; m0 += BM, buf ^= 1) {
        if (m0 + BM < r1) {
            copy_tile(m0 + BM, buf ^ 1);
            wait_copies<1>();
        } else {
            wait_copies<0>();
        }
        __syncthreads();
        float* at = as + buf * BM * LDA_;
        if (MASKED) {
            const float* mt = ms + buf * BM * LDA_;
            for (int e = threadIdx.x; e < BM * W_EXT(M); e += THREADS) {
                const int i = e / W_EXT(M) * LDA_ + e % W_EXT(M);
                if (!(mt[i] > 0.f)) at[i] = 0.f;
            }
            __syncthreads();
        }
        // bias partials: column sums, rows ascending
#pragma unroll
        for (int u = 0; u < BIAS; ++u) {
            const int m = threadIdx.x + u * THREADS;
            if (m < M)
                for (int r = 0; r < BM; ++r) bias[u] += at[r * LDA_ + m];
        }
        // weight partials: the tile's rows are the k of A^T X
        warp_gemm<MTW, NTW, BM / 8, true, LDA_, true, LDX>(
            accw, at + wm * MTW * 16, xs + buf * BM * LDX + wn * NTW * 8);
        {
            float acc[1][NTO][4];
            zero(acc);
            warp_gemm<1, NTO, KM / 8, false, LDA_, true, LDW>(acc, at + om * 16 * LDA_,
                                                             ws + on * NTO * 8);
            const int n_rows = min(BM, r1 - m0);
            for_each(acc, [&](int m, int n, float v) {
                m += om * 16;
                n += on * NTO * 8;
                if (m < n_rows && n < N) out[(size_t)(m0 + m) * N + n] = v;
            });
        }
        __syncthreads();  // this tile's buffers are rewritten next
    }
    float* part = scratch + (size_t)blockIdx.x * (M * N + M);
    for_each(accw, [&](int m, int n, float v) {
        m += wm * MTW * 16;
        n += wn * NTW * 8;
        if (m < M && n < N) part[m * N + n] = v;
    });
#pragma unroll
    for (int u = 0; u < BIAS; ++u) {
        const int m = threadIdx.x + u * THREADS;
        if (m < M) part[M * N + m] = bias[u];
    }
}

// F.3b: dW2/db2 partials and dhidden = G w2.
extern "C" __global__ void __launch_bounds__(THREADS, 1)
frdhead_grad_w2(const float* __restrict__ hidden, const float* __restrict__ w2,
                const float* __restrict__ grad_logits, float* __restrict__ scratch,
                float* __restrict__ dhidden, const int B)
{
    backward_stage<HA, FRD_HIDDEN, false>(grad_logits, hidden, w2, nullptr, scratch, dhidden, B);
}

// F.3c: dW1/db1 partials and dh_t = dpre w1; the ReLU mask is applied to each staged tile.
extern "C" __global__ void __launch_bounds__(THREADS, 1)
frdhead_grad_w1(const float* __restrict__ h_t, const float* __restrict__ w1,
                const float* __restrict__ hidden, const float* __restrict__ dhidden,
                float* __restrict__ scratch, float* __restrict__ grad_h_t, const int B)
{
    backward_stage<FRD_HIDDEN, D_IN, true>(dhidden, h_t, w1, hidden, scratch, grad_h_t, B);
}
