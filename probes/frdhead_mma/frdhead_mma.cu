// Prototype FRD-head kernels (issue 32), outside the library: probes/frdhead_mma/run.py compiles
// one entry per variant with its knobs as -D options and checks it against the float64 reference.
//   frdmma_forward   hidden = ReLU(h_t w1^T + b1), logits = hidden w2^T + b2; with FUSED the
//                    softmax-CE (label -1 = sentinel) runs on the logits tile in shared memory and
//                    the kernel writes grad_logits = (softmax - onehot) / B and ce, never logits
//   frdmma_backward  one backward stage (STAGE 2: F.3b grad_w2, STAGE 1: F.3c grad_w1): weight and
//                    bias partials per block into scratch, out = A W per row
//   frdmma_reduce    scratch column sums, rows in a fixed order
// Products are 3xTF32 mma.sync m16n8k8 (a*b ~ a_small*b_big + a_big*b_small + a_big*b_big, f32
// accumulators): float32 accuracy, fixed summation order, no atomics, one writer per element.
// Template constants: D_IN, FRD_HIDDEN, N_HORIZONS, N_ATOMS.
// Forward knobs: FWD_WARPS (warps per block), FWD_BM (rows per tile), FWD_WM1 / FWD_WM2 (warps
// down the rows in layer 1 / layer 2), FUSED (0/1).
// Backward knobs: STAGE, BWD_WARPS, BWD_BM, BWD_WMW (warps down M of the weight tile), BWD_WMO
// (warps down the rows of the out tile).
// Rows per block (chunk) is a run-time argument, a multiple of the tile's BM.

#define HA (N_HORIZONS * N_ATOMS)
#define RUP(n, m) ((((n) + (m) - 1) / (m)) * (m))
#define CDIV(n, m) (((n) + (m) - 1) / (m))
#define MAXI(a, b) ((a) > (b) ? (a) : (b))
// Row strides. Arrays read along their rows in 8-byte pairs (lanes g, t at g*LD + 2t): LD % 32 == 8
// spreads a half warp over all banks. Arrays read with k down the rows (2t*LD + g): LD % 16 == 4.
#define LDR(n) (RUP(n, 32) + 8)
#define LDK(n) (RUP(n, 32) + 4)

__device__ __forceinline__ unsigned smem_u32(const void* p) {
    return (unsigned)__cvta_generic_to_shared(p);
}

// cp.async with a source size of 0 writes zeros: the padding of every staged array is zero.
__device__ __forceinline__ void cp4(float* dst, const float* src, bool ok) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_u32(dst)), "l"(src),
                 "r"(ok ? 4 : 0) : "memory");
}
__device__ __forceinline__ void cp16(float* dst, const float* src, bool ok) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)), "l"(src),
                 "r"(ok ? 16 : 0) : "memory");
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

// dst[r*LD + c] = src[r*COLS + c] for r < n_rows, c < COLS; zero elsewhere up to ROWS x WIDTH.
template <int ROWS, int WIDTH, int LD, int COLS, int NT>
__device__ __forceinline__ void stage(float* dst, const float* __restrict__ src, int n_rows) {
    static_assert(WIDTH % 4 == 0, "staged width is a multiple of 4");
    if (COLS % 4 == 0 && ((size_t)src & 15) == 0) {
        constexpr int G = WIDTH / 4;
        for (int e = threadIdx.x; e < ROWS * G; e += NT) {
            const int r = e / G, c = e % G * 4;
            const bool ok = r < n_rows && c < COLS;
            cp16(dst + r * LD + c, ok ? src + (size_t)r * COLS + c : src, ok);
        }
    } else {
        for (int e = threadIdx.x; e < ROWS * WIDTH; e += NT) {
            const int r = e / WIDTH, c = e % WIDTH;
            const bool ok = r < n_rows && c < COLS;
            cp4(dst + r * LD + c, ok ? src + (size_t)r * COLS + c : src, ok);
        }
    }
}

#include "../tf32_mma.cuh"

