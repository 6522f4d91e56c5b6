// LAYOUT 0 of the pool (cu/pool.cu): warps over keys, query rows in registers.

// Forward, single pass over ln with an online (flash-style) softmax per warp, merged across warps
// at the end. Dynamic shared memory (floats; wacc first so its vector stores stay 16-byte aligned):
//   wacc  [NWARPS * N_HORIZONS * HIDDEN_DIM]  per-warp unnormalised context
//   s     [N_HORIZONS * K]                    scaled scores, normalised into attn at the end
//   wm,wl [NWARPS * N_HORIZONS] each          per-warp running max / running sum
//   fm,fl [N_HORIZONS] each                   merged max / sum
extern "C" __global__ void __launch_bounds__(BLOCK) pool_forward(POOL_FORWARD_PARAMS)
{
    pdl_wait();
    extern __shared__ float smem[];
    float *wacc = smem, *s = wacc + L0_WARP_ROWS, *wm = s + L0_SCORES, *wl = wm + L0_STATS;
    float *fm = wl + L0_STATS, *fl = fm + N_HORIZONS;

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

    FOR_WARP_KEYS(true) {
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
#if SPLIT_COUNT > 1
        SPLIT_LSE(b, h) = mx + logf(sum);
#endif
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
    float* attnb = attn + ATTN_ROW(b);
    for (int e = threadIdx.x; e < N_HORIZONS * K; e += BLOCK) {
        const int h = e / K;
        attnb[ATTN_AT(e)] = expf(s[e] - fm[h]) / fl[h];
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
extern "C" __global__ void __launch_bounds__(BLOCK) pool_backward(POOL_BACKWARD_PARAMS)
{
    pdl_wait();
    extern __shared__ float smem[];
    float *red = smem, *sa = red + L0_WARP_ROWS, *sd = sa + L0_SCORES, *sc = sd + L0_SCORES;

    const int b = blockIdx.x;
    const int warp = threadIdx.x >> 5;
    const int lane = threadIdx.x & 31;
    const float* lnb = ln + (size_t)b * K * HIDDEN_DIM;
    const float* attnb = attn + ATTN_ROW(b);

    float gc[N_HORIZONS][ROW_PER_LANE];
#pragma unroll
    for (int h = 0; h < N_HORIZONS; ++h)
        load_row(grad_ctx + ((size_t)BATCH_ROW(b) * N_HORIZONS + h) * HIDDEN_DIM, lane, gc[h]);
    for (int e = threadIdx.x; e < N_HORIZONS * K; e += BLOCK) sa[e] = attnb[ATTN_AT(e)];
    const float* gab = grad_attn ? grad_attn + ATTN_ROW(b) : nullptr;

    float cr[N_HORIZONS];  // given ctx: c[h] in every warp's registers
    if (ctx) {
#pragma unroll
        for (int h = 0; h < N_HORIZONS; ++h) {
            float y[ROW_PER_LANE];
            load_row(ctx + ((size_t)BATCH_ROW(b) * N_HORIZONS + h) * HIDDEN_DIM, lane, y);
            float v = 0.f;
#pragma unroll
            for (int j = 0; j < ROW_PER_LANE; ++j) v = fmaf(gc[h][j], y[j], v);
            cr[h] = warp_sum(v);
        }
        if (gab) {
            __syncthreads();
            for (int h = warp; h < N_HORIZONS; h += NWARPS) {
#if SPLIT_COUNT > 1
                if (lane == 0) sc[h] = SPLIT_ATTN_DOT(b, h);
#else
                float v = 0.f;
                for (int k = lane; k < K; k += 32) v = fmaf(sa[h * K + k], gab[h * K + k], v);
                v = warp_sum(v);
                if (lane == 0) sc[h] = v;
#endif
            }
        }
    }
    FOR_WARP_KEYS(!ctx) {
#pragma unroll
        for (int h = 0; h < N_HORIZONS; ++h) {
            float dot = 0.f;
#pragma unroll
            for (int j = 0; j < ROW_PER_LANE; ++j) dot = fmaf(gc[h][j], x[u][j], dot);
            dot = warp_sum(dot);
            if (lane == 0) {
                const int e = h * K + k0 + u;
                sd[e] = gab ? dot + gab[ATTN_AT(e)] : dot;
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
    FOR_WARP_KEYS(true) {
        const int k = k0 + u;
        float out[ROW_PER_LANE] = {};
#pragma unroll
        for (int h = 0; h < N_HORIZONS; ++h) {
            const float a = sa[h * K + k];
            float d;
            if (ctx) {
                float dot = 0.f;
#pragma unroll
                for (int j = 0; j < ROW_PER_LANE; ++j) dot = fmaf(gc[h][j], x[u][j], dot);
                dot = warp_sum(dot);
                d = a * ((gab ? dot + gab[h * ATTN_STRIDE + k] : dot) - cr[h]
                         - (gab ? sc[h] : 0.f));
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
