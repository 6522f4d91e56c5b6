// Wide-head pool forward prototype (issue 34: H*D >= 2048), outside the library: run.py compiles
// it per variant with -D options and checks it against the float64 reference.
// Blocks loop over batch rows (a grid of B: one row a block). Keys arrive in chunks of KC rows
// of ln, the next chunk fetched by cp.async while this one is computed;
// both products run on the tensor cores as 3xTF32 mma.sync m16n8k8 (a*b ~ a_small*b_big +
// a_big*b_small + a_big*b_big, float32 accumulators), with the horizons as the n dimension so
// that any N_HORIZONS multiple of 8 fills the tiles:
//   scores^T [KC x H] = ln_chunk [KC x D] . q^T       (warps split the chunk's keys)
//   ctx^T    [D x H] += ln_chunk^T [D x KC] . p^T     (warps split D; online softmax rescale)
// Raw scores of the whole row stay in shared memory, so attn is written once, normalised.
// No atomics; every sum in a fixed order.
// Template constants: N_HORIZONS (multiple of 8), HIDDEN_DIM (multiple of 16*WARPS), WARPS, KC
// (multiple of 16*WARPS); 32*WARPS a multiple of N_HORIZONS, at most 32 threads a horizon.
#define H N_HORIZONS
#define D HIDDEN_DIM
#define NTH (32 * WARPS)
#define LDL (D + 8)   // ln chunk rows: float2 reads along a row spread a half warp over the banks
#define LDQ (D + 8)
#define LDP (KC + 8)
#define MT_S (KC / (16 * WARPS))
#define MT_C (D / (16 * WARPS))
#define NH8 (H / 8)    // n8 tiles across the horizons
#define TPH (NTH / H)  // threads a horizon in the softmax step
// Shared floats: q [H][LDQ], two ln chunks [2][KC][LDL], p [H][LDP], raw scores [H][KP], m, l,
// alpha [H]. The *_FLOATS macros are the host's (run.py reads them through the library's
// HeaderSizes), KP the row's keys rounded up to KC.
#define WIDE_FLOATS (H * LDQ + 2 * KC * LDL + H * LDP + H * KP + 3 * H)

#include "../tf32_mma.cuh"

// Every version's entry points take the same parameters: run.py launches them all alike (the
// backward's ctx is read by the versions that need it).
#define WIDE_FORWARD_PARAMS                                                                   \
    const float* __restrict__ q_h, const float* __restrict__ ln, float* __restrict__ ctx,     \
        float* __restrict__ attn, const int B, const int K, const float scale
#define WIDE_BACKWARD_PARAMS                                                                  \
    const float* __restrict__ q_h, const float* __restrict__ ln, const float* __restrict__ attn, \
        const float* __restrict__ grad_ctx, const float* __restrict__ ctx,                    \
        float* __restrict__ grad_ln, float* __restrict__ gq_scratch, const int B, const int K, \
        const float scale
#include "../../cu/heads_common.cuh"  // group_sum, group_max

#if !ROWS && !DSPLIT && !RATE && !WHOLE  // the first two versions
// ln chunk w of this block's work (its rows blockIdx.x + i*gridDim.x, KC keys a chunk) into
// buffer buf by cp.async; keys past K are zeros.
__device__ __forceinline__ void fetch_chunk(float* ls, const float* __restrict__ ln, int w,
                                            int nck, int K)
{
    const int b = blockIdx.x + w / nck * gridDim.x, c0 = w % nck * KC;
    const float* src = ln + (size_t)b * K * D;
    for (int e = threadIdx.x; e < KC * D / 4; e += NTH) {
        const int r = e / (D / 4), c = e % (D / 4) * 4;
        const bool ok = c0 + r < K;
        const unsigned dst = (unsigned)__cvta_generic_to_shared(ls + r * LDL + c);
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                     :: "r"(dst), "l"(ok ? src + (size_t)(c0 + r) * D + c : src), "r"(ok ? 16 : 0));
    }
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// The warp's keys of the chunk ls against the N_HORIZONS rows of b ([H][LDB]):
// f(key in the chunk, h, ln[key] . b[h]) for each.
template <int LDB, class F>
__device__ __forceinline__ void keys_by_horizons(const float* ls, const float* b, F f)
{
    float sacc[MT_S][NH8][4];
    zero_acc(sacc);
    const int r0 = threadIdx.x / 32 * 16 * MT_S;
    warp_mma<MT_S, NH8, D / 8, false, LDL, false, LDB>(sacc, ls + r0 * LDL, b);
    each_acc(sacc, [&](int m, int n, float v) { f(r0 + m, n, v); });
}

// Chunk w + 1 into the other buffer, if there is one, then wait for chunk w (this thread's
// copies; a barrier after makes every thread's visible).
__device__ __forceinline__ void next_chunk(float* lbuf, const float* __restrict__ ln, int w,
                                           int total, int nck, int K)
{
    if (w + 1 < total) {
        fetch_chunk(lbuf + ((w + 1) & 1) * KC * LDL, ln, w + 1, nck, K);
        asm volatile("cp.async.wait_group 1;\n" ::: "memory");
    } else {
        asm volatile("cp.async.wait_group 0;\n" ::: "memory");
    }
}