// n contiguous floats from shared to global, 16 bytes at a time when dst allows.
template <int NT>
__device__ __forceinline__ void store_span(float* __restrict__ dst, const float* src, int n) {
    if (((size_t)dst & 15) == 0) {
        for (int i = threadIdx.x; i < n / 4; i += NT)
            reinterpret_cast<float4*>(dst)[i] = reinterpret_cast<const float4*>(src)[i];
        for (int i = n / 4 * 4 + threadIdx.x; i < n; i += NT) dst[i] = src[i];
    } else {
        for (int i = threadIdx.x; i < n; i += NT) dst[i] = src[i];
    }
}

extern __shared__ float4 dyn_smem[];

#ifdef FWD_WARPS
#define FT (32 * FWD_WARPS)
#define WN1 (FWD_WARPS / FWD_WM1)
#define WN2 (FWD_WARPS / FWD_WM2)
#define MT1 (FWD_BM / (16 * FWD_WM1))
#define MT2 (FWD_BM / (16 * FWD_WM2))
#define K1 RUP(D_IN, 8)
#define K2 RUP(FRD_HIDDEN, 8)
#define EXT1 RUP(FRD_HIDDEN, 8 * WN1)
#define EXT2 RUP(HA, 8 * WN2)
#define NT1 (EXT1 / (8 * WN1))
#define NT2 (EXT2 / (8 * WN2))
#define LDX LDR(K1)
#define LDH LDR(K2)
// one tile buffer holds the h_t tile, then the hidden tile, then the logits tile (dense rows)
#define TILE (FWD_BM * MAXI(MAXI(LDX, LDH), HA))
// Shared floats; run.py computes the same: w1 [EXT1][LDX], w2 [EXT2][LDH], two tile buffers.
#define FWD_SMEM_FLOATS (EXT1 * LDX + EXT2 * LDH + 2 * TILE)

