// LAYOUT 3 (wide heads): one block per batch row, FP32 tiles through shared memory, flash-style
// over chunks of KC = CHUNK / HIDDEN_DIM keys (double-buffered by cp.async):
//   S[H][KC] = Q[H][D] . LN[KC][D]^T   thread tiles of 4 horizons x TK keys; D is split in
//                                      KSPLIT slices when H*KC is small, the slices summed in order
//   O[H][D] += P[H][KC] . LN[KC][D]     thread tiles of 4 horizons x 4 columns
// Needs N_HORIZONS % 4 == 0, HIDDEN_DIM % 4 == 0 and N_HORIZONS*HIDDEN_DIM <= 16*BLOCK (the
// host's restrictions say the same, so no variant that breaks them is ever compiled).
static_assert(N_HORIZONS % 4 == 0 && HIDDEN_DIM % 4 == 0 && N_HORIZONS * HIDDEN_DIM <= 16 * BLOCK,
              "LAYOUT 3: shape");
static_assert(KC >= 1 && KC % TK == 0 && T1 <= BLOCK && BLOCK % T1 == 0, "LAYOUT 3: tiles");
static_assert(HIDDEN_DIM % KSPLIT == 0 && DSLICE % 4 == 0, "LAYOUT 3: D slices");

// Chunk c of a batch row's ln into buf: KC rows (zeros past K), row stride WROW.
__device__ __forceinline__ void load_chunk(float* buf, const float* __restrict__ lnb, const int c,
                                           const int K)
{
    const int k0 = c * KC;
    for (int i = threadIdx.x; i < KC * HIDDEN_DIM / 4; i += BLOCK) {
        const int k = i / (HIDDEN_DIM / 4), d = i % (HIDDEN_DIM / 4) * 4;
        const bool valid = k0 + k < K;
        copy_async<16>(buf + k * WROW + d, valid ? lnb + (size_t)(k0 + k) * HIDDEN_DIM + d : lnb,
                       valid);
    }
    copy_commit();
}

// Visit v of a row walked over its nchunks chunks once or more: chunk v % nchunks, waited for
// after the next visit's copies are issued into the other buffer, then a block barrier.
__device__ __forceinline__ const float* next_chunk(float* lbuf, const float* __restrict__ lnb,
                                                   const int v, const int visits,
                                                   const int nchunks, const int K)
{
    if (v + 1 < visits) {
        load_chunk(lbuf + ((v + 1) & 1) * KC * WROW, lnb, (v + 1) % nchunks, K);
        asm volatile("cp.async.wait_group 1;\n" ::: "memory");
    } else {
        asm volatile("cp.async.wait_group 0;\n" ::: "memory");
    }
    __syncthreads();
    return lbuf + (v & 1) * KC * WROW;
}

// Partial products of the shared rows a[N_HORIZONS][WROW] with the chunk's keys: thread
// (slice s, horizon tile th, key tk) writes sp[s][h][k] for its 4 horizons and TK keys.
__device__ __forceinline__ void chunk_products(const float* a, const float* buf, float* sp)
{
    const int s = threadIdx.x / T1, t1 = threadIdx.x % T1;
    if (s >= KSPLIT) return;
    const int th = t1 / (KC / TK), tk = t1 % (KC / TK);
    float acc[4][TK];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < TK; ++j) acc[i][j] = 0.f;
    for (int d = s * DSLICE; d < (s + 1) * DSLICE; d += 4) {
        float4 qv[4], lv[TK];
#pragma unroll
        for (int i = 0; i < 4; ++i)
            qv[i] = *reinterpret_cast<const float4*>(a + (th * 4 + i) * WROW + d);
#pragma unroll
        for (int j = 0; j < TK; ++j)
            lv[j] = *reinterpret_cast<const float4*>(buf + (tk + j * (KC / TK)) * WROW + d);
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int j = 0; j < TK; ++j) {
                acc[i][j] = fmaf(qv[i].x, lv[j].x, acc[i][j]);
                acc[i][j] = fmaf(qv[i].y, lv[j].y, acc[i][j]);
                acc[i][j] = fmaf(qv[i].z, lv[j].z, acc[i][j]);
                acc[i][j] = fmaf(qv[i].w, lv[j].w, acc[i][j]);
            }
    }
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < TK; ++j)
            sp[(s * N_HORIZONS + th * 4 + i) * KC + tk + j * (KC / TK)] = acc[i][j];
}

