// LAYOUT 1 of the pool (cu/pool.cu): any shape in the range, bounded registers and shared
// memory.
// out[h, :] = mult * sum_k w[h*stride + k] * rows[k, :] for every horizon, in a fixed order. An
// item is a tile of HTILE horizons by VEC columns; when there are fewer items than threads,
// SLICES threads share an item's keys (k = slice + i*SLICES) and their partial sums are added
// in slice order through red [SLICES*ITEMS*HTILE*VEC floats] (dynamic shared memory).

__device__ __forceinline__ void tile_sum(const float* w, const int stride,
                                         const float* __restrict__ rows, const int K,
                                         const int item, const int k0, const int kstep,
                                         float* acc)
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
            const float a = w[(size_t)(h0 + t) * stride + k];
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

__device__ __forceinline__ void weighted_rows(const float* w, const int stride,
                                              const float* __restrict__ rows, const int K,
                                              const float mult, float* out, float* red)
{
    float acc[HTILE * VEC];
    if (SLICES == 1) {
        for (int item = threadIdx.x; item < ITEMS; item += BLOCK) {
            tile_sum(w, stride, rows, K, item, 0, 1, acc);
            store_tile(out, item, mult, acc);
        }
        return;
    }
    if (threadIdx.x < SLICES * ITEMS) {
        tile_sum(w, stride, rows, K, threadIdx.x % ITEMS, threadIdx.x / ITEMS, SLICES, acc);
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
extern "C" __global__ void __launch_bounds__(BLOCK) pool_forward(POOL_FORWARD_PARAMS)
{
    pdl_wait();
    extern __shared__ float smem[];
    __shared__ float fm[N_HORIZONS], fl[N_HORIZONS];
    const int b = blockIdx.x;
    const int warp = threadIdx.x >> 5;
    const int lane = threadIdx.x & 31;
    const float* lnb = ln + (size_t)b * K * HIDDEN_DIM;
    float* attnb = attn + ATTN_ROW(b);

    FOR_WARP_KEYS(true) {
#pragma unroll 1
        for (int h = 0; h < N_HORIZONS; ++h) {
            const float sc = row_dot(q_h + h * HIDDEN_DIM, lane, x[u]) * scale;
            if (lane == 0) attnb[(size_t)h * ATTN_STRIDE + k0 + u] = sc;
        }
    }
    __syncthreads();

    for (int h = warp; h < N_HORIZONS; h += NWARPS) {
        const float* s = attnb + (size_t)h * ATTN_STRIDE;
        float mx = -INFINITY;
        for (int k = lane; k < K; k += 32) mx = fmaxf(mx, s[k]);
        mx = group_max<32>(mx);
        float sum = 0.f;
        for (int k = lane; k < K; k += 32) sum += __expf(s[k] - mx);
        sum = warp_sum(sum);
        if (lane == 0) {
            fm[h] = mx;
            fl[h] = sum;
#if SPLIT_COUNT > 1
            SPLIT_LSE(b, h) = mx + logf(sum);
#endif
        }
    }
    __syncthreads();
    for (int e = threadIdx.x; e < N_HORIZONS * K; e += BLOCK) {
        const int h = e / K;
        attnb[ATTN_AT(e)] = __expf(attnb[ATTN_AT(e)] - fm[h]) / fl[h];
    }
    __syncthreads();
    weighted_rows(attnb, ATTN_STRIDE, lnb, K, 1.f, ctx + (size_t)b * N_HORIZONS * HIDDEN_DIM,
                  smem);
}

// Backward. c[h] = sum_k attn*(dw + grad_attn), dw[h,k] = grad_ctx[b,h,:] . ln[b,k,:]: from the
// forward's ctx when given (sum_k attn*dw = grad_ctx . ctx), else from a pass over ln; each
// warp's share is held by lane h and the shares are added in warp order. Then warp per key:
// ds = attn*(dw + grad_attn - c) goes to ds_scratch[b] and the grad_ln row is written once;
// finally gq_scratch[b] = scale * ds @ ln[b] by weighted_rows (reduced over b by reduce_axis0).
extern "C" __global__ void __launch_bounds__(BLOCK) pool_backward(POOL_BACKWARD_PARAMS)
{
    pdl_wait();
    extern __shared__ float smem[];
    __shared__ float cw[NWARPS][N_HORIZONS], sc[N_HORIZONS];
    const int b = blockIdx.x;
    const int warp = threadIdx.x >> 5;
    const int lane = threadIdx.x & 31;
    const float* lnb = ln + (size_t)b * K * HIDDEN_DIM;
    const float* attnb = attn + ATTN_ROW(b);
    const float* gab = grad_attn ? grad_attn + ATTN_ROW(b) : nullptr;
    const float* gcb = grad_ctx + (size_t)BATCH_ROW(b) * N_HORIZONS * HIDDEN_DIM;
    float* dsb = ds_scratch + (size_t)b * N_HORIZONS * K;

    float share = 0.f;
    if (ctx) {
        for (int h = warp; h < N_HORIZONS; h += NWARPS) {
            float c[ROW_PER_LANE];
            load_row(ctx + ((size_t)BATCH_ROW(b) * N_HORIZONS + h) * HIDDEN_DIM, lane, c);
            const float dot = row_dot(gcb + h * HIDDEN_DIM, lane, c);
            if (lane == h) share += dot;
        }
    } else {
        FOR_WARP_KEYS(true) {
#pragma unroll 1
            for (int h = 0; h < N_HORIZONS; ++h) {
                const float dot = row_dot(gcb + h * HIDDEN_DIM, lane, x[u]);
                if (lane == h) share = fmaf(attnb[(size_t)h * ATTN_STRIDE + k0 + u], dot, share);
            }
        }
    }
    if (gab)
        for (int h = warp; h < N_HORIZONS; h += NWARPS) {
#if SPLIT_COUNT > 1
            if (lane == h) share += SPLIT_ATTN_DOT(b, h);
#else
            float v = 0.f;
            for (int k = lane; k < K; k += 32)
                v = fmaf(attnb[(size_t)h * K + k], gab[(size_t)h * K + k], v);
            v = warp_sum(v);
            if (lane == h) share += v;
#endif
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
    FOR_WARP_KEYS(true) {
        const int k = k0 + u;
        float out[ROW_PER_LANE] = {};
#pragma unroll 1
        for (int h = 0; h < N_HORIZONS; ++h) {
            const size_t e = (size_t)h * K + k, ea = (size_t)h * ATTN_STRIDE + k;
            float g[ROW_PER_LANE];
            load_row(gcb + h * HIDDEN_DIM, lane, g);
            float dot = 0.f;
#pragma unroll
            for (int j = 0; j < ROW_PER_LANE; ++j) dot = fmaf(g[j], x[u][j], dot);
            dot = warp_sum(dot);
            const float a = attnb[ea];
            const float d = a * ((gab ? dot + gab[ea] : dot) - sc[h]);
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
    __syncthreads();
    weighted_rows(dsb, K, lnb, K, scale, gq_scratch + (size_t)b * N_HORIZONS * HIDDEN_DIM, smem);
}
