// Per-horizon attention pool: N_HORIZONS learned queries attend over ln[B, K, HIDDEN_DIM].
// Template constants: N_HORIZONS, HIDDEN_DIM, BLOCK (threads), VEC (floats per load), UNROLL
// (keys in flight per warp), LAYOUT. No atomics: every output element has exactly one writer.
//   LAYOUT 0: one block per batch row; each warp owns keys k = warp*UNROLL + i*NWARPS*UNROLL
//     and holds the query rows in registers, so ln is streamed once per pass for all horizons.
//     Registers grow with N_HORIZONS*HIDDEN_DIM and shared memory with N_HORIZONS*K.
//   LAYOUT 1: one block per batch row, bounded registers and shared memory for any N_HORIZONS
//     <= 32, HIDDEN_DIM <= 1024 and any K: per-key dot products one horizon at a time, the
//     row's scores kept in global memory, weighted sums over keys split into column tiles.
//   LAYOUT 2: GROUP lanes per key, keys streamed through a per-warp ring of shared-memory
//     slots filled by cp.async, teams of warps per batch row, a grid of blocks looping over the
//     rows; the backward reads ln once and keeps grad_q_h's partial in registers. See below.
//   LAYOUT 3: wide heads (N_HORIZONS and HIDDEN_DIM multiples of 4): one block per batch row,
//     score and context products as FP32 register tiles over shared-memory chunks of keys.
#include "heads_common.cuh"

#define NWARPS (BLOCK / 32)
#define LOG2E 1.4426950408889634f

// Programmatic dependent launch (sm_90 on; the host launches this family with it where it can):
// nothing touches memory before the stream's previous kernel has finished and its writes are
// visible, so its tail and this launch overlap. There is no early trigger for the next kernel:
// its blocks would take SM slots while this grid still runs (a B=4096,K=64 forward measured
// 57 against 47 us with one). On a plain launch the wait does nothing.
__device__ __forceinline__ void pdl_wait()
{
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Rows k0 .. k0+UNROLL-1 of one batch row's ln (those below K), laid out over the warp by load_row.
__device__ __forceinline__ void load_keys(const float* __restrict__ lnb, const int k0, const int K,
                                          const int lane, float (*x)[ROW_PER_LANE])
{
#pragma unroll
    for (int u = 0; u < UNROLL; ++u)
        if (k0 + u < K) load_row(lnb + (size_t)(k0 + u) * HIDDEN_DIM, lane, x[u]);
}

// BYTES from global src to shared dst, asynchronously; valid == false writes zeros.
template <int BYTES>
__device__ __forceinline__ void copy_async(float* dst, const float* src, const bool valid)
{
    const unsigned d = (unsigned)__cvta_generic_to_shared(dst);
    const int n = valid ? BYTES : 0;
    if (BYTES == 16)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" :: "r"(d), "l"(src), "r"(n));
    else
        asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n"
                     :: "r"(d), "l"(src), "n"(BYTES), "r"(n));
}

__device__ __forceinline__ void copy_commit() { asm volatile("cp.async.commit_group;\n" ::); }

#if LAYOUT == 0

// Forward, single pass over ln with an online (flash-style) softmax per warp, merged across warps
// at the end. Dynamic shared memory (floats; wacc first so its vector stores stay 16-byte aligned):
//   wacc  [NWARPS * N_HORIZONS * HIDDEN_DIM]  per-warp unnormalised context
//   s     [N_HORIZONS * K]                    scaled scores, normalised into attn at the end
//   wm,wl [NWARPS * N_HORIZONS] each          per-warp running max / running sum
//   fm,fl [N_HORIZONS] each                   merged max / sum
extern "C" __global__ void __launch_bounds__(BLOCK)
pool_forward(const float* __restrict__ q_h, const float* __restrict__ ln,
             float* __restrict__ ctx, float* __restrict__ attn, const int K, const float scale,
             const int B)
{
    pdl_wait();
    extern __shared__ float smem[];
    float* wacc = smem;
    float* s = wacc + NWARPS * N_HORIZONS * HIDDEN_DIM;
    float* wm = s + N_HORIZONS * K;
    float* wl = wm + NWARPS * N_HORIZONS;
    float* fm = wl + NWARPS * N_HORIZONS;
    float* fl = fm + N_HORIZONS;

    const int b = blockIdx.x;
    const int warp = threadIdx.x >> 5;
    const int lane = threadIdx.x & 31;
    const float* lnb = ln + (size_t)b * K * HIDDEN_DIM;

    float q[N_HORIZONS][ROW_PER_LANE];
    float m[N_HORIZONS], l[N_HORIZONS], acc[N_HORIZONS][ROW_PER_LANE];
#pragma unroll
    for (int h = 0; h < N_HORIZONS; ++h) {
        load_row(q_h + h * HIDDEN_DIM, lane, q[h]);
        m[h] = -INFINITY;
        l[h] = 0.f;
#pragma unroll
        for (int j = 0; j < ROW_PER_LANE; ++j) acc[h][j] = 0.f;
    }

    for (int k0 = warp * UNROLL; k0 < K; k0 += NWARPS * UNROLL) {
        float x[UNROLL][ROW_PER_LANE];
        load_keys(lnb, k0, K, lane, x);
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            if (k0 + u >= K) continue;  // not break: the loop must stay fully unrolled
#pragma unroll
            for (int h = 0; h < N_HORIZONS; ++h) {
                float dot = 0.f;
#pragma unroll
                for (int j = 0; j < ROW_PER_LANE; ++j) dot = fmaf(q[h][j], x[u][j], dot);
                const float sc = warp_sum(dot) * scale;
                if (lane == 0) s[h * K + k0 + u] = sc;
                const float mn = fmaxf(m[h], sc);
                const float corr = __expf(m[h] - mn);  // fast exp: arguments <= 0, rel. error ~1e-6
                const float p = __expf(sc - mn);
                l[h] = fmaf(l[h], corr, p);
#pragma unroll
                for (int j = 0; j < ROW_PER_LANE; ++j)
                    acc[h][j] = fmaf(acc[h][j], corr, p * x[u][j]);
                m[h] = mn;
            }
        }
    }

    if (lane == 0) {
#pragma unroll
        for (int h = 0; h < N_HORIZONS; ++h) {
            wm[warp * N_HORIZONS + h] = m[h];
            wl[warp * N_HORIZONS + h] = l[h];
        }
    }
#pragma unroll
    for (int h = 0; h < N_HORIZONS; ++h)
        store_row(wacc + (warp * N_HORIZONS + h) * HIDDEN_DIM, lane, acc[h]);
    __syncthreads();

    if (threadIdx.x < N_HORIZONS) {
        const int h = threadIdx.x;
        float mx = -INFINITY;
        for (int w = 0; w < NWARPS; ++w) mx = fmaxf(mx, wm[w * N_HORIZONS + h]);
        float sum = 0.f;
        for (int w = 0; w < NWARPS; ++w)
            sum += wl[w * N_HORIZONS + h] * expf(wm[w * N_HORIZONS + h] - mx);
        fm[h] = mx;
        fl[h] = sum;
    }
    __syncthreads();

    float* ctxb = ctx + (size_t)b * N_HORIZONS * HIDDEN_DIM;
    for (int e = threadIdx.x; e < N_HORIZONS * HIDDEN_DIM; e += BLOCK) {
        const int h = e / HIDDEN_DIM;
        float v = 0.f;
        for (int w = 0; w < NWARPS; ++w)
            v += wacc[w * N_HORIZONS * HIDDEN_DIM + e] * expf(wm[w * N_HORIZONS + h] - fm[h]);
        ctxb[e] = v / fl[h];
    }
    float* attnb = attn + (size_t)b * N_HORIZONS * K;
    for (int e = threadIdx.x; e < N_HORIZONS * K; e += BLOCK) {
        const int h = e / K;
        attnb[e] = expf(s[e] - fm[h]) / fl[h];
    }
}