// One block per chunk of rows, tiles of FWD_BM rows; the next tile's copy is in flight while the
// current one is multiplied. The weights stay in shared memory for the whole chunk.
extern "C" __global__ void __launch_bounds__(FT, 1)
frdmma_forward(const float* __restrict__ h_t, const float* __restrict__ w1,
               const float* __restrict__ b1, const float* __restrict__ w2,
               const float* __restrict__ b2, const int* __restrict__ labels,
               float* __restrict__ hidden, float* __restrict__ out, float* __restrict__ ce,
               const int B, const int chunk, const float inv_b)
{
    static_assert(FWD_BM % (16 * FWD_WM1) == 0 && FWD_BM % (16 * FWD_WM2) == 0, "warps down rows");
    static_assert(FWD_WARPS % FWD_WM1 == 0 && FWD_WARPS % FWD_WM2 == 0, "warp grid");
    float* w1s = reinterpret_cast<float*>(dyn_smem);
    float* w2s = w1s + EXT1 * LDX;
    float* tiles = w2s + EXT2 * LDH;
    const int r0 = blockIdx.x * chunk, r1 = min(B, r0 + chunk);
    const int warp = threadIdx.x / 32;
    const int wm1 = warp % FWD_WM1, wn1 = warp / FWD_WM1;
    const int wm2 = warp % FWD_WM2, wn2 = warp / FWD_WM2;

    stage<EXT1, K1, LDX, D_IN, FT>(w1s, w1, FRD_HIDDEN);
    stage<EXT2, K2, LDH, FRD_HIDDEN, FT>(w2s, w2, HA);
    stage<FWD_BM, K1, LDX, D_IN, FT>(tiles, h_t + (size_t)r0 * D_IN, min(FWD_BM, r1 - r0));
    cp_commit();
    int buf = 0;
    for (int m0 = r0; m0 < r1; m0 += FWD_BM, buf ^= 1) {
        if (m0 + FWD_BM < r1) {
            stage<FWD_BM, K1, LDX, D_IN, FT>(tiles + (buf ^ 1) * TILE, h_t + (size_t)(m0 + FWD_BM) * D_IN,
                                            min(FWD_BM, r1 - m0 - FWD_BM));
            cp_commit();
            cp_wait<1>();
        } else {
            cp_wait<0>();
        }
        __syncthreads();
        float* tile = tiles + buf * TILE;
        const int n_rows = min(FWD_BM, r1 - m0);
        float acc1[MT1][NT1][4];
        zero_acc(acc1);
        warp_mma<MT1, NT1, K1 / 8, false, LDX, false, LDX>(acc1, tile + wm1 * MT1 * 16 * LDX,
                                                          w1s + wn1 * NT1 * 8 * LDX);
        __syncthreads();  // the h_t tile is overwritten by the hidden tile
        each_acc(acc1, [&](int m, int n, float v) {
            m += wm1 * MT1 * 16;
            n += wn1 * NT1 * 8;
            // columns F..K2 are layer 2's zero k padding
            if (n < K2) tile[m * LDH + n] = n < FRD_HIDDEN ? fmaxf(v + b1[n], 0.f) : 0.f;
        });
        __syncthreads();
        // hidden rows to global, coalesced (16-byte stores when F % 4 == 0)
        if (FRD_HIDDEN % 4 == 0) {
            constexpr int G = FRD_HIDDEN / 4;
            for (int e = threadIdx.x; e < n_rows * G; e += FT) {
                const int r = e / G, c = e % G * 4;
                *reinterpret_cast<float4*>(hidden + (size_t)(m0 + r) * FRD_HIDDEN + c) =
                    *reinterpret_cast<const float4*>(tile + r * LDH + c);
            }
        } else {
            for (int e = threadIdx.x; e < n_rows * FRD_HIDDEN; e += FT) {
                const int r = e / FRD_HIDDEN, c = e % FRD_HIDDEN;
                hidden[(size_t)(m0 + r) * FRD_HIDDEN + c] = tile[r * LDH + c];
            }
        }
        float acc2[MT2][NT2][4];
        zero_acc(acc2);
        warp_mma<MT2, NT2, K2 / 8, false, LDH, false, LDH>(acc2, tile + wm2 * MT2 * 16 * LDH,
                                                          w2s + wn2 * NT2 * 8 * LDH);
        __syncthreads();  // the hidden tile is overwritten by the logits tile [BM][HA]
        each_acc(acc2, [&](int m, int n, float v) {
            m += wm2 * MT2 * 16;
            n += wn2 * NT2 * 8;
            if (n < HA) tile[m * HA + n] = v + b2[n];
        });
        __syncthreads();
#if FUSED
        // softmax-CE per (row, horizon), one thread each; the gradient replaces the logits in place
        for (int p = threadIdx.x; p < n_rows * N_HORIZONS; p += FT) {
            float* x = tile + p * N_ATOMS;  // row p / H, horizon p % H: rows are dense
            const int label = labels[(size_t)m0 * N_HORIZONS + p];
            float v[N_ATOMS];
            float mx = -INFINITY;
#pragma unroll
            for (int a = 0; a < N_ATOMS; ++a) {
                v[a] = x[a];
                mx = fmaxf(mx, v[a]);
            }
            float sum = 0.f;
#pragma unroll
            for (int a = 0; a < N_ATOMS; ++a) {
                v[a] = expf(v[a] - mx);
                sum += v[a];
            }
            const bool bad = label < -1 || label >= N_ATOMS;
            float loss = label == -1 ? 0.f : NAN;
#pragma unroll
            for (int a = 0; a < N_ATOMS; ++a) {
                const float q = v[a] / sum;
                if (a == label) loss = -logf(fmaxf(q, 1e-30f));
                x[a] = label == -1 ? 0.f : bad ? NAN : (q - (a == label ? 1.f : 0.f)) * inv_b;
            }
            ce[(size_t)m0 * N_HORIZONS + p] = loss;
        }
        __syncthreads();
#endif
        // the tile's logits (or grad_logits) are one contiguous span of the output
        store_span<FT>(out + (size_t)m0 * HA, tile, n_rows * HA);
        __syncthreads();  // this buffer takes the tile after next
    }
}
#endif  // FWD_WARPS