// Keys a thread takes at once from the [N_HORIZONS][KC] rows in shared memory: one vector
// load of GK keys in place of GK scalar ones (the rows are 16-byte aligned, KC floats apart).
#define GK (KC % 4 == 0 ? 4 : KC % 2 == 0 ? 2 : 1)

// w[0..GK) = row[0..GK) in one shared-memory load.
__device__ __forceinline__ void load_span(const float* row, float (&w)[GK])
{
    if constexpr (GK == 4) {
        const float4 v = *reinterpret_cast<const float4*>(row);
        w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
    } else if constexpr (GK == 2) {
        const float2 v = *reinterpret_cast<const float2*>(row);
        w[0] = v.x, w[1] = v.y;
    } else {
        w[0] = row[0];
    }
}

// o[i][0..3] += sum over the chunk's keys of p[h0+i][k] * buf[k][d0..d0+3] (4x4 register tile),
// the keys in order; p's weights read GK keys at a time.
__device__ __forceinline__ void tile_accumulate(float (*o)[4], const float* p, const float* buf,
                                                const int h0, const int d0)
{
    for (int k = 0; k < KC; k += GK) {
        float w[4][GK];
#pragma unroll
        for (int i = 0; i < 4; ++i) load_span(p + (h0 + i) * KC + k, w[i]);
#pragma unroll
        for (int j = 0; j < GK; ++j) {
            const float4 lv = *reinterpret_cast<const float4*>(buf + (k + j) * WROW + d0);
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                o[i][0] = fmaf(w[i][j], lv.x, o[i][0]);
                o[i][1] = fmaf(w[i][j], lv.y, o[i][1]);
                o[i][2] = fmaf(w[i][j], lv.z, o[i][2]);
                o[i][3] = fmaf(w[i][j], lv.w, o[i][3]);
            }
        }
    }
}

// grad_ln of the chunk's keys, tiles of GK keys by 4 columns a thread: a warp's lanes are LK
// key tiles by LC column groups, so a step over the horizons reads LC float4s of grad_ctx and
// of q and LK spans of attn and of ds (a few wavefronts for 8*GK FMAs a lane). Each element
// sums over the horizons in order; the keys past K are computed from zeros, not stored.
#define KT (KC / GK)
#define LK (KT >= 8 ? 8 : KT >= 4 ? 4 : KT >= 2 ? 2 : 1)
#define LC (32 / LK)
#define WT_D ((HIDDEN_DIM / 4 + LC - 1) / LC)
#define WT_K ((KT + LK - 1) / LK)
__device__ __forceinline__ void chunk_grad_ln(const float* as, const float* ds, const float* gcs,
                                              const float* qs, float* __restrict__ glnb,
                                              const int k0, const int K, const int warp,
                                              const int lane)
{
    for (int t = warp; t < WT_K * WT_D; t += NWARPS) {
        const int kt = t / WT_D * LK + lane / LC, cg = t % WT_D * LC + lane % LC;
        if (kt >= KT || cg >= HIDDEN_DIM / 4) continue;
        const int k = kt * GK, d = cg * 4;
        float4 o[GK];
#pragma unroll
        for (int j = 0; j < GK; ++j) o[j] = make_float4(0.f, 0.f, 0.f, 0.f);
        for (int h = 0; h < N_HORIZONS; ++h) {
            float a[GK], s[GK];
            load_span(as + h * KC + k, a);
            load_span(ds + h * KC + k, s);
            const float4 g = *reinterpret_cast<const float4*>(gcs + h * WROW + d);
            const float4 q = *reinterpret_cast<const float4*>(qs + h * WROW + d);
#pragma unroll
            for (int j = 0; j < GK; ++j) {
                o[j].x = fmaf(a[j], g.x, fmaf(s[j], q.x, o[j].x));
                o[j].y = fmaf(a[j], g.y, fmaf(s[j], q.y, o[j].y));
                o[j].z = fmaf(a[j], g.z, fmaf(s[j], q.z, o[j].z));
                o[j].w = fmaf(a[j], g.w, fmaf(s[j], q.w, o[j].w));
            }
        }
#pragma unroll
        for (int j = 0; j < GK; ++j)
            if (k0 + k + j < K)
                *reinterpret_cast<float4*>(glnb + (size_t)(k0 + k + j) * HIDDEN_DIM + d) = o[j];
    }
}