// Backward. Pass 1 (warp per key): dw[h,k] = grad_ctx[b,h,:] . ln[b,k,:] (+ grad_attn).
// Then c[h] = sum_k attn*dw and ds = attn*(dw - c). Given the forward's ctx, c[h] =
// grad_ctx[b,h,:] . ctx[b,h,:] (+ sum_k attn*grad_attn) instead, and pass 2 recomputes dw, so
// ln is read once. Pass 2 (warp per key): the grad_ln row
// sum_h attn*grad_ctx + scale*ds*q_h, written once, horizons summed in order; and the grad_q_h
// partial sum_k ds*ln kept in registers, merged across warps in a fixed order into the per-block
// scratch gq_scratch[b, h, :] (reduced over b by reduce_axis0). Dynamic shared memory (floats):
//   red [NWARPS*N_HORIZONS*HIDDEN_DIM] per-warp grad_q_h partials (first: 16-byte aligned),
//   sa [N_HORIZONS*K] attn row, sd [N_HORIZONS*K] dw then ds, sc [N_HORIZONS] c.
extern "C" __global__ void __launch_bounds__(BLOCK)
pool_backward(const float* __restrict__ q_h, const float* __restrict__ ln,
              const float* __restrict__ attn, const float* __restrict__ grad_ctx,
              const float* __restrict__ grad_attn, const float* __restrict__ ctx,
              float* __restrict__ grad_ln, float* __restrict__ gq_scratch,
              float* __restrict__ ds_scratch, const int K, const float scale,
              const int B)
{
    pdl_wait();
    extern __shared__ float smem[];
    float* red = smem;
    float* sa = red + NWARPS * N_HORIZONS * HIDDEN_DIM;
    float* sd = sa + N_HORIZONS * K;
    float* sc = sd + N_HORIZONS * K;

    const int b = blockIdx.x;
    const int warp = threadIdx.x >> 5;
    const int lane = threadIdx.x & 31;
    const float* lnb = ln + (size_t)b * K * HIDDEN_DIM;
    const float* attnb = attn + (size_t)b * N_HORIZONS * K;

    float gc[N_HORIZONS][ROW_PER_LANE];
#pragma unroll
    for (int h = 0; h < N_HORIZONS; ++h)
        load_row(grad_ctx + ((size_t)b * N_HORIZONS + h) * HIDDEN_DIM, lane, gc[h]);
    for (int e = threadIdx.x; e < N_HORIZONS * K; e += BLOCK) sa[e] = attnb[e];
    const float* gab = grad_attn ? grad_attn + (size_t)b * N_HORIZONS * K : nullptr;

    float cr[N_HORIZONS];  // given ctx: c[h] in every warp's registers
    if (ctx) {
#pragma unroll
        for (int h = 0; h < N_HORIZONS; ++h) {
            float y[ROW_PER_LANE];
            load_row(ctx + ((size_t)b * N_HORIZONS + h) * HIDDEN_DIM, lane, y);
            float v = 0.f;
#pragma unroll
            for (int j = 0; j < ROW_PER_LANE; ++j) v = fmaf(gc[h][j], y[j], v);
            cr[h] = warp_sum(v);
        }
        if (gab) {
            __syncthreads();
            for (int h = warp; h < N_HORIZONS; h += NWARPS) {
                float v = 0.f;
                for (int k = lane; k < K; k += 32) v = fmaf(sa[h * K + k], gab[h * K + k], v);
                v = warp_sum(v);
                if (lane == 0) sc[h] = v;
            }
        }
    }
    for (int k0 = warp * UNROLL; !ctx && k0 < K; k0 += NWARPS * UNROLL) {
        float x[UNROLL][ROW_PER_LANE];
        load_keys(lnb, k0, K, lane, x);
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            if (k0 + u >= K) continue;
#pragma unroll
            for (int h = 0; h < N_HORIZONS; ++h) {
                float dot = 0.f;
#pragma unroll
                for (int j = 0; j < ROW_PER_LANE; ++j) dot = fmaf(gc[h][j], x[u][j], dot);
                dot = warp_sum(dot);
                if (lane == 0) {
                    const int e = h * K + k0 + u;
                    sd[e] = gab ? dot + gab[e] : dot;
                }
            }
        }
    }
    __syncthreads();
    if (!ctx) {
        for (int h = warp; h < N_HORIZONS; h += NWARPS) {
            float c = 0.f;
            for (int k = lane; k < K; k += 32) c = fmaf(sa[h * K + k], sd[h * K + k], c);
            c = warp_sum(c);
            if (lane == 0) sc[h] = c;
        }
        __syncthreads();
        for (int e = threadIdx.x; e < N_HORIZONS * K; e += BLOCK)
            sd[e] = sa[e] * (sd[e] - sc[e / K]);
        __syncthreads();
    }

    float q[N_HORIZONS][ROW_PER_LANE], gq[N_HORIZONS][ROW_PER_LANE];
#pragma unroll
    for (int h = 0; h < N_HORIZONS; ++h) {
        load_row(q_h + h * HIDDEN_DIM, lane, q[h]);
#pragma unroll
        for (int j = 0; j < ROW_PER_LANE; ++j) gq[h][j] = 0.f;
    }
    float* glnb = grad_ln + (size_t)b * K * HIDDEN_DIM;
    for (int k0 = warp * UNROLL; k0 < K; k0 += NWARPS * UNROLL) {
        float x[UNROLL][ROW_PER_LANE];
        load_keys(lnb, k0, K, lane, x);
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const int k = k0 + u;
            if (k >= K) continue;
            float out[ROW_PER_LANE];
#pragma unroll
            for (int j = 0; j < ROW_PER_LANE; ++j) out[j] = 0.f;
#pragma unroll
            for (int h = 0; h < N_HORIZONS; ++h) {
                const float a = sa[h * K + k];
                float d;
                if (ctx) {
                    float dot = 0.f;
#pragma unroll
                    for (int j = 0; j < ROW_PER_LANE; ++j) dot = fmaf(gc[h][j], x[u][j], dot);
                    dot = warp_sum(dot);
                    d = a * ((gab ? dot + gab[h * K + k] : dot) - cr[h] - (gab ? sc[h] : 0.f));
                } else {
                    d = sd[h * K + k];
                }
                const float ds = scale * d;
#pragma unroll
                for (int j = 0; j < ROW_PER_LANE; ++j) {
                    out[j] = fmaf(a, gc[h][j], fmaf(ds, q[h][j], out[j]));
                    gq[h][j] = fmaf(d, x[u][j], gq[h][j]);
                }
            }
            store_row(glnb + (size_t)k * HIDDEN_DIM, lane, out);
        }
    }
#pragma unroll
    for (int h = 0; h < N_HORIZONS; ++h)
        store_row(red + (warp * N_HORIZONS + h) * HIDDEN_DIM, lane, gq[h]);
    __syncthreads();
    float* gqb = gq_scratch + (size_t)b * N_HORIZONS * HIDDEN_DIM;
    for (int e = threadIdx.x; e < N_HORIZONS * HIDDEN_DIM; e += BLOCK) {
        float v = 0.f;
        for (int w = 0; w < NWARPS; ++w) v += red[w * N_HORIZONS * HIDDEN_DIM + e];
        gqb[e] = scale * v;
    }
}
#elif LAYOUT == 1
// out[h, :] = mult * sum_k w[h*K + k] * rows[k, :] for every horizon, in a fixed order. An item
// is a tile of HTILE horizons by VEC columns; when there are fewer items than threads, SLICES
// threads share an item's keys (k = slice + i*SLICES) and their partial sums are added in slice
// order through red [SLICES*ITEMS*HTILE*VEC floats] (dynamic shared memory).
#define HTILE (N_HORIZONS < 8 ? N_HORIZONS : 8)
#define DCHUNKS (HIDDEN_DIM / VEC)
#define ITEMS ((N_HORIZONS + HTILE - 1) / HTILE * DCHUNKS)
#define SLICES (ITEMS < BLOCK ? BLOCK / ITEMS : 1)

__device__ __forceinline__ void tile_sum(const float* w, const float* __restrict__ rows,
                                         const int K, const int item, const int k0,
                                         const int kstep, float* acc)
{
    const int h0 = item / DCHUNKS * HTILE;
    const int d = item % DCHUNKS * VEC;
#pragma unroll
    for (int j = 0; j < HTILE * VEC; ++j) acc[j] = 0.f;
    for (int k = k0; k < K; k += kstep) {
        float x[VEC];
        load_vec<VEC>(rows + (size_t)k * HIDDEN_DIM + d, x);
#pragma unroll
        for (int t = 0; t < HTILE; ++t) {
            if (h0 + t >= N_HORIZONS) break;
            const float a = w[(size_t)(h0 + t) * K + k];
#pragma unroll
            for (int v = 0; v < VEC; ++v) acc[t * VEC + v] = fmaf(a, x[v], acc[t * VEC + v]);
        }
    }
}