#ifdef BWD_WARPS
#define BT (32 * BWD_WARPS)
#if STAGE == 2
// F.3b: A = grad_logits [B][HA], X = hidden [B][F], W = w2 [HA][F]; out = dhidden [B][F]
#define SM HA
#define SN FRD_HIDDEN
#define MASKED 0
#else
// F.3c: A = dhidden masked by hidden > 0 [B][F], X = h_t [B][D_IN], W = w1 [F][D_IN];
// out = grad_h_t [B][D_IN]
#define SM FRD_HIDDEN
#define SN D_IN
#define MASKED 1
#endif
#define WNW (BWD_WARPS / BWD_WMW)
#define WNO (BWD_WARPS / BWD_WMO)
#define MTW CDIV(SM, 16 * BWD_WMW)
#define NTW CDIV(SN, 8 * WNW)
#define EXTM (MTW * 16 * BWD_WMW)
#define EXTN (NTW * 8 * WNW)
#define MTO (BWD_BM / (16 * BWD_WMO))
#define NTO CDIV(SN, 8 * WNO)
#define EXTO (NTO * 8 * WNO)
#define KMO RUP(SM, 8)
#define LDA LDK(EXTM)
#define LDXN LDK(EXTN)
#define LDW LDK(EXTO)
#define BIAS_PER CDIV(SM, BT)
// Shared floats; run.py computes the same: W [KMO][LDW], two A tiles, two X tiles (two mask tiles).
#define BWD_SMEM_FLOATS (KMO * LDW + 2 * BWD_BM * ((MASKED ? 2 : 1) * LDA + LDXN))

// The block's chunk of rows in tiles of BWD_BM: the weight partials sum_r A[r]^T X[r] (the
// tile's rows are the k of the product) stay in registers for the whole chunk; out[r] = A[r] W
// is written per tile. Scratch row blockIdx.x: SM*SN weight partials, then SM bias partials.
extern "C" __global__ void __launch_bounds__(BT, 1)
frdmma_backward(const float* __restrict__ a, const float* __restrict__ x,
                const float* __restrict__ w, const float* __restrict__ mask,
                float* __restrict__ scratch, float* __restrict__ out, const int B, const int chunk)
{
    static_assert(BWD_BM % (16 * BWD_WMO) == 0 && BWD_BM % 8 == 0, "out rows");
    static_assert(BWD_WARPS % BWD_WMW == 0 && BWD_WARPS % BWD_WMO == 0, "warp grid");
    float* ws = reinterpret_cast<float*>(dyn_smem);
    float* as = ws + KMO * LDW;
    float* xs = as + 2 * BWD_BM * LDA;
    float* ms = xs + 2 * BWD_BM * LDXN;
    const int r0 = blockIdx.x * chunk, r1 = min(B, r0 + chunk);
    const int warp = threadIdx.x / 32;
    const int wmw = warp % BWD_WMW, wnw = warp / BWD_WMW;
    const int wmo = warp % BWD_WMO, wno = warp / BWD_WMO;

    auto copy_tile = [&](int m0, int slot) {
        const int n = min(BWD_BM, r1 - m0);
        stage<BWD_BM, EXTM, LDA, SM, BT>(as + slot * BWD_BM * LDA, a + (size_t)m0 * SM, n);
        stage<BWD_BM, EXTN, LDXN, SN, BT>(xs + slot * BWD_BM * LDXN, x + (size_t)m0 * SN, n);
        if (MASKED) stage<BWD_BM, EXTM, LDA, SM, BT>(ms + slot * BWD_BM * LDA, mask + (size_t)m0 * SM, n);
        cp_commit();
    };
    stage<KMO, EXTO, LDW, SN, BT>(ws, w, SM);  // joins the first tile's group
    copy_tile(r0, 0);
    float accw[MTW][NTW][4];
    zero_acc(accw);
    float bias[BIAS_PER];
#pragma unroll
    for (int u = 0; u < BIAS_PER; ++u) bias[u] = 0.f;
    int buf = 0;
    for (int m0 = r0; m0 < r1; m0 += BWD_BM, buf ^= 1) {
        if (m0 + BWD_BM < r1) {
            copy_tile(m0 + BWD_BM, buf ^ 1);
            cp_wait<1>();
        } else {
            cp_wait<0>();
        }
        __syncthreads();
        float* at = as + buf * BWD_BM * LDA;
        if (MASKED) {
            const float* mt = ms + buf * BWD_BM * LDA;
            for (int e = threadIdx.x; e < BWD_BM * EXTM; e += BT) {
                const int i = e / EXTM * LDA + e % EXTM;
                if (!(mt[i] > 0.f)) at[i] = 0.f;
            }
            __syncthreads();
        }
#pragma unroll
        for (int u = 0; u < BIAS_PER; ++u) {  // column sums, rows ascending
            const int m = threadIdx.x + u * BT;
            if (m < SM)
#pragma unroll 8
                for (int r = 0; r < BWD_BM; ++r) bias[u] += at[r * LDA + m];
        }
        warp_mma<MTW, NTW, BWD_BM / 8, true, LDA, true, LDXN>(
            accw, at + wmw * MTW * 16, xs + buf * BWD_BM * LDXN + wnw * NTW * 8);
        {
            float acc[MTO][NTO][4];
            zero_acc(acc);
            warp_mma<MTO, NTO, KMO / 8, false, LDA, true, LDW>(acc, at + wmo * MTO * 16 * LDA,
                                                              ws + wno * NTO * 8);
            const int n_rows = min(BWD_BM, r1 - m0);
            each_acc(acc, [&](int m, int n, float v) {
                m += wmo * MTO * 16;
                n += wno * NTO * 8;
                if (m < n_rows && n < SN) out[(size_t)(m0 + m) * SN + n] = v;
            });
        }
        __syncthreads();  // this tile's buffers take the tile after next
    }
    float* part = scratch + (size_t)blockIdx.x * (SM * SN + SM);
    each_acc(accw, [&](int m, int n, float v) {
        m += wmw * MTW * 16;
        n += wnw * NTW * 8;
        if (m < SM && n < SN) part[m * SN + n] = v;
    });
#pragma unroll
    for (int u = 0; u < BIAS_PER; ++u) {
        const int m = threadIdx.x + u * BT;
        if (m < SM) part[SM * SN + m] = bias[u];
    }
}
#endif  // BWD_WARPS