// Each block loops over rows blockIdx.x + i*gridDim.x; with a grid of B blocks it is one row a
// block. The next chunk (of this row or the block's next) is fetched into the other ln buffer
// while this one is computed.
extern "C" __global__ void __launch_bounds__(NTH)
wide_forward(WIDE_FORWARD_PARAMS)
{
    extern __shared__ __align__(16) float smem[];
    const int nck = (K + KC - 1) / KC, kp = nck * KC;
    float* qs = smem;
    float* lbuf = qs + H * LDQ;  // two chunks
    float* ps = lbuf + 2 * KC * LDL;
    float* ss = ps + H * LDP;
    float* m_s = ss + H * kp;
    float* l_s = m_s + H;
    float* a_s = l_s + H;
    const int warp = threadIdx.x / 32;
    const int rows = blockIdx.x < B ? (B - 1 - blockIdx.x) / gridDim.x + 1 : 0;
    for (int e = threadIdx.x; e < H * D; e += NTH) qs[e / D * LDQ + e % D] = q_h[e];
    float acc[MT_C][NH8][4];
    if (rows > 0) fetch_chunk(lbuf, ln, 0, nck, K);
    for (int w = 0; w < rows * nck; ++w) {
        const int b = blockIdx.x + w / nck * gridDim.x, c0 = w % nck * KC;
        float* ls = lbuf + (w & 1) * KC * LDL;
        __syncthreads();  // the other buffer's chunk (w - 1) is read
        next_chunk(lbuf, ln, w, rows * nck, nck, K);
        if (c0 == 0) {
            zero_acc(acc);
            if (threadIdx.x < H) { m_s[threadIdx.x] = -INFINITY; l_s[threadIdx.x] = 0.f; }
        }
        __syncthreads();
        keys_by_horizons<LDQ>(ls, qs, [&](int key, int n, float v) {
            ss[n * kp + c0 + key] = c0 + key < K ? v * scale : -INFINITY;
        });
        __syncthreads();
        {   // online softmax, TPH threads a horizon: p for the chunk, the rescale of ctx
            const int h = threadIdx.x / TPH, j = threadIdx.x % TPH;
            float mx = -INFINITY;
            for (int k = j; k < KC; k += TPH) mx = fmaxf(mx, ss[h * kp + c0 + k]);
            mx = group_max<TPH>(mx);
            const float m_old = m_s[h], m_new = fmaxf(m_old, mx);
            float sum = 0.f;
            for (int k = j; k < KC; k += TPH) {
                const float p = c0 + k < K ? expf(ss[h * kp + c0 + k] - m_new) : 0.f;
                ps[h * LDP + k] = p;
                sum += p;
            }
            sum = group_sum<TPH>(sum);
            if (j == 0) {
                const float alpha = m_old == -INFINITY ? 0.f : expf(m_old - m_new);
                a_s[h] = alpha;
                l_s[h] = l_s[h] * alpha + sum;
                m_s[h] = m_new;
            }
        }
        __syncthreads();
        each_acc(acc, [&](int, int n, float& v) { v *= a_s[n]; });
        const int d0 = warp * 16 * MT_C;
        warp_mma<MT_C, NH8, KC / 8, true, LDL, false, LDP>(acc, ls + d0, ps);
        if (c0 + KC >= K) {  // the row's last chunk: ctx from the registers, attn from ss
            each_acc(acc, [&](int m, int n, float v) {
                ctx[((size_t)b * H + n) * D + d0 + m] = v / l_s[n];
            });
            for (int e = threadIdx.x; e < H * K; e += NTH) {
                const int h = e / K, k = e % K;
                attn[(size_t)b * H * K + e] = expf(ss[h * kp + k] - m_s[h]) / l_s[h];
            }
        }
    }
}

#endif

#if ROWS  // N_HORIZONS a multiple of 16, HIDDEN_DIM a multiple of 8 up to 128
// The third version, registers instead of barriers: a block is one batch row at a time (rows
// blockIdx.x + i*gridDim.x) and its N_HORIZONS / 16 warps take 16 horizons each. The block
// shares only a ring of RSTAGES chunks of KC keys (one barrier a chunk); a warp keeps its
// scores, softmax weights and ctx in registers, as flash-attention 2 does:
//   S [16 x KC] = q_w [16 x D] . ln_chunk^T    (q_w's fragments read through L1, not staged)
//   online softmax over S's rows (a quad's shuffles), P = exp(S - m) in the accumulators
//   ctx_w [16 x D] += P . ln_chunk             (P's accumulators are the A fragments as they
//                                               are: the k permutation of warp_mma)
// Raw scores stay in shared memory ([16][KP] a warp) for attn at the row's end.
#define RWARPS (N_HORIZONS / 16)
#define RTH (32 * RWARPS)
#define RING_THREADS RTH
#define NTK (KC / 8)        // S's n8 tiles (keys)
#define NTD (D / 8)         // ctx's n8 tiles (columns)
// Shared floats: the ring [RSTAGES][KC][LDR], raw scores [RWARPS][16][KP].
#define ROWS_FLOATS (RSTAGES * KC * LDR + RWARPS * 16 * KP)

#endif

#if DSPLIT  // N_HORIZONS a multiple of 8 up to 32, HIDDEN_DIM a multiple of DC; KC 16
// The fourth version, for wide rows (D up to 1024): a block is one batch row at a time and its
// D / DC warps split the columns; a chunk is 16 keys (one m16 tile), RSTAGES of them in a ring.
//   S_w [16 x H] = ln_chunk[:, cols_w] . q[:, cols_w]^T    each warp's columns' share, to
//                                                           shared memory (barrier)
//   S = the shares summed in warp order; the online softmax over the 16 keys (lanes xor 4, 8,
//   16), the same in every warp; P to a per-warp copy, transposed
//   ctx_w^T [DC x H] += ln_chunk[:, cols_w]^T . P           H as the n dimension
// Warp 0 keeps the raw scores ([H][KP]) for attn at the row's end. Two barriers a chunk.
#define DWARPS (D / DC)
#define RING_THREADS (32 * DWARPS)
#define MT_D (DC / 16)   // ctx_w^T's m16 tiles (columns)
#define LDP2 (H + 4)     // P copy rows: the B fragment reads hit 32 banks
// Shared floats: the ring [RSTAGES][16][LDR], score shares [DWARPS][16][H], P copies
// [DWARPS][16][LDP2], raw scores [H][KP].
#define DSPLIT_FLOATS (DSPLIT_BWD_FLOATS + H * KP)
#define DSPLIT_BWD_FLOATS (RSTAGES * 16 * (D + 8) + DWARPS * 16 * H + DWARPS * 16 * LDP2)
static_assert(KC == 16 && DC % 16 == 0 && D % DC == 0 && H % 8 == 0 && H <= 32, "DSPLIT sizes");
#endif

#if ROWS || DSPLIT
#define LDR (D + 8)  // ring rows: float2 reads along a row hit 32 banks
// chunk w of the block's work (row blockIdx.x + w / nck * gridDim.x, keys from w % nck * KC)
// into ring slot w % RSTAGES; one commit group a chunk, empty past the end
__device__ __forceinline__ void ring_fetch(float* ring, const float* __restrict__ ln, int w,
                                           int total, int nck, int K)
{
    if (w < total) {
        const int b = blockIdx.x + w / nck * gridDim.x, c0 = w % nck * KC;
        const float* src = ln + (size_t)b * K * D;
        float* dst = ring + (w % RSTAGES) * KC * LDR;
        for (int e = threadIdx.x; e < KC * D / 4; e += RING_THREADS) {
            const int r = e / (D / 4), c = e % (D / 4) * 4;
            const bool ok = c0 + r < K;
            const unsigned to = (unsigned)__cvta_generic_to_shared(dst + r * LDR + c);
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                         :: "r"(to), "l"(ok ? src + (size_t)(c0 + r) * D + c : src),
                         "r"(ok ? 16 : 0));
        }
    }
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// The block's chunks (rows blockIdx.x + i*gridDim.x, nck chunks a row): the first RSTAGES - 1
// in flight; returns how many there are
__device__ __forceinline__ int ring_start(float* ring, const float* __restrict__ ln, int B,
                                          int nck, int K)
{
    const int rows = blockIdx.x < B ? (B - 1 - blockIdx.x) / gridDim.x + 1 : 0;
#pragma unroll
    for (int w = 0; w < RSTAGES - 1; ++w) ring_fetch(ring, ln, w, rows * nck, nck, K);
    return rows * nck;
}