__device__ __forceinline__ void store_tile(float* out, const int item, const float mult,
                                           float* acc)
{
    const int h0 = item / DCHUNKS * HTILE;
    const int d = item % DCHUNKS * VEC;
#pragma unroll
    for (int t = 0; t < HTILE; ++t) {
        if (h0 + t >= N_HORIZONS) break;
#pragma unroll
        for (int v = 0; v < VEC; ++v) acc[t * VEC + v] *= mult;
        store_vec<VEC>(out + (h0 + t) * HIDDEN_DIM + d, acc + t * VEC);
    }
}

__device__ __forceinline__ void weighted_rows(const float* w, const float* __restrict__ rows,
                                              const int K, const float mult, float* out,
                                              float* red)
{
    float acc[HTILE * VEC];
    if (SLICES == 1) {
        for (int item = threadIdx.x; item < ITEMS; item += BLOCK) {
            tile_sum(w, rows, K, item, 0, 1, acc);
            store_tile(out, item, mult, acc);
        }
        return;
    }
    if (threadIdx.x < SLICES * ITEMS) {
        tile_sum(w, rows, K, threadIdx.x % ITEMS, threadIdx.x / ITEMS, SLICES, acc);
#pragma unroll
        for (int j = 0; j < HTILE * VEC; ++j) red[threadIdx.x * HTILE * VEC + j] = acc[j];
    }
    __syncthreads();
    if (threadIdx.x < ITEMS) {
#pragma unroll
        for (int j = 0; j < HTILE * VEC; ++j) acc[j] = red[threadIdx.x * HTILE * VEC + j];
        for (int s = 1; s < SLICES; ++s)
#pragma unroll
            for (int j = 0; j < HTILE * VEC; ++j)
                acc[j] += red[(s * ITEMS + threadIdx.x) * HTILE * VEC + j];
        store_tile(out, threadIdx.x, mult, acc);
    }
}

// dot = a[0:HIDDEN_DIM] . x (x one row of ln spread over the warp as load_row lays it out).
__device__ __forceinline__ float row_dot(const float* __restrict__ a, const int lane,
                                         const float* x)
{
    float y[ROW_PER_LANE];
    load_row(a, lane, y);
    float dot = 0.f;
#pragma unroll
    for (int j = 0; j < ROW_PER_LANE; ++j) dot = fmaf(y[j], x[j], dot);
    return warp_sum(dot);
}

// Forward. Warp per key: the raw scaled scores go to attn[b]; then one warp per horizon finds
// the row's max and sum (lanes stride keys, fixed order), every score is normalised in place,
// and ctx[b] = attn[b] @ ln[b] by weighted_rows. Global writes of this block are visible to
// the block after __syncthreads, so attn needs no shared copy and K is unbounded.
extern "C" __global__ void __launch_bounds__(BLOCK)
pool_forward(const float* __restrict__ q_h, const float* __restrict__ ln,
             float* __restrict__ ctx, float* __restrict__ attn, const int K, const float scale,
             const int B)
{
    pdl_wait();
    extern __shared__ float smem[];
    __shared__ float fm[N_HORIZONS], fl[N_HORIZONS];
    const int b = blockIdx.x;
    const int warp = threadIdx.x >> 5;
    const int lane = threadIdx.x & 31;
    const float* lnb = ln + (size_t)b * K * HIDDEN_DIM;
    float* attnb = attn + (size_t)b * N_HORIZONS * K;

    for (int k0 = warp * UNROLL; k0 < K; k0 += NWARPS * UNROLL) {
        float x[UNROLL][ROW_PER_LANE];
        load_keys(lnb, k0, K, lane, x);
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            if (k0 + u >= K) continue;
#pragma unroll 1
            for (int h = 0; h < N_HORIZONS; ++h) {
                const float sc = row_dot(q_h + h * HIDDEN_DIM, lane, x[u]) * scale;
                if (lane == 0) attnb[(size_t)h * K + k0 + u] = sc;
            }
        }
    }
    __syncthreads();

    for (int h = warp; h < N_HORIZONS; h += NWARPS) {
        const float* s = attnb + (size_t)h * K;
        float mx = -INFINITY;
        for (int k = lane; k < K; k += 32) mx = fmaxf(mx, s[k]);
        mx = group_max<32>(mx);
        float sum = 0.f;
        for (int k = lane; k < K; k += 32) sum += __expf(s[k] - mx);
        sum = warp_sum(sum);
        if (lane == 0) {
            fm[h] = mx;
            fl[h] = sum;
        }
    }
    __syncthreads();
    for (int e = threadIdx.x; e < N_HORIZONS * K; e += BLOCK) {
        const int h = e / K;
        attnb[e] = __expf(attnb[e] - fm[h]) / fl[h];
    }
    __syncthreads();
    weighted_rows(attnb, lnb, K, 1.f, ctx + (size_t)b * N_HORIZONS * HIDDEN_DIM, smem);
}

// Backward. c[h] = sum_k attn*(dw + grad_attn), dw[h,k] = grad_ctx[b,h,:] . ln[b,k,:]: from the
// forward's ctx when given (sum_k attn*dw = grad_ctx . ctx), else from a pass over ln; each
// warp's share is held by lane h and the shares are added in warp order. Then warp per key:
// ds = attn*(dw + grad_attn - c) goes to ds_scratch[b] and the grad_ln row is written once;
// finally gq_scratch[b] = scale * ds @ ln[b] by weighted_rows (reduced over b by reduce_axis0).
extern "C" __global__ void __launch_bounds__(BLOCK)
pool_backward(const float* __restrict__ q_h, const float* __restrict__ ln,
              const float* __restrict__ attn, const float* __restrict__ grad_ctx,
              const float* __restrict__ grad_attn, const float* __restrict__ ctx,
              float* __restrict__ grad_ln, float* __restrict__ gq_scratch,
              float* __restrict__ ds_scratch, const int K, const float scale,
              const int B)
{
    pdl_wait();
    extern __shared__ float smem[];
    __shared__ float cw[NWARPS][N_HORIZONS], sc[N_HORIZONS];
    const int b = blockIdx.x;
    const int warp = threadIdx.x >> 5;
    const int lane = threadIdx.x & 31;
    const float* lnb = ln + (size_t)b * K * HIDDEN_DIM;
    const float* attnb = attn + (size_t)b * N_HORIZONS * K;
    const float* gab = grad_attn ? grad_attn + (size_t)b * N_HORIZONS * K : nullptr;
    const float* gcb = grad_ctx + (size_t)b * N_HORIZONS * HIDDEN_DIM;
    float* dsb = ds_scratch + (size_t)b * N_HORIZONS * K;

    float share = 0.f;
    if (ctx) {
        for (int h = warp; h < N_HORIZONS; h += NWARPS) {
            float c[ROW_PER_LANE];
            load_row(ctx + ((size_t)b * N_HORIZONS + h) * HIDDEN_DIM, lane, c);
            const float dot = row_dot(gcb + h * HIDDEN_DIM, lane, c);
            if (lane == h) share += dot;
        }
    } else {
        for (int k0 = warp * UNROLL; k0 < K; k0 += NWARPS * UNROLL) {
            float x[UNROLL][ROW_PER_LANE];
            load_keys(lnb, k0, K, lane, x);
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                if (k0 + u >= K) continue;
#pragma unroll 1
                for (int h = 0; h < N_HORIZONS; ++h) {
                    const float dot = row_dot(gcb + h * HIDDEN_DIM, lane, x[u]);
                    if (lane == h) share = fmaf(attnb[(size_t)h * K + k0 + u], dot, share);
                }
            }
        }
    }
    if (gab)
        for (int h = warp; h < N_HORIZONS; h += NWARPS) {
            float v = 0.f;
            for (int k = lane; k < K; k += 32)
                v = fmaf(attnb[(size_t)h * K + k], gab[(size_t)h * K + k], v);
            v = warp_sum(v);
            if (lane == h) share += v;
        }
    if (lane < N_HORIZONS) cw[warp][lane] = share;
    __syncthreads();
    if (threadIdx.x < N_HORIZONS) {
        float c = 0.f;
        for (int w = 0; w < NWARPS; ++w) c += cw[w][threadIdx.x];
        sc[threadIdx.x] = c;
    }
    __syncthreads();

    float* glnb = grad_ln + (size_t)b * K * HIDDEN_DIM;
    for (int k0 = warp * UNROLL; k0 < K; k0 += NWARPS * UNROLL) {
        float x[UNROLL][ROW_PER_LANE];
        load_keys(lnb, k0, K, lane, x);
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const int k = k0 + u;
            if (k >= K) continue;
            float out[ROW_PER_LANE];
#pragma unroll
            for (int j = 0; j < ROW_PER_LANE; ++j) out[j] = 0.f;
#pragma unroll 1
            for (int h = 0; h < N_HORIZONS; ++h) {
                const size_t e = (size_t)h * K + k;
                float g[ROW_PER_LANE];
                load_row(gcb + h * HIDDEN_DIM, lane, g);
                float dot = 0.f;
#pragma unroll
                for (int j = 0; j < ROW_PER_LANE; ++j) dot = fmaf(g[j], x[u][j], dot);
                dot = warp_sum(dot);
                const float a = attnb[e];
                const float d = a * ((gab ? dot + gab[e] : dot) - sc[h]);
                if (lane == 0) dsb[e] = d;
#pragma unroll
                for (int j = 0; j < ROW_PER_LANE; ++j) out[j] = fmaf(a, g[j], out[j]);
                load_row(q_h + h * HIDDEN_DIM, lane, g);
                const float ds = scale * d;
#pragma unroll
                for (int j = 0; j < ROW_PER_LANE; ++j) out[j] = fmaf(ds, g[j], out[j]);
            }
            store_row(glnb + (size_t)k * HIDDEN_DIM, lane, out);
        }
    }
    __syncthreads();
    weighted_rows(dsb, lnb, K, scale, gq_scratch + (size_t)b * N_HORIZONS * HIDDEN_DIM, smem);
}
#elif LAYOUT == 2
// LAYOUT 2: lane groups over keys, a cp.async ring per warp, teams of warps per batch row.
//   Work: team `team` of TW = NWARPS/TEAMS warps owns batch rows (blockIdx.x + i*gridDim.x)*TEAMS
//   + team, i = 0, 1, ... (the host sizes the grid: a row per team, or GRID blocks per SM).
//   In a row, warp wt of the team takes steps wt, wt+TW, ... of SKEYS = KPW*GROUP_KEYS
//   consecutive keys (KPW = 32/GROUP lane groups, GROUP_KEYS keys each); lane group g
//   (GROUP lanes) owns keys u*KPW + g of the step, and lane gl of the group holds columns
//   (c*GROUP + gl)*VEC + v, so a per-key dot product is a GROUP-lane butterfly.
//   Loads: every warp streams its steps through its own ring of STAGES shared-memory slots,
//   filled by cp.async STAGES-1 steps ahead, across row ends. MIN_BLOCKS > 0 caps the
//   registers so that many blocks fit on an SM. Every sum runs in a fixed order: no atomics,
//   bitwise reproducible for a given grid.
#ifndef GROUP_KEYS
#define GROUP_KEYS 1
#endif
// MIN_BLOCKS 0 leaves registers to ptxas; an explicit minimum of 1 would let it take 255.
#if MIN_BLOCKS > 0
#define LAYOUT2_BOUNDS __launch_bounds__(BLOCK, MIN_BLOCKS)
#else
#define LAYOUT2_BOUNDS __launch_bounds__(BLOCK)
#endif
#define KPW (32 / GROUP)
#define SKEYS (KPW * GROUP_KEYS)
#define GCHUNKS ((HIDDEN_DIM + GROUP * VEC - 1) / (GROUP * VEC))
#define GCOLS (GCHUNKS * VEC)
#define TW (NWARPS / TEAMS)
#define MARGIN 8.f
#ifndef SMEM_SCORES
#define SMEM_SCORES 0
#endif
#if SMEM_SCORES && TW != 1
#error "SMEM_SCORES needs one-warp teams"
#endif
// Ring slot (floats): the step's SKEYS ln rows; the backward's also holds attn and grad_attn
// at those keys ([2][N_HORIZONS][SKEYS], rounded up to keep slots 16-byte aligned).
#define FSLOT (SKEYS * HIDDEN_DIM)
#define BEXTRA ((2 * N_HORIZONS * SKEYS + 3) / 4 * 4)
#define BSLOT (FSLOT + BEXTRA)