#ifdef STEP_WARPS
// The whole training step of head + loss in one kernel: per tile of STEP_BM rows, in shared memory
//   hidden = ReLU(x w1^T + b1) -> logits = hidden w2^T + b2 -> G = (softmax - onehot) / B (ce out)
//   -> dW2 += G^T hidden, db2 += sum G -> dpre = (G w2) * [hidden > 0]
//   -> dW1 += dpre^T x, db1 += sum dpre -> grad_h_t = dpre w1 (out)
// Only h_t and labels come in and grad_h_t and ce go out per row; hidden, logits, G and dhidden
// never reach global memory. The weight partials stay in registers for the block's chunk and
// land in scratch row blockIdx.x: [dW2 (HA*F) | db2 (HA) | dW1 (F*D_IN) | db1 (F)].
// Knobs: STEP_WARPS, STEP_BM, STEP_WM (warps down the rows of the row products), STEP_WMW
// (warps down M of the weight tiles).
#define ST (32 * STEP_WARPS)
#define S_WN (STEP_WARPS / STEP_WM)
#define S_MT (STEP_BM / (16 * STEP_WM))
#define S_WNW (STEP_WARPS / STEP_WMW)
#define SK1 RUP(D_IN, 8)
#define SK2 RUP(FRD_HIDDEN, 8)
#define SKA RUP(HA, 8)
#define S_EXT1 RUP(FRD_HIDDEN, 8 * S_WN)          // hidden columns (layer 1, dhidden)
#define S_EXT2 RUP(HA, 8 * S_WN)                  // logits columns
#define S_EXTD RUP(D_IN, 8 * S_WN)                // grad_h_t columns
#define S_MTW2 CDIV(HA, 16 * STEP_WMW)
#define S_NTW2 CDIV(FRD_HIDDEN, 8 * S_WNW)
#define S_MTW1 CDIV(FRD_HIDDEN, 16 * STEP_WMW)
#define S_NTW1 CDIV(D_IN, 8 * S_WNW)
#define S_LDW1 LDR(MAXI(SK1, S_EXTD))             // w1 [F][.]: row reads (layer 1), k-major (grad_h_t)
#define S_LDW2 LDR(MAXI(SK2, S_EXT1))             // w2 [HA][.]: row reads (logits), k-major (dhidden)
#define S_LDX LDR(MAXI(SK1, S_NTW1 * 8 * S_WNW))  // x tile: row reads, k-major (dW1)
#define S_LDH LDR(MAXI(SK2, S_NTW2 * 8 * S_WNW))  // hidden tile: row reads, k-major (dW2)
#define S_LDG LDK(MAXI(SKA, S_MTW2 * 16 * STEP_WMW))  // G tile: k-major (dW2), row reads (dhidden)
#define S_LDD LDK(MAXI(SK2, S_MTW1 * 16 * STEP_WMW))  // dpre tile: k-major (dW1), row reads
#define S_W1ROWS MAXI(S_EXT1, SK2)
#define S_W2ROWS MAXI(S_EXT2, SKA)
// Shared floats; run.py computes the same.
#define STEP_SMEM_FLOATS (S_W1ROWS * S_LDW1 + S_W2ROWS * S_LDW2 + 2 * STEP_BM * S_LDX + \
                          STEP_BM * (S_LDH + S_LDG + S_LDD))