// Chunk w's slot once the block's copies are in (a barrier: chunk w - 1's slot, and whatever
// the block wrote during chunk w - 1, is free after it); chunk w + RSTAGES - 1 goes in flight
__device__ __forceinline__ const float* ring_next(float* ring, const float* __restrict__ ln,
                                                  int w, int total, int nck, int K)
{
    asm volatile("cp.async.wait_group %0;\n" :: "n"(RSTAGES - 2) : "memory");
    __syncthreads();
    ring_fetch(ring, ln, w + RSTAGES - 1, total, nck, K);
    return ring + (w % RSTAGES) * KC * LDR;
}

// acc [16 x NT n8 tiles] += A . B for one k-step, A's fragments (ab, as) given, B's rows k = 2t
// and 2t + 1 at bk and bk + D (column g of each n8 tile), read through L1
template <int NT>
__device__ __forceinline__ void times_rows(float (&acc)[NT][4], const unsigned (&ab)[4],
                                           const unsigned (&as)[4], const float* __restrict__ bk)
{
#pragma unroll
    for (int n = 0; n < NT; ++n) {
        unsigned bb[2], bs[2];
        split(__ldg(bk + 8 * n), bb[0], bs[0]);
        split(__ldg(bk + D + 8 * n), bb[1], bs[1]);
        mma_tf32(acc[n], as, bb);
        mma_tf32(acc[n], ab, bs);
        mma_tf32(acc[n], ab, bb);
    }
}

// row r (0: g, 1: g + 8) of accumulators acc [16 x NT n8 tiles] to dst (columns 8n + 2t, 2t + 1)
template <int NT>
__device__ __forceinline__ void store_pairs(float* dst, const float (&acc)[NT][4], int r)
{
    const int t = threadIdx.x % 4;
#pragma unroll
    for (int n = 0; n < NT; ++n)
        *reinterpret_cast<float2*>(dst + 8 * n + 2 * t) = make_float2(acc[n][2 * r],
                                                                      acc[n][2 * r + 1]);
}

#endif