// Every group of this thread's copies but the newest STAGES-1 (the steps ahead) is complete.
__device__ __forceinline__ void copy_wait()
{
    asm volatile("cp.async.wait_group %0;\n" :: "n"(STAGES - 1) : "memory");
}

// A row's columns held by lane gl of a lane group of G lanes (0 past HIDDEN_DIM). Plain loads,
// so row may be in shared memory; G = 32 is load_row's layout.
template <int G = GROUP>
__device__ __forceinline__ void group_cols(const float* row, const int gl, float* out)
{
#pragma unroll
    for (int c = 0; c < (HIDDEN_DIM + G * VEC - 1) / (G * VEC); ++c) {
        const int d = (c * G + gl) * VEC;
#pragma unroll
        for (int v = 0; v < VEC; ++v) out[c * VEC + v] = 0.f;
        if (d < HIDDEN_DIM) {
            if (VEC == 4) {
                const float4 t = *reinterpret_cast<const float4*>(row + d);
                out[c * VEC] = t.x; out[c * VEC + 1] = t.y;
                out[c * VEC + 2] = t.z; out[c * VEC + 3] = t.w;
            } else if (VEC == 2) {
                const float2 t = *reinterpret_cast<const float2*>(row + d);
                out[c * VEC] = t.x; out[c * VEC + 1] = t.y;
            } else {
                out[c * VEC] = row[d];
            }
        }
    }
}

// The columns lane gl holds, times mult, into row (VEC-wide stores; nothing past HIDDEN_DIM).
__device__ __forceinline__ void store_group_cols(float* row, const int gl, const float* in,
                                                 const float mult)
{
#pragma unroll
    for (int c = 0; c < GCHUNKS; ++c) {
        const int d = (c * GROUP + gl) * VEC;
        float o[VEC];
#pragma unroll
        for (int v = 0; v < VEC; ++v) o[v] = in[c * VEC + v] * mult;
        if (d < HIDDEN_DIM) store_vec<VEC>(row + d, o);
    }
}

// a . b over a lane's GCOLS columns in two independent partial sums: half the dependency
// chain of one running sum (measured 3-5% faster than one at GCOLS 16).
__device__ __forceinline__ float lane_dot(const float* a, const float* b)
{
    float even = 0.f, odd = 0.f;
#pragma unroll
    for (int c = 0; c < GCOLS; c += 2) {
        even = fmaf(a[c], b[c], even);
        if (c + 1 < GCOLS) odd = fmaf(a[c + 1], b[c + 1], odd);
    }
    return even + odd;
}