#define S_PART (HA * FRD_HIDDEN + HA + FRD_HIDDEN * D_IN + FRD_HIDDEN)

extern "C" __global__ void __launch_bounds__(ST, 1)
frdmma_step(const float* __restrict__ h_t, const float* __restrict__ w1,
            const float* __restrict__ b1, const float* __restrict__ w2,
            const float* __restrict__ b2, const int* __restrict__ labels,
            float* __restrict__ scratch, float* __restrict__ grad_h_t, float* __restrict__ ce,
            const int B, const int chunk, const float inv_b)
{
    static_assert(STEP_BM % (16 * STEP_WM) == 0 && STEP_BM % 8 == 0, "rows per tile");
    static_assert(STEP_WARPS % STEP_WM == 0 && STEP_WARPS % STEP_WMW == 0, "warp grid");
    static_assert(HA <= ST && FRD_HIDDEN <= ST, "one thread per bias column");
    float* w1s = reinterpret_cast<float*>(dyn_smem);
    float* w2s = w1s + S_W1ROWS * S_LDW1;
    float* xs = w2s + S_W2ROWS * S_LDW2;
    float* hs = xs + 2 * STEP_BM * S_LDX;
    float* gs = hs + STEP_BM * S_LDH;
    float* ds = gs + STEP_BM * S_LDG;
    const int r0 = blockIdx.x * chunk, r1 = min(B, r0 + chunk);
    const int warp = threadIdx.x / 32;
    const int wm = warp % STEP_WM, wn = warp / STEP_WM;
    const int wmw = warp % STEP_WMW, wnw = warp / STEP_WMW;
    constexpr int NT1 = S_EXT1 / (8 * S_WN), NT2 = S_EXT2 / (8 * S_WN), NTD = S_EXTD / (8 * S_WN);

    // zero padding of every array is read as zero k or m by some product
    stage<S_W1ROWS, MAXI(SK1, S_EXTD), S_LDW1, D_IN, ST>(w1s, w1, FRD_HIDDEN);
    stage<S_W2ROWS, MAXI(SK2, S_EXT1), S_LDW2, FRD_HIDDEN, ST>(w2s, w2, HA);
    stage<STEP_BM, MAXI(SK1, S_NTW1 * 8 * S_WNW), S_LDX, D_IN, ST>(xs, h_t + (size_t)r0 * D_IN,
                                                                 min(STEP_BM, r1 - r0));
    cp_commit();
    for (int i = threadIdx.x; i < STEP_BM * (S_LDH + S_LDG + S_LDD); i += ST) hs[i] = 0.f;
    float dw2[S_MTW2][S_NTW2][4], dw1[S_MTW1][S_NTW1][4];
    zero_acc(dw2);
    zero_acc(dw1);
    float db2 = 0.f, db1 = 0.f;  // thread c < HA: db2[c]; thread ST - FRD_HIDDEN + c: db1[c]
    const int c1 = threadIdx.x - (ST - FRD_HIDDEN);
    int buf = 0;
    for (int m0 = r0; m0 < r1; m0 += STEP_BM, buf ^= 1) {
        if (m0 + STEP_BM < r1) {
            stage<STEP_BM, MAXI(SK1, S_NTW1 * 8 * S_WNW), S_LDX, D_IN, ST>(
                xs + (buf ^ 1) * STEP_BM * S_LDX, h_t + (size_t)(m0 + STEP_BM) * D_IN,
                min(STEP_BM, r1 - m0 - STEP_BM));
            cp_commit();
            cp_wait<1>();
        } else {
            cp_wait<0>();
        }
        __syncthreads();
        const float* xt = xs + buf * STEP_BM * S_LDX;
        const int n_rows = min(STEP_BM, r1 - m0);
        {   // hidden tile
            float acc[S_MT][NT1][4];
            zero_acc(acc);
            warp_mma<S_MT, NT1, SK1 / 8, false, S_LDX, false, S_LDW1>(
                acc, xt + wm * S_MT * 16 * S_LDX, w1s + wn * NT1 * 8 * S_LDW1);
            each_acc(acc, [&](int m, int n, float v) {
                m += wm * S_MT * 16;
                n += wn * NT1 * 8;
                if (n < SK2) hs[m * S_LDH + n] = n < FRD_HIDDEN ? fmaxf(v + b1[n], 0.f) : 0.f;
            });
        }
        __syncthreads();
        {   // logits tile into gs
            float acc[S_MT][NT2][4];
            zero_acc(acc);
            warp_mma<S_MT, NT2, SK2 / 8, false, S_LDH, false, S_LDW2>(
                acc, hs + wm * S_MT * 16 * S_LDH, w2s + wn * NT2 * 8 * S_LDW2);
            each_acc(acc, [&](int m, int n, float v) {
                m += wm * S_MT * 16;
                n += wn * NT2 * 8;
                if (n < HA) gs[m * S_LDG + n] = v + b2[n];
            });
        }
        __syncthreads();
        // softmax-CE per (row, horizon); rows past the batch get G = 0 (they add nothing below)
        for (int p = threadIdx.x; p < STEP_BM * N_HORIZONS; p += ST) {
            const int r = p / N_HORIZONS, h = p % N_HORIZONS;
            float* x = gs + r * S_LDG + h * N_ATOMS;
            if (r >= n_rows) {
#pragma unroll
                for (int a = 0; a < N_ATOMS; ++a) x[a] = 0.f;
                continue;
            }
            const int label = labels[(size_t)m0 * N_HORIZONS + p];
            float v[N_ATOMS];
            float mx = -INFINITY;
#pragma unroll
            for (int a = 0; a < N_ATOMS; ++a) {
                v[a] = x[a];
                mx = fmaxf(mx, v[a]);
            }
            float sum = 0.f;
#pragma unroll
            for (int a = 0; a < N_ATOMS; ++a) {
                v[a] = expf(v[a] - mx);
                sum += v[a];
            }
            const bool bad = label < -1 || label >= N_ATOMS;
            float loss = label == -1 ? 0.f : NAN;
#pragma unroll
            for (int a = 0; a < N_ATOMS; ++a) {
                const float q = v[a] / sum;
                if (a == label) loss = -logf(fmaxf(q, 1e-30f));
                x[a] = label == -1 ? 0.f : bad ? NAN : (q - (a == label ? 1.f : 0.f)) * inv_b;
            }
            ce[(size_t)m0 * N_HORIZONS + p] = loss;
        }
        __syncthreads();
        // dW2 += G^T hidden, db2 += sum G, dpre = (G w2) * [hidden > 0]
        if (threadIdx.x < HA)
#pragma unroll 8
            for (int r = 0; r < STEP_BM; ++r) db2 += gs[r * S_LDG + threadIdx.x];
        warp_mma<S_MTW2, S_NTW2, STEP_BM / 8, true, S_LDG, true, S_LDH>(
            dw2, gs + wmw * S_MTW2 * 16, hs + wnw * S_NTW2 * 8);
        {
            float acc[S_MT][NT1][4];
            zero_acc(acc);
            warp_mma<S_MT, NT1, SKA / 8, false, S_LDG, true, S_LDW2>(
                acc, gs + wm * S_MT * 16 * S_LDG, w2s + wn * NT1 * 8);
            each_acc(acc, [&](int m, int n, float v) {
                m += wm * S_MT * 16;
                n += wn * NT1 * 8;
                if (n < SK2) ds[m * S_LDD + n] = hs[m * S_LDH + n] > 0.f ? v : 0.f;
            });
        }
        __syncthreads();
        // dW1 += dpre^T x, db1 += sum dpre, grad_h_t = dpre w1
        if (c1 >= 0)
#pragma unroll 8
            for (int r = 0; r < STEP_BM; ++r) db1 += ds[r * S_LDD + c1];
        warp_mma<S_MTW1, S_NTW1, STEP_BM / 8, true, S_LDD, true, S_LDX>(
            dw1, ds + wmw * S_MTW1 * 16, xt + wnw * S_NTW1 * 8);
        {
            float acc[S_MT][NTD][4];
            zero_acc(acc);
            warp_mma<S_MT, NTD, SK2 / 8, false, S_LDD, true, S_LDW1>(
                acc, ds + wm * S_MT * 16 * S_LDD, w1s + wn * NTD * 8);
            each_acc(acc, [&](int m, int n, float v) {
                m += wm * S_MT * 16;
                n += wn * NTD * 8;
                if (m < n_rows && n < D_IN) grad_h_t[(size_t)(m0 + m) * D_IN + n] = v;
            });
        }
        __syncthreads();  // the x buffer takes the tile after next; hs, gs, ds the next tile
    }
    float* part = scratch + (size_t)blockIdx.x * S_PART;
    each_acc(dw2, [&](int m, int n, float v) {
        m += wmw * S_MTW2 * 16;
        n += wnw * S_NTW2 * 8;
        if (m < HA && n < FRD_HIDDEN) part[m * FRD_HIDDEN + n] = v;
    });
    if (threadIdx.x < HA) part[HA * FRD_HIDDEN + threadIdx.x] = db2;
    part += HA * FRD_HIDDEN + HA;
    each_acc(dw1, [&](int m, int n, float v) {
        m += wmw * S_MTW1 * 16;
        n += wnw * S_NTW1 * 8;
        if (m < FRD_HIDDEN && n < D_IN) part[m * D_IN + n] = v;
    });
    if (c1 >= 0) part[FRD_HIDDEN * D_IN + c1] = db1;
}
#endif  // STEP_WARPS