#if ROWS
// S [16 x KC] = X_w [16 x D] . ln_chunk^T into s (zeroed here), X_w's rows g and g + 8 at xa
// and xa + 8 D (column 2t of each k-step), read through L1
__device__ __forceinline__ void rows_scores(float (&s)[NTK][4], const float* __restrict__ xa,
                                            const float* ls)
{
    const int g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
#pragma unroll
    for (int j = 0; j < NTK; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#pragma unroll 4
    for (int k0 = 0; k0 < D; k0 += 8) {
        unsigned ab[4], as[4];
        const float2 x0 = __ldg(reinterpret_cast<const float2*>(xa + k0));
        const float2 x1 = __ldg(reinterpret_cast<const float2*>(xa + 8 * D + k0));
        split(x0.x, ab[0], as[0]);
        split(x1.x, ab[1], as[1]);
        split(x0.y, ab[2], as[2]);
        split(x1.y, ab[3], as[3]);
#pragma unroll
        for (int j = 0; j < NTK; ++j) {
            const float2 v = *reinterpret_cast<const float2*>(ls + (8 * j + g) * LDR + k0 + 2 * t);
            unsigned bb[2], bs[2];
            split(v.x, bb[0], bs[0]);
            split(v.y, bb[1], bs[1]);
            mma_tf32(s[j], as, bb);
            mma_tf32(s[j], ab, bs);
            mma_tf32(s[j], ab, bb);
        }
    }
}

// acc [16 x D] += P . ln_chunk with P in the accumulators s: k-step kk's A fragments are S's
// tile kk as it is (rows g, g + 8; keys 2t, 2t + 1 in slots t, t + 4)
__device__ __forceinline__ void rows_times_ln(float (&acc)[NTD][4], const float (&s)[NTK][4],
                                              const float* ls)
{
    const int g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
#pragma unroll
    for (int kk = 0; kk < NTK; ++kk) {
        unsigned ab[4], as[4];
        split(s[kk][0], ab[0], as[0]);
        split(s[kk][2], ab[1], as[1]);
        split(s[kk][1], ab[2], as[2]);
        split(s[kk][3], ab[3], as[3]);
        const float* lk = ls + (8 * kk + 2 * t) * LDR + g;
#pragma unroll
        for (int j = 0; j < NTD; ++j) {
            unsigned bb[2], bs[2];
            split(lk[8 * j], bb[0], bs[0]);
            split(lk[LDR + 8 * j], bb[1], bs[1]);
            mma_tf32(acc[j], as, bb);
            mma_tf32(acc[j], ab, bs);
            mma_tf32(acc[j], ab, bb);
        }
    }
}

extern "C" __global__ void __launch_bounds__(RTH)
wide_forward_rows(WIDE_FORWARD_PARAMS)
{
    extern __shared__ __align__(16) float smem[];
    const int nck = (K + KC - 1) / KC, kp = nck * KC;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    float* ring = smem;
    float* sw = ring + RSTAGES * KC * LDR + warp * 16 * kp;  // this warp's raw scores
    const int h0 = 16 * warp;
    const float* qa = q_h + (size_t)(h0 + g) * D + 2 * t;  // rows g and g + 8 of q_w
    const int total = ring_start(ring, ln, B, nck, K);
    float acc[NTD][4], m[2], l[2];
    for (int w = 0; w < total; ++w) {
        const int b = blockIdx.x + w / nck * gridDim.x, c0 = w % nck * KC;
        const float* ls = ring_next(ring, ln, w, total, nck, K);
        if (c0 == 0) {
#pragma unroll
            for (int j = 0; j < NTD; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
            m[0] = m[1] = -INFINITY;
            l[0] = l[1] = 0.f;
        }
        float s[NTK][4];
        rows_scores(s, qa, ls);
        // S's rows g (e 0, 1) and g + 8 (e 2, 3): scaled, keys past K masked, kept for attn
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int j = 0; j < NTK; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int key = c0 + 8 * j + 2 * t + e % 2;
                const float v = key < K ? s[j][e] * scale : -INFINITY;
                s[j][e] = v;
                sw[(g + 8 * (e / 2)) * kp + key] = v;
                mx[e / 2] = fmaxf(mx[e / 2], v);
            }
        float alpha[2], sum[2] = {0.f, 0.f};
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            mx[r] = group_max<4>(mx[r]);  // a quad holds a row
            const float m_new = fmaxf(m[r], mx[r]);
            alpha[r] = expf(m[r] - m_new);  // 0 at the row's first chunk
            m[r] = m_new;
        }
#pragma unroll
        for (int j = 0; j < NTK; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                s[j][e] = expf(s[j][e] - m[e / 2]);
                sum[e / 2] += s[j][e];
            }
#pragma unroll
        for (int r = 0; r < 2; ++r) l[r] = l[r] * alpha[r] + group_sum<4>(sum[r]);
#pragma unroll
        for (int j = 0; j < NTD; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[j][e] *= alpha[e / 2];
        rows_times_ln(acc, s, ls);  // ctx_w += P . ln_chunk
        if (c0 + KC >= K) {  // the row's last chunk: ctx from the registers, attn from sw
            const size_t row = (size_t)b * N_HORIZONS + h0;
#pragma unroll
            for (int j = 0; j < NTD; ++j)
#pragma unroll
                for (int r = 0; r < 2; ++r)
                    *reinterpret_cast<float2*>(ctx + (row + g + 8 * r) * D + 8 * j + 2 * t) =
                        make_float2(acc[j][2 * r] / l[r], acc[j][2 * r + 1] / l[r]);
            __syncwarp();  // every lane's raw scores are in sw
            for (int e0 = 0; e0 < 16 * K; e0 += 32) {  // every lane through every shuffle
                const int e = min(e0 + lane, 16 * K - 1), h = e / K, k = e % K;
                const int from = 4 * (h % 8);  // a lane of the quad holding row h % 8
                const float m0 = __shfl_sync(FULL_MASK, m[0], from);
                const float m1 = __shfl_sync(FULL_MASK, m[1], from);
                const float l0 = __shfl_sync(FULL_MASK, l[0], from);
                const float l1 = __shfl_sync(FULL_MASK, l[1], from);
                if (e0 + lane < 16 * K)
                    attn[row * K + e] =
                        expf(sw[h * kp + k] - (h < 8 ? m0 : m1)) / (h < 8 ? l0 : l1);
            }
            __syncwarp();  // sw is read before the next row's scores
        }
    }
}

// The backward on the same plan, given the forward's ctx. Per chunk, warp w's 16 horizons:
//   dw_w [16 x KC] = G_w . ln_chunk^T;  sd = scale * A * (dw - c), c = G . ctx per horizon
//   grad_q_w [16 x D] += sd . ln_chunk     (sd's accumulators as A fragments; the block's
//                                           partial over its rows in registers, a scratch row
//                                           a block at the end)
// sd goes to shared memory; after a barrier warp w takes keys [w KC / RWARPS, ...) of the
// chunk over every horizon:
//   grad_ln [keys x D] = [A^T | sd^T] . [G ; q]    (k = 2H; A, G and q read through L1)
// Shared floats: the ring [RSTAGES][KC][LDR], sd [H][LDS].
#define LDS (KC + 4)             // sd rows: the transposed fragment reads hit 32 banks
#define MT_L (KC / (16 * RWARPS))  // grad_ln's m16 tiles a warp
#define ROWS_BWD_FLOATS (RSTAGES * KC * LDR + N_HORIZONS * LDS)
#if KC % (16 * RWARPS) == 0  // whole m16 tiles of keys a warp

extern "C" __global__ void __launch_bounds__(RTH)
wide_backward_rows(WIDE_BACKWARD_PARAMS)
{
    extern __shared__ __align__(16) float smem[];
    const int nck = (K + KC - 1) / KC;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    float* ring = smem;
    float* sds = ring + RSTAGES * KC * LDR;
    const int h0 = 16 * warp;
    const int total = ring_start(ring, ln, B, nck, K);
    float accq[NTD][4], c[2];
#pragma unroll
    for (int j = 0; j < NTD; ++j) accq[j][0] = accq[j][1] = accq[j][2] = accq[j][3] = 0.f;
    for (int w = 0; w < total; ++w) {
        const int b = blockIdx.x + w / nck * gridDim.x, c0 = w % nck * KC;
        const size_t row = (size_t)b * N_HORIZONS;
        const float* ls = ring_next(ring, ln, w, total, nck, K);  // sd free too
        const float* ga = grad_ctx + (row + h0 + g) * D + 2 * t;  // G_w's rows g and g + 8
        if (c0 == 0) {  // c for rows g and g + 8: a quad splits D
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                const float* gr = grad_ctx + (row + h0 + g + 8 * r) * D;
                const float* cr = ctx + (row + h0 + g + 8 * r) * D;
                float v = 0.f;
                for (int d = t; d < D; d += 4) v += __ldg(gr + d) * __ldg(cr + d);
                c[r] = group_sum<4>(v);
            }
        }
        float s[NTK][4];
        rows_scores(s, ga, ls);
        // sd at rows g (e 0, 1) and g + 8 (e 2, 3), keys past K zero; into shared memory too
#pragma unroll
        for (int j = 0; j < NTK; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int hr = h0 + g + 8 * (e / 2), key = 8 * j + 2 * t + e % 2;
                const float a = c0 + key < K ? __ldg(attn + (row + hr) * K + c0 + key) : 0.f;
                s[j][e] = scale * a * (s[j][e] - c[e / 2]);
                sds[hr * LDS + key] = s[j][e];
            }
        rows_times_ln(accq, s, ls);  // grad_q_w += sd . ln_chunk
        __syncthreads();  // every warp's sd is in
#pragma unroll
        for (int i = 0; i < MT_L; ++i) {
            const int k1 = (warp * MT_L + i) * 16 + g;  // rows k1 and k1 + 8 of the chunk
            float accl[NTD][4];
#pragma unroll
            for (int j = 0; j < NTD; ++j) accl[j][0] = accl[j][1] = accl[j][2] = accl[j][3] = 0.f;
#pragma unroll 2
            for (int kk = 0; kk < 2 * N_HORIZONS / 8; ++kk) {  // A^T . G, then sd^T . q
                const bool sd_part = kk >= N_HORIZONS / 8;
                const int h = 8 * kk - (sd_part ? N_HORIZONS : 0) + 2 * t;  // and h + 1
                unsigned ab[4], as[4];
                float x[4];  // (k1, h), (k1 + 8, h), (k1, h + 1), (k1 + 8, h + 1)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int key = k1 + 8 * (e % 2), hh = h + e / 2;
                    x[e] = sd_part ? sds[hh * LDS + key]
                         : c0 + key < K ? __ldg(attn + (row + hh) * K + c0 + key) : 0.f;
                }
#pragma unroll
                for (int e = 0; e < 4; ++e) split(x[e], ab[e], as[e]);
                times_rows(accl, ab, as, (sd_part ? q_h : grad_ctx + row * D) + (size_t)h * D + g);
            }
#pragma unroll
            for (int r = 0; r < 2; ++r)
                if (c0 + k1 + 8 * r < K)
                    store_pairs(grad_ln + ((size_t)b * K + c0 + k1 + 8 * r) * D, accl, r);
        }
    }
#pragma unroll
    for (int j = 0; j < NTD; ++j)
#pragma unroll
        for (int r = 0; r < 2; ++r)
            *reinterpret_cast<float2*>(gq_scratch + ((size_t)blockIdx.x * N_HORIZONS + h0 + g +
                                                     8 * r) * D + 8 * j + 2 * t) =
                make_float2(accq[j][2 * r], accq[j][2 * r + 1]);
}
#endif  // KC % (16 * RWARPS)
#endif