// The chunk's attn[b, :, k0 .. k0+KC) into as[N_HORIZONS][KC] (zeros past K).
__device__ __forceinline__ void load_attn(float* as, const float* __restrict__ attnb, const int k0,
                                          const int K)
{
    for (int e = threadIdx.x; e < N_HORIZONS * KC; e += BLOCK) {
        const int k = k0 + e % KC;
        as[e] = k < K ? attnb[(size_t)(e / KC) * ATTN_STRIDE + k] : 0.f;
    }
}

// Forward: per chunk, the slices are summed in order by a warp per horizon, which writes the
// raw scores to attn, moves the running max and sum (log2 units: q is pre-scaled by
// scale*log2(e)) and leaves P = exp2(score - max) for the tile products. At the row's end ctx =
// O / l and attn is normalised in place (the block's own writes, ordered by its barriers).
// Dynamic shared memory (floats): qs [N_HORIZONS][WROW], ln chunks [2][KC][WROW], partial
// scores [KSPLIT][N_HORIZONS][KC] (P in slice 0), running max, sum and rescale [3][N_HORIZONS].
extern "C" __global__ void __launch_bounds__(BLOCK) pool_forward(POOL_FORWARD_PARAMS)
{
    pdl_wait();
    extern __shared__ __align__(16) float smem[];
    float *qs = smem, *lbuf = qs + L3_ROWS, *sp = lbuf + L3_CHUNKS, *mstat = sp + L3_PRODUCTS;
    float *lstat = mstat + N_HORIZONS, *corr = lstat + N_HORIZONS;

    const int b = blockIdx.x, tid = threadIdx.x;
    const int warp = tid >> 5, lane = tid & 31;
    const float* lnb = ln + (size_t)b * K * HIDDEN_DIM;
    float* attnb = attn + ATTN_ROW(b);
    const int nchunks = (K + KC - 1) / KC;

    load_chunk(lbuf, lnb, 0, K);
    for (int e = tid; e < N_HORIZONS * HIDDEN_DIM; e += BLOCK)
        qs[e / HIDDEN_DIM * WROW + e % HIDDEN_DIM] = q_h[e] * (scale * LOG2E);
    for (int h = tid; h < N_HORIZONS; h += BLOCK) {
        mstat[h] = -INFINITY;
        lstat[h] = 0.f;
    }
    // The O tile: horizons h0..h0+3, columns d0..d0+3 (threads past N_HORIZONS*HIDDEN_DIM/16
    // hold none).
    const bool tile = tid < N_HORIZONS * HIDDEN_DIM / 16;
    const int h0 = tid / (HIDDEN_DIM / 4) * 4, d0 = tid % (HIDDEN_DIM / 4) * 4;
    float o[4][4] = {};

    for (int c = 0; c < nchunks; ++c) {
        const float* buf = next_chunk(lbuf, lnb, c, nchunks, nchunks, K);
        chunk_products(qs, buf, sp);
        __syncthreads();
        for (int h = warp; h < N_HORIZONS; h += NWARPS) {
            const float mold = mstat[h];
            float mx = mold;
            for (int k = lane; k < KC; k += 32) {
                float v = 0.f;
                for (int t = 0; t < KSPLIT; ++t) v += sp[(t * N_HORIZONS + h) * KC + k];
                const bool valid = c * KC + k < K;
                v = valid ? v : -INFINITY;
                sp[h * KC + k] = v;
                if (valid) attnb[(size_t)h * ATTN_STRIDE + c * KC + k] = v;
                mx = fmaxf(mx, v);
            }
            mx = group_max<32>(mx);
            float sum = 0.f;
            for (int k = lane; k < KC; k += 32) {
                const float p = exp2f(sp[h * KC + k] - mx);  // 0 past K
                sp[h * KC + k] = p;
                sum += p;
            }
            sum = warp_sum(sum);
            __syncwarp();  // every lane has read mstat[h] before lane 0 moves it
            if (lane == 0) {
                const float f = mold == -INFINITY ? 0.f : exp2f(mold - mx);
                corr[h] = f;
                lstat[h] = fmaf(lstat[h], f, sum);
                mstat[h] = mx;
            }
        }
        __syncthreads();
        if (tile) {
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) o[i][j] *= corr[h0 + i];
            tile_accumulate(o, sp, buf, h0, d0);
        }
        __syncthreads();  // P and this buffer are free for the next chunk
    }

    if (tile) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const float inv = 1.f / lstat[h0 + i];
            *reinterpret_cast<float4*>(ctx + ((size_t)b * N_HORIZONS + h0 + i) * HIDDEN_DIM + d0)
                = make_float4(o[i][0] * inv, o[i][1] * inv, o[i][2] * inv, o[i][3] * inv);
        }
    }
    for (int h = warp; h < N_HORIZONS; h += NWARPS) {
        const float m = mstat[h], inv = 1.f / lstat[h];
#if SPLIT_COUNT > 1
        if (lane == 0) SPLIT_LSE(b, h) = (m + log2f(lstat[h])) / LOG2E;
#endif
        float* ah = attnb + (size_t)h * ATTN_STRIDE;
        for (int k = lane; k < K; k += 32) ah[k] = exp2f(ah[k] - m) * inv;
    }
}