#ifdef REDUCE
// y[c] = sum_r x[r][c]: 8 row groups of 32 columns per block, each group's rows ascending, the
// groups added 0..7. The order depends on n only: bitwise reproducible.
extern "C" __global__ void __launch_bounds__(256)
frdmma_reduce(const float* __restrict__ x, float* __restrict__ y, const int n, const int m)
{
    __shared__ float part[8][33];
    const int lane = threadIdx.x % 32, grp = threadIdx.x / 32;
    const int c = blockIdx.x * 32 + lane;
    const int per = (n + 7) / 8, ra = min(n, grp * per), rb = min(n, ra + per);
    float s = 0.f;
    if (c < m) {
        int r = ra;
        for (; r + 4 <= rb; r += 4) {  // four loads in flight, added in row order
            const float v0 = x[(size_t)r * m + c], v1 = x[(size_t)(r + 1) * m + c];
            const float v2 = x[(size_t)(r + 2) * m + c], v3 = x[(size_t)(r + 3) * m + c];
            s += v0;
            s += v1;
            s += v2;
            s += v3;
        }
        for (; r < rb; ++r) s += x[(size_t)r * m + c];
    }
    part[grp][lane] = s;
    __syncthreads();
    if (grp == 0 && c < m) {
        float t = part[0][lane];
#pragma unroll
        for (int k = 1; k < 8; ++k) t += part[k][lane];
        y[c] = t;
    }
}
#endif  // REDUCE