#if DSPLIT
// S [16 keys x H] = ln_chunk . X^T summed over every column: each warp's share over its DC
// columns (X [H, D] through L1) into shared memory, a barrier, then the shares added in warp
// order, the same sum in every warp; s in the accumulator layout (key g + 8 (e / 2), h 8j + 2t
// + e % 2)
__device__ __forceinline__ void dsplit_scores(float (&s)[NH8][4], const float* __restrict__ x,
                                              const float* ls, float* share)
{
    const int warp = threadIdx.x / 32, g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
    const int d0 = warp * DC;
#pragma unroll
    for (int j = 0; j < NH8; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#pragma unroll 4
    for (int k0 = d0; k0 < d0 + DC; k0 += 8) {
        unsigned ab[4], as[4];
        const float2 v0 = *reinterpret_cast<const float2*>(ls + g * LDR + k0 + 2 * t);
        const float2 v1 = *reinterpret_cast<const float2*>(ls + (g + 8) * LDR + k0 + 2 * t);
        split(v0.x, ab[0], as[0]);
        split(v1.x, ab[1], as[1]);
        split(v0.y, ab[2], as[2]);
        split(v1.y, ab[3], as[3]);
#pragma unroll
        for (int j = 0; j < NH8; ++j) {
            const float2 xv = __ldg(
                reinterpret_cast<const float2*>(x + (size_t)(8 * j + g) * D + k0 + 2 * t));
            unsigned bb[2], bs[2];
            split(xv.x, bb[0], bs[0]);
            split(xv.y, bb[1], bs[1]);
            mma_tf32(s[j], as, bb);
            mma_tf32(s[j], ab, bs);
            mma_tf32(s[j], ab, bb);
        }
    }
#pragma unroll
    for (int j = 0; j < NH8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e)
            share[(warp * 16 + g + 8 * (e / 2)) * H + 8 * j + 2 * t + e % 2] = s[j][e];
    __syncthreads();  // every warp's share is in
#pragma unroll
    for (int j = 0; j < NH8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            float v = 0.f;
#pragma unroll
            for (int u = 0; u < DWARPS; ++u)
                v += share[(u * 16 + g + 8 * (e / 2)) * H + 8 * j + 2 * t + e % 2];
            s[j][e] = v;
        }
}

// acc^T [DC x H] += ln_chunk[:, cols_w]^T . Y with Y [16 keys x H] the warp's copy yw (rows of
// LDP2); k-step kk's keys 8kk + 2t (slot t) and 8kk + 2t + 1 (slot t + 4)
__device__ __forceinline__ void dsplit_times(float (&acc)[MT_D][NH8][4], const float* yw,
                                             const float* ls)
{
    const int warp = threadIdx.x / 32, g = threadIdx.x % 32 / 4, t = threadIdx.x % 4;
#pragma unroll
    for (int kk = 0; kk < KC / 8; ++kk) {
        unsigned bb[NH8][2], bs[NH8][2];
#pragma unroll
        for (int j = 0; j < NH8; ++j) {
            split(yw[(8 * kk + 2 * t) * LDP2 + 8 * j + g], bb[j][0], bs[j][0]);
            split(yw[(8 * kk + 2 * t + 1) * LDP2 + 8 * j + g], bb[j][1], bs[j][1]);
        }
        const float* lk = ls + (8 * kk + 2 * t) * LDR + warp * DC + g;
#pragma unroll
        for (int i = 0; i < MT_D; ++i) {
            unsigned ab[4], as[4];
            split(lk[16 * i], ab[0], as[0]);
            split(lk[16 * i + 8], ab[1], as[1]);
            split(lk[LDR + 16 * i], ab[2], as[2]);
            split(lk[LDR + 16 * i + 8], ab[3], as[3]);
#pragma unroll
            for (int j = 0; j < NH8; ++j) {
                mma_tf32(acc[i][j], as, bb[j]);
                mma_tf32(acc[i][j], ab, bs[j]);
                mma_tf32(acc[i][j], ab, bb[j]);
            }
        }
    }
}

extern "C" __global__ void __launch_bounds__(RING_THREADS)
wide_forward_dsplit(WIDE_FORWARD_PARAMS)
{
    extern __shared__ __align__(16) float smem[];
    const int nck = (K + KC - 1) / KC, kp = nck * KC;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    float* ring = smem;
    float* share = ring + RSTAGES * KC * LDR;
    float* pw = share + DWARPS * 16 * H + warp * 16 * LDP2;
    float* sraw = share + DWARPS * 16 * H + DWARPS * 16 * LDP2;
    const int d0 = warp * DC;
    const int total = ring_start(ring, ln, B, nck, K);
    float acc[MT_D][NH8][4], m[NH8][2], l[NH8][2];
    for (int w = 0; w < total; ++w) {
        const int b = blockIdx.x + w / nck * gridDim.x, c0 = w % nck * KC;
        const float* ls = ring_next(ring, ln, w, total, nck, K);  // the shares free too
        if (c0 == 0) {
            zero_acc(acc);
#pragma unroll
            for (int j = 0; j < NH8; ++j) {
                m[j][0] = m[j][1] = -INFINITY;
                l[j][0] = l[j][1] = 0.f;
            }
        }
        float s[NH8][4];
        dsplit_scores(s, q_h, ls, share);
#pragma unroll
        for (int j = 0; j < NH8; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int key = g + 8 * (e / 2), h = 8 * j + 2 * t + e % 2;
                const float v = c0 + key < K ? s[j][e] * scale : -INFINITY;
                s[j][e] = v;
                if (warp == 0) sraw[h * kp + c0 + key] = v;
            }
        float alpha[NH8][2];
#pragma unroll
        for (int j = 0; j < NH8; ++j)
#pragma unroll
            for (int c = 0; c < 2; ++c) {  // horizon 8j + 2t + c: keys g and g + 8 a lane
                float mx = fmaxf(s[j][c], s[j][c + 2]);
                for (int o = 4; o < 32; o <<= 1) mx = fmaxf(mx, __shfl_xor_sync(FULL_MASK, mx, o));
                const float m_new = fmaxf(m[j][c], mx);
                alpha[j][c] = expf(m[j][c] - m_new);  // 0 at the row's first chunk
                m[j][c] = m_new;
                s[j][c] = expf(s[j][c] - m_new);
                s[j][c + 2] = expf(s[j][c + 2] - m_new);
                float sum = s[j][c] + s[j][c + 2];
                for (int o = 4; o < 32; o <<= 1) sum += __shfl_xor_sync(FULL_MASK, sum, o);
                l[j][c] = l[j][c] * alpha[j][c] + sum;
            }
#pragma unroll
        for (int j = 0; j < NH8; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e)
                pw[(g + 8 * (e / 2)) * LDP2 + 8 * j + 2 * t + e % 2] = s[j][e];
        __syncwarp();
#pragma unroll
        for (int i = 0; i < MT_D; ++i)
#pragma unroll
            for (int j = 0; j < NH8; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) acc[i][j][e] *= alpha[j][e % 2];
        dsplit_times(acc, pw, ls);  // ctx_w^T += ln_chunk[:, cols_w]^T . P
        if (c0 + KC >= K) {  // the row's last chunk: ctx from the registers, attn (warp 0)
            const size_t row = (size_t)b * H;
#pragma unroll
            for (int i = 0; i < MT_D; ++i)
#pragma unroll
                for (int j = 0; j < NH8; ++j)
#pragma unroll
                    for (int e = 0; e < 4; ++e)
                        ctx[(row + 8 * j + 2 * t + e % 2) * D + d0 + 16 * i + g + 8 * (e / 2)] =
                            acc[i][j][e] / l[j][e % 2];
            if (warp == 0) {
                __syncwarp();  // sraw is complete
                for (int e0 = 0; e0 < H * K; e0 += 32) {  // every lane through every shuffle
                    const int e = min(e0 + lane, H * K - 1), h = e / K, k = e % K;
                    float mh = 0.f, lh = 1.f;
#pragma unroll
                    for (int j = 0; j < NH8; ++j)
#pragma unroll
                        for (int c = 0; c < 2; ++c) {  // horizon 8j + 2t + c sits in lane t
                            const float mv = __shfl_sync(FULL_MASK, m[j][c], (h % 8) / 2);
                            const float lv = __shfl_sync(FULL_MASK, l[j][c], (h % 8) / 2);
                            if (h / 8 == j && h % 2 == c) {
                                mh = mv;
                                lh = lv;
                            }
                        }
                    if (e0 + lane < H * K) attn[row * K + e] = expf(sraw[h * kp + k] - mh) / lh;
                }
                __syncwarp();  // sraw is read before the next row's scores
            }
        }
    }
}

// The backward on the same plan, given ctx: per chunk
//   dw [16 keys x H] = ln_chunk . G^T (shares summed as the scores), sd = scale * A * (dw - c)
//   grad_q_w^T [DC x H] += ln_chunk[:, cols_w]^T . sd      (sd through the warp's copy; the
//                                                          block's partial over its rows)
//   grad_ln [16 keys x DC] = A^T . G[:, cols_w] + sd . q[:, cols_w]   (A and sd in the
//                                                          accumulator layout are the A fragments)
// Shared floats: DSPLIT_BWD_FLOATS (the forward's, less the raw scores; the copies hold sd).
#define NT_DC (DC / 8)

extern "C" __global__ void __launch_bounds__(RING_THREADS)
wide_backward_dsplit(WIDE_BACKWARD_PARAMS)
{
    extern __shared__ __align__(16) float smem[];
    const int nck = (K + KC - 1) / KC;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    float* ring = smem;
    float* share = ring + RSTAGES * KC * LDR;
    float* yw = share + DWARPS * 16 * H + warp * 16 * LDP2;
    const int d0 = warp * DC;
    const int total = ring_start(ring, ln, B, nck, K);
    float accq[MT_D][NH8][4], c[NH8][2];
    zero_acc(accq);
    for (int w = 0; w < total; ++w) {
        const int b = blockIdx.x + w / nck * gridDim.x, c0 = w % nck * KC;
        const size_t row = (size_t)b * H;
        const float* ls = ring_next(ring, ln, w, total, nck, K);  // the shares free too
        const float* gb = grad_ctx + row * D;
        if (c0 == 0) {  // c = G . ctx for horizons 8j + 2t + cc: a t's 8 lanes split D
#pragma unroll
            for (int j = 0; j < NH8; ++j)
#pragma unroll
                for (int cc = 0; cc < 2; ++cc) {
                    const int h = 8 * j + 2 * t + cc;
                    float v = 0.f;
                    for (int d = g; d < D; d += 8)
                        v += __ldg(gb + (size_t)h * D + d) * __ldg(ctx + (row + h) * D + d);
                    for (int o = 4; o < 32; o <<= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
                    c[j][cc] = v;
                }
        }
        float s[NH8][4], a[NH8][4];
        dsplit_scores(s, gb, ls, share);  // dw
#pragma unroll
        for (int j = 0; j < NH8; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int key = g + 8 * (e / 2), h = 8 * j + 2 * t + e % 2;
                a[j][e] = c0 + key < K ? __ldg(attn + (row + h) * K + c0 + key) : 0.f;
                s[j][e] = scale * a[j][e] * (s[j][e] - c[j][e % 2]);
                yw[key * LDP2 + h] = s[j][e];
            }
        __syncwarp();
        dsplit_times(accq, yw, ls);  // grad_q_w^T += ln_chunk[:, cols_w]^T . sd
        float accl[NT_DC][4];
#pragma unroll
        for (int n = 0; n < NT_DC; ++n) accl[n][0] = accl[n][1] = accl[n][2] = accl[n][3] = 0.f;
#pragma unroll
        for (int part = 0; part < 2; ++part)  // A^T . G, then sd . q
#pragma unroll
            for (int j = 0; j < NH8; ++j) {
                const float(&x)[4] = part ? s[j] : a[j];
                unsigned ab[4], as[4];
                split(x[0], ab[0], as[0]);
                split(x[2], ab[1], as[1]);
                split(x[1], ab[2], as[2]);
                split(x[3], ab[3], as[3]);
                times_rows(accl, ab, as, (part ? q_h : gb) + (size_t)(8 * j + 2 * t) * D + d0 + g);
            }
#pragma unroll
        for (int r = 0; r < 2; ++r)
            if (c0 + g + 8 * r < K)
                store_pairs(grad_ln + ((size_t)b * K + c0 + g + 8 * r) * D + d0, accl, r);
        __syncwarp();  // the copy is read before the next chunk's sd
    }
#pragma unroll
    for (int i = 0; i < MT_D; ++i)
#pragma unroll
        for (int j = 0; j < NH8; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e)
                gq_scratch[((size_t)blockIdx.x * H + 8 * j + 2 * t + e % 2) * D + d0 + 16 * i + g +
                           8 * (e / 2)] = accq[i][j][e];
}

#endif

#if BWD && !ROWS && !DSPLIT && !RATE && !WHOLE
// Backward given the forward's ctx (the softmax correction c = grad_ctx . ctx), N_HORIZONS a
// multiple of 16. Per chunk of KC keys, with G = grad_ctx[b] and A = attn[b] at those keys:
//   dw^T [KC x H]     = ln_chunk . G^T;  sd = scale * A * (dw - c)     (warps split the keys)
//   grad_ln [KC x D]  = [A^T | sd^T] . [G ; q]   (one product over 2H; warps split the keys)
//   grad_q_h [H x D] += sd . ln_chunk           (warps split D; a block's partial in registers
//                                                over all its rows, one scratch row a block)
#define LDG (D + 8)
#define LDW (KC + 8)
#define MT_L (KC / (16 * WARPS))
#define NB (D < 128 ? D : 128)   // grad_ln's columns a pass
#define MT_Q (H / 16)
#define NT_Q (D / (8 * WARPS))
// Shared floats: G and q [2H][LDG], two ln chunks [2][KC][LDL], A and sd [2H][LDW], c [H].
#define WIDE_BWD_FLOATS (2 * H * LDG + 2 * KC * LDL + 2 * H * LDW + H)

extern "C" __global__ void __launch_bounds__(NTH)
wide_backward(WIDE_BACKWARD_PARAMS)
{
    extern __shared__ __align__(16) float smem[];
    const int nck = (K + KC - 1) / KC;
    float* gq = smem;
    float* lbuf = gq + 2 * H * LDG;
    float* wa = lbuf + 2 * KC * LDL;
    float* c_s = wa + 2 * H * LDW;
    const int warp = threadIdx.x / 32;
    const int rows = blockIdx.x < B ? (B - 1 - blockIdx.x) / gridDim.x + 1 : 0;
    for (int e = threadIdx.x; e < H * D; e += NTH) gq[(H + e / D) * LDG + e % D] = q_h[e];
    float accq[MT_Q][NT_Q][4];
    zero_acc(accq);
    if (rows > 0) fetch_chunk(lbuf, ln, 0, nck, K);
    for (int w = 0; w < rows * nck; ++w) {
        const int b = blockIdx.x + w / nck * gridDim.x, c0 = w % nck * KC;
        float* ls = lbuf + (w & 1) * KC * LDL;
        __syncthreads();  // the last chunk's products are done with ln, G, A and sd
        next_chunk(lbuf, ln, w, rows * nck, nck, K);
        const size_t row = (size_t)b * H;
        if (c0 == 0) {  // the row's G, and c = G . ctx per horizon
            for (int e = threadIdx.x; e < H * D; e += NTH)
                gq[e / D * LDG + e % D] = grad_ctx[row * D + e];
            const int h = threadIdx.x / TPH, j = threadIdx.x % TPH;
            float v = 0.f;
            for (int d = j; d < D; d += TPH)
                v += grad_ctx[(row + h) * D + d] * ctx[(row + h) * D + d];
            v = group_sum<TPH>(v);
            if (j == 0) c_s[h] = v;
        }
        for (int e = threadIdx.x; e < H * KC; e += NTH) {
            const int h = e / KC, k = e % KC;
            wa[h * LDW + k] = c0 + k < K ? attn[(row + h) * K + c0 + k] : 0.f;
        }
        __syncthreads();
        keys_by_horizons<LDG>(ls, gq, [&](int key, int n, float v) {
            wa[(H + n) * LDW + key] = scale * wa[n * LDW + key] * (v - c_s[n]);
        });
        __syncthreads();
        const int r0 = warp * 16 * MT_L;
        for (int n0 = 0; n0 < D; n0 += NB) {
            float accl[MT_L][NB / 8][4];
            zero_acc(accl);
            warp_mma<MT_L, NB / 8, 2 * H / 8, true, LDW, true, LDG>(accl, wa + r0, gq + n0);
            each_acc(accl, [&](int m, int n, float v) {
                const int key = c0 + r0 + m;
                if (key < K) grad_ln[((size_t)b * K + key) * D + n0 + n] = v;
            });
        }
        warp_mma<MT_Q, NT_Q, KC / 8, false, LDW, true, LDL>(accq, wa + H * LDW,
                                                            ls + warp * 8 * NT_Q);
    }
    each_acc(accq, [&](int m, int n, float v) {
        gq_scratch[(size_t)blockIdx.x * H * D + m * D + warp * 8 * NT_Q + n] = v;
    });
}
#endif

#if WHOLE  // N_HORIZONS a multiple of 8, HIDDEN_DIM a multiple of 16 * WARPS, K <= KMAX; QG
// The fifth version: a block holds a whole row (K <= KMAX keys, a multiple of 16), so the row's
// work is three or four block-wide products with barriers between them, each spread over every
// warp, in place of the third version's chain of chunks in 16-horizon warps (latency-bound: a
// row's chunks ran one after another in two warps). The softmax runs over the whole row at
// once (no online rescale). Blocks loop over rows (a grid of B: one row a block).
// Forward, one row:
//   S^T [kp x H] = ln [kp x D] . q^T        items of 16 keys x H / SNS horizons over the warps
//   P = softmax of each horizon's row       a warp a horizon; attn written normalised
//   ctx^T [D x H] = ln^T [D x kp] . P^T     each warp D / WARPS columns, every horizon
// QG 1: q (and the backward's G) read through L1 from global memory, not staged in shared
// memory, so that more blocks share an SM.
#define LDW (D + 4)      // ln, q, G rows
#define LDK (KMAX + 4)   // key rows: scores, P, attn, sd
#define LDX (QG ? D : LDW)     // q and G rows where the products read them
#define XROWS (QG ? 0 : H)     // shared rows a staged q or G takes
#define CM (D / (16 * WARPS))  // a warp's m16 tiles of columns
static_assert(H % 8 == 0 && D % (16 * WARPS) == 0 && KMAX % 16 == 0 && NH8 % SNS == 0,
              "WHOLE sizes");
// Shared floats: q [XROWS][LDW], the row's ln [KMAX][LDW], scores and P [H][LDK].
#define WHOLE_FLOATS (XROWS * LDW + KMAX * LDW + H * LDK)

// rows [0, n) of src (rows of D floats, n <= KMAX) into dst (rows LDW apart) by cp.async, rows
// [n, kp) zeros; one commit group
__device__ __forceinline__ void fetch_rows(float* dst, const float* __restrict__ src, int n,
                                           int kp)
{
    for (int e = threadIdx.x; e < kp * D / 4; e += NTH) {
        const int r = e / (D / 4), c = e % (D / 4) * 4;
        const unsigned to = (unsigned)__cvta_generic_to_shared(dst + r * LDW + c);
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                     :: "r"(to), "l"(r < n ? src + (size_t)r * D + c : src), "r"(r < n ? 16 : 0));
    }
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// X^T [kp x H] = ln . x^T (x: [H] rows LDX apart) over the warps, f(key, h, value) for each
// key < kp
template <class F>
__device__ __forceinline__ void whole_by_horizons(const float* ls, const float* xs, int kp, F f)
{
    constexpr int NS = NH8 / SNS;  // n8 tiles an item
    for (int it = threadIdx.x / 32; it < kp / 16 * SNS; it += WARPS) {
        const int k0 = it / SNS * 16, h0 = it % SNS * 8 * NS;
        float acc[1][NS][4];
        zero_acc(acc);
        warp_mma<1, NS, D / 8, false, LDW, false, LDX>(acc, ls + k0 * LDW, xs + h0 * LDX);
        each_acc(acc, [&](int m, int n, float v) { f(k0 + m, h0 + n, v); });
    }
}

extern "C" __global__ void __launch_bounds__(NTH)
wide_forward_whole(WIDE_FORWARD_PARAMS)
{
    extern __shared__ __align__(16) float smem[];
    float* ls = smem + XROWS * LDW;
    float* ps = ls + KMAX * LDW;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, kp = (K + 15) / 16 * 16;
    const float* qs = QG ? q_h : smem;
    if (!QG) fetch_rows(smem, q_h, H, H);
    for (int b = blockIdx.x; b < B; b += gridDim.x) {
        fetch_rows(ls, ln + (size_t)b * K * D, K, kp);
        asm volatile("cp.async.wait_group 0;\n" ::: "memory");
        __syncthreads();
        whole_by_horizons(ls, qs, kp, [&](int key, int h, float v) {
            ps[h * LDK + key] = key < K ? v * scale : -INFINITY;
        });
        __syncthreads();
        for (int h = warp; h < H; h += WARPS) {  // every sum in lane order, then a fixed tree
            float* row = ps + h * LDK;
            float m = -INFINITY, l = 0.f;
            for (int k = lane; k < K; k += 32) m = fmaxf(m, row[k]);
            m = group_max<32>(m);
            for (int k = lane; k < K; k += 32) l += expf(row[k] - m);
            l = warp_sum(l);
            float* out = attn + ((size_t)b * H + h) * K;
            for (int k = lane; k < kp; k += 32) {
                const float p = k < K ? expf(row[k] - m) / l : 0.f;
                row[k] = p;
                if (k < K) out[k] = p;
            }
        }
        __syncthreads();
        float acc[CM][NH8][4];
        zero_acc(acc);
        const int d0 = warp * 16 * CM;
        for (int k0 = 0; k0 < kp; k0 += 16)
            warp_mma<CM, NH8, 2, true, LDW, false, LDK>(acc, ls + k0 * LDW + d0, ps + k0);
        each_acc(acc, [&](int m, int n, float v) {
            ctx[((size_t)b * H + n) * D + d0 + m] = v;
        });
        __syncthreads();  // ls and ps are free for the next row
    }
}

// Backward, one row, given attn (ctx is not needed: the whole row gives c = sum_k A dw):
//   dw^T [kp x H] = ln . G^T;  c_h = sum_k A dw;  sd = scale * A * (dw - c)
//   grad_ln [kp x D] = A^T . G + sd^T . q   items of 16 keys x 8 GN columns over the warps
//   grad_q^T [D x H] += ln^T . sd^T         each warp D / WARPS columns over all its rows in
//                                           registers; a scratch row a block at the end
// Shared floats: q, G [XROWS][LDW] each, ln [KMAX][LDW], A, sd [H][LDK] each.
#define WHOLE_BWD_FLOATS (2 * XROWS * LDW + KMAX * LDW + 2 * H * LDK)
static_assert(D % (8 * GN) == 0, "WHOLE grad_ln items");

extern "C" __global__ void __launch_bounds__(NTH)
wide_backward_whole(WIDE_BACKWARD_PARAMS)
{
    extern __shared__ __align__(16) float smem[];
    float* ls = smem + 2 * XROWS * LDW;
    float* as = ls + KMAX * LDW;
    float* ds = as + H * LDK;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, kp = (K + 15) / 16 * 16;
    const int d0 = warp * 16 * CM;
    const float* qs = QG ? q_h : smem;
    if (!QG) fetch_rows(smem, q_h, H, H);
    float accq[CM][NH8][4];
    zero_acc(accq);
    for (int b = blockIdx.x; b < B; b += gridDim.x) {
        const size_t row = (size_t)b * H;
        const float* gs = QG ? grad_ctx + row * D : smem + XROWS * LDW;
        fetch_rows(ls, ln + (size_t)b * K * D, K, kp);
        if (!QG) fetch_rows(smem + XROWS * LDW, grad_ctx + row * D, H, H);
        for (int e = threadIdx.x; e < H * kp; e += NTH) {
            const int h = e / kp, k = e % kp;
            as[h * LDK + k] = k < K ? attn[(row + h) * K + k] : 0.f;
        }
        asm volatile("cp.async.wait_group 0;\n" ::: "memory");
        __syncthreads();
        whole_by_horizons(ls, gs, kp, [&](int key, int h, float v) { ds[h * LDK + key] = v; });
        __syncthreads();
        for (int h = warp; h < H; h += WARPS) {
            const float* a = as + h * LDK;
            float* sd = ds + h * LDK;
            float c = 0.f;
            for (int k = lane; k < kp; k += 32) c += a[k] * sd[k];
            c = warp_sum(c);
            for (int k = lane; k < kp; k += 32) sd[k] = scale * a[k] * (sd[k] - c);
        }
        __syncthreads();
        for (int it = warp; it < kp / 16 * (D / (8 * GN)); it += WARPS) {
            const int k0 = it / (D / (8 * GN)) * 16, n0 = it % (D / (8 * GN)) * 8 * GN;
            float acc[1][GN][4];
            zero_acc(acc);
            warp_mma<1, GN, H / 8, true, LDK, true, LDX>(acc, as + k0, gs + n0);
            warp_mma<1, GN, H / 8, true, LDK, true, LDX>(acc, ds + k0, qs + n0);
            each_acc(acc, [&](int m, int n, float v) {
                if (k0 + m < K) grad_ln[((size_t)b * K + k0 + m) * D + n0 + n] = v;
            });
        }
        for (int k0 = 0; k0 < kp; k0 += 16)
            warp_mma<CM, NH8, 2, true, LDW, false, LDK>(accq, ls + k0 * LDW + d0, ds + k0);
        __syncthreads();  // ls, gs, as and ds are free for the next row
    }
    each_acc(accq, [&](int m, int n, float v) {
        gq_scratch[(size_t)blockIdx.x * H * D + n * D + d0 + m] = v;
    });
}
#endif

#if RATE
// mma.sync m16n8k8 TF32 throughput, the prototypes' ceiling: each warp issues ITERS rounds of 8
// independent accumulations (one 3xTF32 product is three of them)
extern "C" __global__ void mma_rate(float* __restrict__ out, const int iters)
{
    unsigned a[4], b[2];
    float acc[8][4];
#pragma unroll
    for (int i = 0; i < 4; ++i) a[i] = __float_as_uint(1e-3f * (threadIdx.x + i));
    b[0] = __float_as_uint(1e-3f * threadIdx.x);
    b[1] = __float_as_uint(2e-3f * threadIdx.x);
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
    for (int it = 0; it < iters; ++it)
#pragma unroll
        for (int j = 0; j < 8; ++j) mma_tf32(acc[j], a, b);
    float v = 0.f;
#pragma unroll
    for (int j = 0; j < 8; ++j) v += acc[j][0] + acc[j][1] + acc[j][2] + acc[j][3];
    out[blockIdx.x * blockDim.x + threadIdx.x] = v;  // keeps the products live
}
#endif