// v summed over the warp's lane groups (lanes gl, gl+GROUP, ...): every group ends with the sum.
__device__ __forceinline__ float across_groups(float v)
{
#pragma unroll
    for (int o = GROUP; o < 32; o <<= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    return v;
}

__device__ __forceinline__ void team_sync(const int team)
{
#if TW == 1
    __syncwarp();
#elif TEAMS == 1
    __syncthreads();
#else
    asm volatile("bar.sync %0, %1;\n" :: "r"(team + 1), "n"(TW * 32) : "memory");
#endif
}

// A warp's rows (r = 0 .. rows-1) and its steps j = 0 .. per_row-1 in each of them.
struct Walk {
    int first_row, stride, rows, per_row, wt;
    __device__ Walk(const int B, const int K, const int team, const int wt_) : wt(wt_) {
        stride = gridDim.x * TEAMS;
        first_row = blockIdx.x * TEAMS + team;
        rows = first_row < B ? (B - first_row + stride - 1) / stride : 0;
        const int nsteps = (K + SKEYS - 1) / SKEYS;
        per_row = nsteps > wt ? (nsteps - wt + TW - 1) / TW : 0;
    }
    __device__ int row(const int r) const { return first_row + r * stride; }
    __device__ int key0(const int j) const { return (wt + j * TW) * SKEYS; }
};

// The producer side of a warp's ring: the (row, step) it copies next and the slot it goes to.
// A slot gets ln rows key0 .. key0+SKEYS-1 (zeros past K) and, when `extra`, attn and grad_attn
// at those keys (zeros where grad_attn is absent).
// The constructor takes warp `warp`'s ring out of `rings` and issues its first STAGES-1 steps.
template <int SLOT>
struct Ring {
    float* slots;
    int pr, pj, pslot;
    __device__ Ring(float* rings, const int warp, const Walk& w, const float* __restrict__ ln,
                    const float* __restrict__ attn, const float* __restrict__ gab, const int K,
                    const int lane, const bool extra)
        : slots(rings + warp * STAGES * SLOT), pr(w.per_row ? 0 : w.rows), pj(0), pslot(0)
    {
#pragma unroll
        for (int i = 0; i < STAGES - 1; ++i) issue(w, ln, attn, gab, K, lane, extra);
    }

    __device__ void issue(const Walk& w, const float* __restrict__ ln,
                          const float* __restrict__ attn, const float* __restrict__ gab,
                          const int K, const int lane, const bool extra)
    {
        if (pr < w.rows) {
            const int b = w.row(pr), k0 = w.key0(pj);
            const float* src = ln + ((size_t)b * K + k0) * HIDDEN_DIM;
            float* dst = slots + pslot * SLOT;
#pragma unroll 4
            for (int i = lane; i < FSLOT / VEC; i += 32) {
                const bool valid = k0 + i * VEC / HIDDEN_DIM < K;
                copy_async<4 * VEC>(dst + i * VEC, valid ? src + i * VEC : ln, valid);
            }
            for (int i = lane; extra && i < 2 * N_HORIZONS * SKEYS; i += 32) {
                const int h = i / SKEYS % N_HORIZONS, j = i % SKEYS;
                const float* from = i < N_HORIZONS * SKEYS ? attn : gab;
                const bool valid = from != nullptr && k0 + j < K;
                copy_async<4>(dst + FSLOT + i,
                              valid ? from + ((size_t)b * N_HORIZONS + h) * K + k0 + j : ln, valid);
            }
            if (++pj == w.per_row) { pj = 0; ++pr; }
            pslot = pslot + 1 == STAGES ? 0 : pslot + 1;
        }
        copy_commit();
    }
};

// A row's online-softmax state: running max, sum and accumulators, empty.
template <int COLS>
__device__ __forceinline__ void row_start(float (&m)[N_HORIZONS], float (&l)[N_HORIZONS],
                                          float (&acc)[N_HORIZONS][COLS])
{
#pragma unroll
    for (int h = 0; h < N_HORIZONS; ++h) {
        m[h] = -INFINITY;
        l[h] = 0.f;
#pragma unroll
        for (int j = 0; j < COLS; ++j) acc[h][j] = 0.f;
    }
}

#if LANE_ACC && (TW != 1 || SKEYS % 4)
#error "LANE_ACC needs one-warp teams and steps of a multiple of 4 keys"
#endif
// Forward. Scores: a lane group per key (q read once for the group's GROUP_KEYS keys).
// Softmax: online, in log2 units (q is pre-scaled by scale*log2(e)); the running max moves
// only when a score passes it by MARGIN (a warp vote), so most keys skip the rescale.
// LANE_ACC chooses where the accumulators live.
// LANE_ACC 0: per lane group, each with its own running max and sum. Raw scores go to attn
// (with SMEM_SCORES, a one-warp team keeps them in shared memory instead, so attn is written
// once) and are normalised at the row's end. Row end: groups merge by butterfly. A one-warp
// team then writes ctx and attn from its registers; larger teams merge through shared memory
// (one team barrier per row; the merge buffers alternate between rows so the next row's writes
// cannot meet this row's reads).
// Dynamic shared memory (floats): ring [NWARPS][STAGES][FSLOT]; with QREG == 0 the scaled
// queries [N_HORIZONS*HIDDEN_DIM] (QREG == 1 keeps them in registers); with TW > 1 the merge
// accumulators [2][NWARPS][N_HORIZONS*HIDDEN_DIM] and max/sum [2][NWARPS][N_HORIZONS][2];
// with SMEM_SCORES the raw scores [NWARPS][N_HORIZONS*K].
// LANE_ACC 1: lane-owned accumulators (one-warp teams). Each group's softmax weights go
// through the warp's buffer pw and every lane accumulates its own columns (group_cols<32>) of
// the step's SKEYS rows: N_HORIZONS*ROW_PER_LANE accumulators a lane instead of
// N_HORIZONS*GCOLS repeated in every group, and no merge of the groups at the row's end. The
// running max is the warp's (one vote a step for all horizons); the sums are per lane group.
// Dynamic shared memory (floats): ring [NWARPS][STAGES][FSLOT]; the scaled queries
// [N_HORIZONS*HIDDEN_DIM] rounded up to 4 (QREG == 1 copies them into registers); the weights
// [NWARPS][N_HORIZONS][SKEYS]; with SMEM_SCORES the raw scores [NWARPS][N_HORIZONS*K].
extern "C" __global__ void LAYOUT2_BOUNDS
pool_forward(const float* __restrict__ q_h, const float* __restrict__ ln,
             float* __restrict__ ctx, float* __restrict__ attn, const int K, const float scale,
             const int B)
{
    pdl_wait();
    extern __shared__ __align__(16) float smem[];
    float* ring = smem;
    float* qs = ring + NWARPS * STAGES * FSLOT;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane / GROUP, gl = lane % GROUP;
    const float qscale = scale * LOG2E;
#if LANE_ACC
    float* pw = qs + (N_HORIZONS * HIDDEN_DIM + 3) / 4 * 4;
    for (int e = threadIdx.x; e < N_HORIZONS * HIDDEN_DIM; e += BLOCK) qs[e] = q_h[e] * qscale;
#if SMEM_SCORES
    float* wsc = pw + NWARPS * N_HORIZONS * SKEYS + warp * N_HORIZONS * K;
#endif
    pw += warp * N_HORIZONS * SKEYS;
    __syncthreads();
#if QREG
    float qr[N_HORIZONS][GCOLS];
#pragma unroll
    for (int h = 0; h < N_HORIZONS; ++h) group_cols(qs + h * HIDDEN_DIM, gl, qr[h]);
#endif

    const Walk w(B, K, warp, 0);
    Ring<FSLOT> ring_in(ring, warp, w, ln, nullptr, nullptr, K, lane, false);

    int cslot = 0;
    for (int r = 0; r < w.rows; ++r) {
        const int b = w.row(r);
        float* attnb = attn + (size_t)b * N_HORIZONS * K;
        float m[N_HORIZONS], l[N_HORIZONS], acc[N_HORIZONS][ROW_PER_LANE];
        row_start(m, l, acc);
        for (int j = 0; j < w.per_row; ++j) {
            ring_in.issue(w, ln, nullptr, nullptr, K, lane, false);
            copy_wait();
            __syncwarp();
            const float* slot = ring_in.slots + cslot * FSLOT;
            const int k0 = w.key0(j);
            float x[GROUP_KEYS][GCOLS];
#pragma unroll
            for (int u = 0; u < GROUP_KEYS; ++u)
                group_cols(slot + (u * KPW + g) * HIDDEN_DIM, gl, x[u]);
            float sc[GROUP_KEYS][N_HORIZONS];  // -inf past K
            bool up = false;
#pragma unroll
            for (int h = 0; h < N_HORIZONS; ++h) {
#if QREG
                const float* qh = qr[h];
#else
                float qh[GCOLS];
                group_cols(qs + h * HIDDEN_DIM, gl, qh);
#endif
#pragma unroll
                for (int u = 0; u < GROUP_KEYS; ++u) {
                    const int k = k0 + u * KPW + g;
                    const float v = group_sum<GROUP>(lane_dot(qh, x[u]));
                    sc[u][h] = k < K ? v : -INFINITY;
#if SMEM_SCORES
                    if (gl == 0 && k < K) wsc[h * K + k] = v;
#else
                    if (gl == 0 && k < K) attnb[(size_t)h * K + k] = v;
#endif
                    up |= sc[u][h] > m[h] + MARGIN;
                }
            }
            if (__any_sync(FULL_MASK, up)) {  // rare: the warp's max moves for some horizon
#pragma unroll
                for (int h = 0; h < N_HORIZONS; ++h) {
                    float c = sc[0][h];
#pragma unroll
                    for (int u = 1; u < GROUP_KEYS; ++u) c = fmaxf(c, sc[u][h]);
#pragma unroll
                    for (int o = GROUP; o < 32; o <<= 1)
                        c = fmaxf(c, __shfl_xor_sync(FULL_MASK, c, o));
                    if (c > m[h] + MARGIN) {
                        const float corr = m[h] == -INFINITY ? 0.f : exp2f(m[h] - c);
                        l[h] *= corr;
#pragma unroll
                        for (int i = 0; i < ROW_PER_LANE; ++i) acc[h][i] *= corr;
                        m[h] = c;
                    }
                }
            }
#pragma unroll
            for (int h = 0; h < N_HORIZONS; ++h)
#pragma unroll
                for (int u = 0; u < GROUP_KEYS; ++u) {
                    const float p = exp2f(sc[u][h] - m[h]);
                    l[h] += p;
                    if (gl == 0) pw[h * SKEYS + u * KPW + g] = p;
                }
            __syncwarp();
#pragma unroll
            for (int s = 0; s < SKEYS; s += 4) {
                float4 p4[N_HORIZONS];  // weights of keys s .. s+3, one broadcast load a horizon
#pragma unroll
                for (int h = 0; h < N_HORIZONS; ++h)
                    p4[h] = *reinterpret_cast<const float4*>(pw + h * SKEYS + s);
#pragma unroll
                for (int t = 0; t < 4; ++t) {
                    float xr[ROW_PER_LANE];
                    group_cols<32>(slot + (s + t) * HIDDEN_DIM, lane, xr);
#pragma unroll
                    for (int h = 0; h < N_HORIZONS; ++h) {
                        const float p = t == 0 ? p4[h].x : t == 1 ? p4[h].y
                                      : t == 2 ? p4[h].z : p4[h].w;
#pragma unroll
                        for (int i = 0; i < ROW_PER_LANE; ++i)
                            acc[h][i] = fmaf(p, xr[i], acc[h][i]);
                    }
                }
            }
            __syncwarp();  // the slot and pw are read before they are written again
            cslot = cslot + 1 == STAGES ? 0 : cslot + 1;
        }
        float* ctxb = ctx + (size_t)b * N_HORIZONS * HIDDEN_DIM;
#pragma unroll
        for (int h = 0; h < N_HORIZONS; ++h) {
            l[h] = 1.f / across_groups(l[h]);
            float o[ROW_PER_LANE];
#pragma unroll
            for (int i = 0; i < ROW_PER_LANE; ++i) o[i] = acc[h][i] * l[h];
            store_row(ctxb + h * HIDDEN_DIM, lane, o);
        }
        __syncwarp();  // the raw scores this warp's lanes wrote are complete
#pragma unroll
        for (int h = 0; h < N_HORIZONS; ++h) {
            float* ah = attnb + (size_t)h * K;
#if SMEM_SCORES
            const float* sh = wsc + h * K;
#else
            const float* sh = ah;
#endif
            for (int k = lane; k < K; k += 32) ah[k] = exp2f(sh[k] - m[h]) * l[h];
        }
        __syncwarp();  // this row's scores are read before the next row's are written
    }
#else  // LANE_ACC 0
    const int team = warp / TW, wt = warp % TW;
#if QREG
    float q[N_HORIZONS][GCOLS];
#pragma unroll
    for (int h = 0; h < N_HORIZONS; ++h) {
        group_cols(q_h + h * HIDDEN_DIM, gl, q[h]);
#pragma unroll
        for (int j = 0; j < GCOLS; ++j) q[h][j] *= qscale;
    }
    [[maybe_unused]] float* macc = qs;
#else
    for (int e = threadIdx.x; e < N_HORIZONS * HIDDEN_DIM; e += BLOCK) qs[e] = q_h[e] * qscale;
    __syncthreads();
    [[maybe_unused]] float* macc = qs + N_HORIZONS * HIDDEN_DIM;
#endif
#if SMEM_SCORES
    float* wsc = macc + warp * N_HORIZONS * K;  // one-warp teams only: no merge buffers there
#endif

    const Walk w(B, K, team, wt);
    Ring<FSLOT> ring_in(ring, warp, w, ln, nullptr, nullptr, K, lane, false);

    int cslot = 0;
    for (int r = 0; r < w.rows; ++r) {
        const int b = w.row(r);
        float* attnb = attn + (size_t)b * N_HORIZONS * K;
        float m[N_HORIZONS], l[N_HORIZONS], acc[N_HORIZONS][GCOLS];
        row_start(m, l, acc);
        for (int j = 0; j < w.per_row; ++j) {
            ring_in.issue(w, ln, nullptr, nullptr, K, lane, false);
            copy_wait();
            __syncwarp();
            const int k = w.key0(j) + g;
            const bool valid = k < K;
            float x[GCOLS];
            group_cols(ring_in.slots + cslot * FSLOT + g * HIDDEN_DIM, gl, x);
#pragma unroll
            for (int h = 0; h < N_HORIZONS; ++h) {
#if QREG
                const float* qh = q[h];
#else
                float qh[GCOLS];
                group_cols(qs + h * HIDDEN_DIM, gl, qh);
#endif
                const float sc = group_sum<GROUP>(lane_dot(qh, x));
#if SMEM_SCORES
                if (gl == 0 && valid) wsc[h * K + k] = sc;
#else
                if (gl == 0 && valid) attnb[(size_t)h * K + k] = sc;
#endif
                const bool up = valid && sc > m[h] + MARGIN;
                if (__any_sync(FULL_MASK, up)) {
                    const float mn = up ? sc : m[h];
                    const float corr = mn == m[h] ? 1.f : exp2f(m[h] - mn);
                    l[h] *= corr;
#pragma unroll
                    for (int c = 0; c < GCOLS; ++c) acc[h][c] *= corr;
                    m[h] = mn;
                }
                const float pk = valid ? exp2f(sc - m[h]) : 0.f;
                l[h] += pk;
#pragma unroll
                for (int c = 0; c < GCOLS; ++c) acc[h][c] = fmaf(pk, x[c], acc[h][c]);
            }
            __syncwarp();
            cslot = cslot + 1 == STAGES ? 0 : cslot + 1;
        }

        // Merge the lane groups: every group ends with the warp's max, sum and accumulators.
#pragma unroll
        for (int h = 0; h < N_HORIZONS; ++h) {
            float mx = m[h];
#pragma unroll
            for (int o = GROUP; o < 32; o <<= 1) mx = fmaxf(mx, __shfl_xor_sync(FULL_MASK, mx, o));
            const float f = m[h] == -INFINITY ? 0.f : exp2f(m[h] - mx);
            l[h] = across_groups(l[h] * f);
#pragma unroll
            for (int c = 0; c < GCOLS; ++c) acc[h][c] = across_groups(acc[h][c] * f);
            m[h] = mx;
        }
        float* ctxb = ctx + (size_t)b * N_HORIZONS * HIDDEN_DIM;
#if TW == 1
        // The warp is the whole team: ctx from its registers (group h % KPW writes horizon h),
        // then the raw scores its lanes wrote are normalised.
#pragma unroll
        for (int h = 0; h < N_HORIZONS; ++h) {
            l[h] = 1.f / l[h];
            if (h % KPW == g) store_group_cols(ctxb + h * HIDDEN_DIM, gl, acc[h], l[h]);
        }
        __syncwarp();
#pragma unroll 1
        for (int h = 0; h < N_HORIZONS; ++h) {
            float* ah = attnb + (size_t)h * K;
#if SMEM_SCORES
            const float* sh = wsc + h * K;
            for (int k = lane; k < K; k += 32) ah[k] = exp2f(sh[k] - m[h]) * l[h];
#else
            for (int k = lane; k < K; k += 32) ah[k] = exp2f(ah[k] - m[h]) * l[h];
#endif
        }
        __syncwarp();  // this row's scores are read before the next row's are written
#else
        float* mml = macc + 2 * NWARPS * N_HORIZONS * HIDDEN_DIM;
        float* wacc = macc + ((r & 1) * NWARPS + warp) * N_HORIZONS * HIDDEN_DIM;
        float* wml = mml + ((r & 1) * NWARPS + warp) * N_HORIZONS * 2;
        if (g == 0) {
#pragma unroll
            for (int h = 0; h < N_HORIZONS; ++h) {
#pragma unroll
                for (int c = 0; c < GCHUNKS; ++c) {
                    const int d = (c * GROUP + gl) * VEC;
#pragma unroll
                    for (int v = 0; v < VEC; ++v)
                        if (d + v < HIDDEN_DIM) wacc[h * HIDDEN_DIM + d + v] = acc[h][c * VEC + v];
                }
                if (gl == 0) {
                    wml[2 * h] = m[h];
                    wml[2 * h + 1] = l[h];
                }
            }
        }
        team_sync(team);

        // The team's threads: ctx[b] and the normalised attn[b], horizons one at a time.
        const int t = wt * 32 + lane;
        const float* tacc = macc + ((r & 1) * NWARPS + team * TW) * N_HORIZONS * HIDDEN_DIM;
        const float* tml = mml + ((r & 1) * NWARPS + team * TW) * N_HORIZONS * 2;
#pragma unroll 1
        for (int h = 0; h < N_HORIZONS; ++h) {
            float mt = -INFINITY;
#pragma unroll
            for (int v = 0; v < TW; ++v) mt = fmaxf(mt, tml[v * N_HORIZONS * 2 + 2 * h]);
            float f[TW], lt = 0.f;
#pragma unroll
            for (int v = 0; v < TW; ++v) {
                const float mv = tml[v * N_HORIZONS * 2 + 2 * h];
                f[v] = mv == -INFINITY ? 0.f : exp2f(mv - mt);
                lt = fmaf(tml[v * N_HORIZONS * 2 + 2 * h + 1], f[v], lt);
            }
            const float inv = 1.f / lt;
            float* ctxh = ctxb + h * HIDDEN_DIM;
            for (int d = t; d < HIDDEN_DIM; d += TW * 32) {
                float v = 0.f;
#pragma unroll
                for (int u = 0; u < TW; ++u)
                    v = fmaf(tacc[u * N_HORIZONS * HIDDEN_DIM + h * HIDDEN_DIM + d], f[u], v);
                ctxh[d] = v * inv;
            }
            float* ah = attnb + (size_t)h * K;
            for (int k = t; k < K; k += TW * 32) ah[k] = exp2f(ah[k] - mt) * inv;
        }
#endif
    }
#endif  // LANE_ACC
}

// Backward in one pass over ln. Per row, every warp of the team forms c[h] itself:
// grad_ctx[b,h,:] . ctx[b,h,:] given the forward's ctx (else sum_k attn*dw over the whole row,
// a pass of its own), plus sum_k attn*grad_attn. Per key (its ln row, attn and grad_attn from
// the ring): dw = grad_ctx[b,h,:] . ln[b,k,:] (a group butterfly), d = attn*(dw + grad_attn - c);
// the grad_ln row sum_h attn*grad_ctx + scale*d*q_h is written once from registers, and
// grad_q_h's partial sum d*ln stays in registers across all of the warp's rows. A lane group's
// GROUP_KEYS keys a step share its reads of q_h and give its butterflies independent work to
// overlap (at B=1024 an SM has too few warps to hide them otherwise). At the end the groups
// merge by butterfly and the warps in warp order through shared memory into the block's
// scratch row gq_scratch[blockIdx.x] (reduced over blocks by reduce_axis0).
// Dynamic shared memory (floats): ring [NWARPS][STAGES][BSLOT], reused at the end for the
// per-warp partials [NWARPS][N_HORIZONS*HIDDEN_DIM] (the region is the larger of the two), then
// the queries times scale [N_HORIZONS*HIDDEN_DIM].
#define BRING (NWARPS * (STAGES * BSLOT > N_HORIZONS * HIDDEN_DIM ? STAGES * BSLOT \
                                                                    : N_HORIZONS * HIDDEN_DIM))