// Backward, one pass over ln given the forward's ctx (two without: the first forms c):
//   c[h] = grad_ctx[b,h,:] . ctx[b,h,:] (+ sum_k attn*grad_attn)     a warp per horizon
//   per chunk: DW[H][KC] = GC . LN^T (chunk_products), DS = A * (DW + GA - c)
//              grad_ln[KC][D] = A^T . GC + DS^T . (scale*Q), written once with float4 stores
//              GQ[H][D] += DS . LN (4x4 register tiles)
//   gq_scratch[b] = scale * GQ, reduced over rows by reduce_axis0.
// Dynamic shared memory (floats): scale*Q and GC [2][N_HORIZONS][WROW]; ln chunks [2][KC][WROW];
// partial products [KSPLIT][N_HORIZONS][KC] (DS in slice 0); attn [N_HORIZONS][KC]; c [N_HORIZONS].
extern "C" __global__ void __launch_bounds__(BLOCK) pool_backward(POOL_BACKWARD_PARAMS)
{
    pdl_wait();
    extern __shared__ __align__(16) float smem[];
    float *qs = smem, *gcs = qs + L3_ROWS, *lbuf = gcs + L3_ROWS, *sp = lbuf + L3_CHUNKS;
    float *as = sp + L3_PRODUCTS, *cst = as + N_HORIZONS * KC;

    const int b = blockIdx.x, tid = threadIdx.x;
    const int warp = tid >> 5, lane = tid & 31;
    const float* lnb = ln + (size_t)b * K * HIDDEN_DIM;
    const float* attnb = attn + ATTN_ROW(b);
    const float* gab = grad_attn ? grad_attn + ATTN_ROW(b) : nullptr;
    const float* gcb = grad_ctx + (size_t)BATCH_ROW(b) * N_HORIZONS * HIDDEN_DIM;
    float* glnb = grad_ln + (size_t)b * K * HIDDEN_DIM;
    const int nchunks = (K + KC - 1) / KC;
    const int passes = ctx ? 1 : 2;  // without ctx, a first pass over the chunks forms c

    load_chunk(lbuf, lnb, 0, K);
    for (int e = tid; e < N_HORIZONS * HIDDEN_DIM; e += BLOCK) {
        qs[e / HIDDEN_DIM * WROW + e % HIDDEN_DIM] = q_h[e] * scale;
        gcs[e / HIDDEN_DIM * WROW + e % HIDDEN_DIM] = gcb[e];
    }
    for (int h = warp; h < N_HORIZONS; h += NWARPS) {
        float v = 0.f;
        if (ctx) {
            const float* cb = ctx + ((size_t)BATCH_ROW(b) * N_HORIZONS + h) * HIDDEN_DIM;
            for (int d = lane; d < HIDDEN_DIM; d += 32) v = fmaf(gcb[h * HIDDEN_DIM + d], cb[d], v);
        }
#if SPLIT_COUNT == 1
        if (gab)
            for (int k = lane; k < K; k += 32)
                v = fmaf(attnb[(size_t)h * K + k], gab[(size_t)h * K + k], v);
#endif
        v = warp_sum(v);
#if SPLIT_COUNT > 1
        if (gab) v += SPLIT_ATTN_DOT(b, h);
#endif
        if (lane == 0) cst[h] = v;
    }

    // GQ: the 4x4 tile at (h0, d0).
    const bool tile = tid < N_HORIZONS * HIDDEN_DIM / 16;
    const int h0 = tid / (HIDDEN_DIM / 4) * 4, d0 = tid % (HIDDEN_DIM / 4) * 4;
    float gq[4][4] = {};

    for (int v = 0; v < passes * nchunks; ++v) {
        const int k0 = v % nchunks * KC;
        load_attn(as, attnb, k0, K);
        const float* buf = next_chunk(lbuf, lnb, v, passes * nchunks, nchunks, K);
        chunk_products(gcs, buf, sp);
        __syncthreads();
        if (v < (passes - 1) * nchunks) {
            // First pass without ctx: c[h] += sum_k attn*dw, a warp per horizon in key order.
            for (int h = warp; h < N_HORIZONS; h += NWARPS) {
                float s = 0.f;
                for (int k = lane; k < KC; k += 32) {
                    float dw = 0.f;
                    for (int t = 0; t < KSPLIT; ++t) dw += sp[(t * N_HORIZONS + h) * KC + k];
                    s = fmaf(as[h * KC + k], dw, s);
                }
                s = warp_sum(s);
                if (lane == 0) cst[h] += s;
            }
            __syncthreads();
            continue;
        }
        for (int e = tid; e < N_HORIZONS * KC; e += BLOCK) {
            const int h = e / KC, k = k0 + e % KC;
            float dw = 0.f;
            for (int t = 0; t < KSPLIT; ++t) dw += sp[t * N_HORIZONS * KC + e];
            const float ga = gab && k < K ? gab[(size_t)h * ATTN_STRIDE + k] : 0.f;
            sp[e] = as[e] * (dw + ga - cst[h]);  // 0 past K: as is 0 there
        }
        __syncthreads();
        chunk_grad_ln(as, sp, gcs, qs, glnb, k0, K, warp, lane);
        if (tile) tile_accumulate(gq, sp, buf, h0, d0);
        __syncthreads();  // as, sp and this buffer are free for the next chunk
    }
    if (tile) {
        float* row = gq_scratch + (size_t)b * N_HORIZONS * HIDDEN_DIM;
#pragma unroll
        for (int i = 0; i < 4; ++i)
            *reinterpret_cast<float4*>(row + (h0 + i) * HIDDEN_DIM + d0) = make_float4(
                gq[i][0] * scale, gq[i][1] * scale, gq[i][2] * scale, gq[i][3] * scale);
    }
}