extern "C" __global__ void LAYOUT2_BOUNDS
pool_backward(const float* __restrict__ q_h, const float* __restrict__ ln,
              const float* __restrict__ attn, const float* __restrict__ grad_ctx,
              const float* __restrict__ grad_attn, const float* __restrict__ ctx,
              float* __restrict__ grad_ln, float* __restrict__ gq_scratch,
              float* __restrict__ ds_scratch, const int K, const float scale, const int B)
{
    pdl_wait();
    extern __shared__ __align__(16) float smem[];
    float* qs = smem + BRING;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int team = warp / TW, wt = warp % TW;
    const int g = lane / GROUP, gl = lane % GROUP;
    for (int e = threadIdx.x; e < N_HORIZONS * HIDDEN_DIM; e += BLOCK) qs[e] = q_h[e] * scale;
    __syncthreads();

    const Walk w(B, K, team, wt);
    Ring<BSLOT> ring_in(smem, warp, w, ln, attn, grad_attn, K, lane, true);

    float gq[N_HORIZONS][GCOLS];
#pragma unroll
    for (int h = 0; h < N_HORIZONS; ++h)
#pragma unroll
        for (int c = 0; c < GCOLS; ++c) gq[h][c] = 0.f;

    int cslot = 0;
    for (int r = 0; r < w.rows; ++r) {
        const int b = w.row(r);
        const float* gcb = grad_ctx + (size_t)b * N_HORIZONS * HIDDEN_DIM;
        const float* attnb = attn + (size_t)b * N_HORIZONS * K;
        float gc[N_HORIZONS][GCOLS], c[N_HORIZONS];
#pragma unroll
        for (int h = 0; h < N_HORIZONS; ++h) {
            group_cols(gcb + h * HIDDEN_DIM, gl, gc[h]);
            float v = 0.f;
            if (ctx) {
                float y[GCOLS];
                group_cols(ctx + ((size_t)b * N_HORIZONS + h) * HIDDEN_DIM, gl, y);
#pragma unroll
                for (int j = 0; j < GCOLS; ++j) v = fmaf(gc[h][j], y[j], v);
                v = group_sum<GROUP>(v);
            }
            c[h] = v;
        }
        if (!ctx) {
            // sum_k attn*dw: group g takes keys g, g+KPW, ...; the groups' shares are added
            // by butterfly. Every lane runs every trip (the butterflies need the whole warp:
            // a group that left the loop early would hang the others' shuffles).
            float share[N_HORIZONS];
#pragma unroll
            for (int h = 0; h < N_HORIZONS; ++h) share[h] = 0.f;
            const float* lnb = ln + (size_t)b * K * HIDDEN_DIM;
            for (int k0 = 0; k0 < K; k0 += KPW) {
                const int k = k0 + g;
                float x[GCOLS];
                group_cols(lnb + (size_t)min(k, K - 1) * HIDDEN_DIM, gl, x);
#pragma unroll
                for (int h = 0; h < N_HORIZONS; ++h) {
                    float dot = 0.f;
#pragma unroll
                    for (int j = 0; j < GCOLS; ++j) dot = fmaf(gc[h][j], x[j], dot);
                    dot = group_sum<GROUP>(dot);
                    if (k < K) share[h] = fmaf(attnb[(size_t)h * K + k], dot, share[h]);
                }
            }
#pragma unroll
            for (int h = 0; h < N_HORIZONS; ++h) c[h] = across_groups(share[h]);
        }
        if (grad_attn) {
            const float* gab = grad_attn + (size_t)b * N_HORIZONS * K;
#pragma unroll 1
            for (int h = 0; h < N_HORIZONS; ++h) {
                float v = 0.f;
                for (int k = lane; k < K; k += 32)
                    v = fmaf(attnb[(size_t)h * K + k], gab[(size_t)h * K + k], v);
                c[h] += warp_sum(v);
            }
        }

        float* glnb = grad_ln + (size_t)b * K * HIDDEN_DIM;
        for (int j = 0; j < w.per_row; ++j) {
            ring_in.issue(w, ln, attn, grad_attn, K, lane, true);
            copy_wait();
            __syncwarp();
            const float* slot = ring_in.slots + cslot * BSLOT;
            float x[GROUP_KEYS][GCOLS], out[GROUP_KEYS][GCOLS];
#pragma unroll
            for (int u = 0; u < GROUP_KEYS; ++u) {
                group_cols(slot + (u * KPW + g) * HIDDEN_DIM, gl, x[u]);
#pragma unroll
                for (int v = 0; v < GCOLS; ++v) out[u][v] = 0.f;
            }
#pragma unroll
            for (int h = 0; h < N_HORIZONS; ++h) {
                float qh[GCOLS];  // read once for the group's GROUP_KEYS keys
                group_cols(qs + h * HIDDEN_DIM, gl, qh);
#pragma unroll
                for (int u = 0; u < GROUP_KEYS; ++u) {
                    const int e = u * KPW + g;  // zeros past K: d = 0 there
                    const float a = slot[FSLOT + h * SKEYS + e];
                    const float ga = slot[FSLOT + (N_HORIZONS + h) * SKEYS + e];
                    const float d = a * (group_sum<GROUP>(lane_dot(gc[h], x[u])) + ga - c[h]);
#pragma unroll
                    for (int v = 0; v < GCOLS; ++v) {
                        out[u][v] = fmaf(a, gc[h][v], fmaf(d, qh[v], out[u][v]));
                        gq[h][v] = fmaf(d, x[u][v], gq[h][v]);
                    }
                }
            }
#pragma unroll
            for (int u = 0; u < GROUP_KEYS; ++u) {
                const int k = w.key0(j) + u * KPW + g;
                if (k < K) store_group_cols(glnb + (size_t)k * HIDDEN_DIM, gl, out[u], 1.f);
            }
            __syncwarp();
            cslot = cslot + 1 == STAGES ? 0 : cslot + 1;
        }
    }

    // Every copy has landed (the last groups committed are empty); the ring becomes the
    // per-warp partials.
    asm volatile("cp.async.wait_all;\n" ::: "memory");
    __syncthreads();
    float* red = smem + warp * N_HORIZONS * HIDDEN_DIM;
#pragma unroll
    for (int h = 0; h < N_HORIZONS; ++h) {
#pragma unroll
        for (int v = 0; v < GCOLS; ++v) gq[h][v] = across_groups(gq[h][v]);
        if (g == 0) store_group_cols(red + h * HIDDEN_DIM, gl, gq[h], 1.f);
    }
    __syncthreads();
    float* gqb = gq_scratch + (size_t)blockIdx.x * N_HORIZONS * HIDDEN_DIM;
    for (int e = threadIdx.x; e < N_HORIZONS * HIDDEN_DIM; e += BLOCK) {
        float v = 0.f;
        for (int u = 0; u < NWARPS; ++u) v += smem[u * N_HORIZONS * HIDDEN_DIM + e];
        gqb[e] = scale * v;
    }
}
#elif LAYOUT == 3
// LAYOUT 3 (wide heads): one block per batch row, FP32 tiles through shared memory, flash-style
// over chunks of KC = CHUNK / HIDDEN_DIM keys (double-buffered by cp.async):
//   S[H][KC] = Q[H][D] . LN[KC][D]^T   thread tiles of 4 horizons x TK keys; D is split in
//                                      KSPLIT slices when H*KC is small, the slices summed in order
//   O[H][D] += P[H][KC] . LN[KC][D]     thread tiles of 4 horizons x 4 columns
// Needs N_HORIZONS % 4 == 0, HIDDEN_DIM % 4 == 0 and N_HORIZONS*HIDDEN_DIM <= 16*BLOCK (the
// host's restrictions say the same, so no variant that breaks them is ever compiled).
#define WROW (HIDDEN_DIM + 4)  // padded shared row: float4 reads of 8 rows cover all 32 banks
#define KC (CHUNK / HIDDEN_DIM)
#define TK (N_HORIZONS * KC >= 2 * BLOCK ? 2 : 1)
#define T1 (N_HORIZONS * KC / (4 * TK))  // threads per D slice
#define KSPLIT (BLOCK / T1 > 0 ? BLOCK / T1 : 1)
#define DSLICE (HIDDEN_DIM / KSPLIT)
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

// o[i][0..3] += sum over the chunk's keys of p[h0+i][k] * buf[k][d0..d0+3] (4x4 register tile).
__device__ __forceinline__ void tile_accumulate(float (*o)[4], const float* p, const float* buf,
                                                const int h0, const int d0)
{
    for (int k = 0; k < KC; ++k) {
        const float4 lv = *reinterpret_cast<const float4*>(buf + k * WROW + d0);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const float w = p[(h0 + i) * KC + k];
            o[i][0] = fmaf(w, lv.x, o[i][0]);
            o[i][1] = fmaf(w, lv.y, o[i][1]);
            o[i][2] = fmaf(w, lv.z, o[i][2]);
            o[i][3] = fmaf(w, lv.w, o[i][3]);
        }
    }
}

// The chunk's attn[b, :, k0 .. k0+KC) into as[N_HORIZONS][KC] (zeros past K).
__device__ __forceinline__ void load_attn(float* as, const float* __restrict__ attnb, const int k0,
                                          const int K)
{
    for (int e = threadIdx.x; e < N_HORIZONS * KC; e += BLOCK) {
        const int k = k0 + e % KC;
        as[e] = k < K ? attnb[(size_t)(e / KC) * K + k] : 0.f;
    }
}

// Forward: per chunk, the slices are summed in order by a warp per horizon, which writes the
// raw scores to attn, moves the running max and sum (log2 units: q is pre-scaled by
// scale*log2(e)) and leaves P = exp2(score - max) for the tile products. At the row's end ctx =
// O / l and attn is normalised in place (the block's own writes, ordered by its barriers).
// Dynamic shared memory (floats): qs [N_HORIZONS][WROW], ln chunks [2][KC][WROW], partial
// scores [KSPLIT][N_HORIZONS][KC] (P in slice 0), running max, sum and rescale [3][N_HORIZONS].
extern "C" __global__ void __launch_bounds__(BLOCK)
pool_forward(const float* __restrict__ q_h, const float* __restrict__ ln,
             float* __restrict__ ctx, float* __restrict__ attn, const int K, const float scale,
             const int B)
{
    pdl_wait();
    extern __shared__ __align__(16) float smem[];
    float* qs = smem;
    float* lbuf = qs + N_HORIZONS * WROW;
    float* sp = lbuf + 2 * KC * WROW;
    float* mstat = sp + KSPLIT * N_HORIZONS * KC;
    float* lstat = mstat + N_HORIZONS;
    float* corr = lstat + N_HORIZONS;

    const int b = blockIdx.x, tid = threadIdx.x;
    const int warp = tid >> 5, lane = tid & 31;
    const float* lnb = ln + (size_t)b * K * HIDDEN_DIM;
    float* attnb = attn + (size_t)b * N_HORIZONS * K;
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
                if (valid) attnb[(size_t)h * K + c * KC + k] = v;
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
        float* ah = attnb + (size_t)h * K;
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
extern "C" __global__ void __launch_bounds__(BLOCK)
pool_backward(const float* __restrict__ q_h, const float* __restrict__ ln,
              const float* __restrict__ attn, const float* __restrict__ grad_ctx,
              const float* __restrict__ grad_attn, const float* __restrict__ ctx,
              float* __restrict__ grad_ln, float* __restrict__ gq_scratch,
              float* __restrict__ ds_scratch, const int K, const float scale, const int B)
{
    pdl_wait();
    extern __shared__ __align__(16) float smem[];
    float* qs = smem;
    float* gcs = qs + N_HORIZONS * WROW;
    float* lbuf = gcs + N_HORIZONS * WROW;
    float* sp = lbuf + 2 * KC * WROW;
    float* as = sp + KSPLIT * N_HORIZONS * KC;
    float* cst = as + N_HORIZONS * KC;

    const int b = blockIdx.x, tid = threadIdx.x;
    const int warp = tid >> 5, lane = tid & 31;
    const float* lnb = ln + (size_t)b * K * HIDDEN_DIM;
    const float* attnb = attn + (size_t)b * N_HORIZONS * K;
    const float* gab = grad_attn ? grad_attn + (size_t)b * N_HORIZONS * K : nullptr;
    const float* gcb = grad_ctx + (size_t)b * N_HORIZONS * HIDDEN_DIM;
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
            const float* cb = ctx + ((size_t)b * N_HORIZONS + h) * HIDDEN_DIM;
            for (int d = lane; d < HIDDEN_DIM; d += 32) v = fmaf(gcb[h * HIDDEN_DIM + d], cb[d], v);
        }
        if (gab)
            for (int k = lane; k < K; k += 32)
                v = fmaf(attnb[(size_t)h * K + k], gab[(size_t)h * K + k], v);
        v = warp_sum(v);
        if (lane == 0) cst[h] = v;
    }

    // grad_ln: columns dl..dl+3 of keys kl, kl+KSTEP, ...; GQ: the 4x4 tile at (h0, d0).
    constexpr int KSTEP = BLOCK / (HIDDEN_DIM / 4);
    const int dl = tid % (HIDDEN_DIM / 4) * 4, kl = tid / (HIDDEN_DIM / 4);
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
            const float ga = gab && k < K ? gab[(size_t)h * K + k] : 0.f;
            sp[e] = as[e] * (dw + ga - cst[h]);  // 0 past K: as is 0 there
        }
        __syncthreads();
        if (kl < KSTEP) {
            for (int k = kl; k < KC && k0 + k < K; k += KSTEP) {
                float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
                for (int h = 0; h < N_HORIZONS; ++h) {
                    const float a = as[h * KC + k], ds = sp[h * KC + k];
                    const float4 g = *reinterpret_cast<const float4*>(gcs + h * WROW + dl);
                    const float4 q = *reinterpret_cast<const float4*>(qs + h * WROW + dl);
                    o.x = fmaf(a, g.x, fmaf(ds, q.x, o.x));
                    o.y = fmaf(a, g.y, fmaf(ds, q.y, o.y));
                    o.z = fmaf(a, g.z, fmaf(ds, q.z, o.z));
                    o.w = fmaf(a, g.w, fmaf(ds, q.w, o.w));
                }
                *reinterpret_cast<float4*>(glnb + (size_t)(k0 + k) * HIDDEN_DIM + dl) = o;
            }
        }
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
#endif
