// Split-K's joins (cu/pool.cu with POOL_SPLIT). Batch row b's K keys run through the layouts as
// S virtual rows b*S + s of Ks = K/S keys each (ln[B, K, D] is already [B*S, Ks, D] in memory),
// each with a softmax of its own; virtual arrays are laid out [B*S, N_HORIZONS, ...]. Every
// sum runs in a fixed order and every output has one writer.

// Forward, first a warp per (s, h, b) (grid (S / SPLIT_WARPS, H, B)): split s's log-sum-exp
// from its largest weight a*: a* = exp(score* - lse), so lse = score* - log(a*), with score*
// recomputed from q_h and that key's ln row (a* >= 1/Ks, so the log is well conditioned).
extern "C" __global__ void __launch_bounds__(SPLIT_THREADS)
pool_lse(const float* __restrict__ q_h, const float* __restrict__ ln,
         const float* __restrict__ attn_v, float* __restrict__ lse, const int S, const int Ks,
         const float scale)
{
    pdl_wait();
    const int lane = threadIdx.x & 31;
    const int s = blockIdx.x * SPLIT_WARPS + (threadIdx.x >> 5), h = blockIdx.y, b = blockIdx.z;
    if (s >= S) return;  // whole warps: no barrier follows
    const float* a = attn_v + ((size_t)(b * S + s) * N_HORIZONS + h) * Ks;
    float best = -1.f;
    int at = 0;
#pragma unroll 8
    for (int k = lane; k < Ks; k += 32)
        if (a[k] > best) { best = a[k]; at = k; }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {  // the largest; of equals, the first key
        const float ob = __shfl_xor_sync(FULL_MASK, best, o);
        const int oa = __shfl_xor_sync(FULL_MASK, at, o);
        if (ob > best || (ob == best && oa < at)) { best = ob; at = oa; }
    }
    const float* row = ln + ((size_t)(b * S + s) * Ks + at) * HIDDEN_DIM;
    float dot = 0.f;
    for (int d = lane; d < HIDDEN_DIM; d += 32) dot += q_h[h * HIDDEN_DIM + d] * row[d];
    dot = warp_sum(dot);
    if (lane == 0) lse[((size_t)b * N_HORIZONS + h) * S + s] = scale * dot - logf(best);
}

// Then a block per (h, b, z) (grid (H, B, Z), Z = ceil(K / SPLIT_SPAN)): the splits' weights
// exp(lse_s - LSE) scale the row's attention weights in the z-th of Z equal spans, and the
// splits' ctx at the z-th of Z equal spans of columns. The span's weights are loaded before
// the split weights are known, so a block waits on memory about twice, not once a split.
extern "C" __global__ void __launch_bounds__(SPLIT_THREADS)
pool_combine(const float* __restrict__ ctx_v, const float* __restrict__ attn_v,
             const float* __restrict__ lse, float* __restrict__ ctx, float* __restrict__ attn,
             const int S, const int Ks)
{
    pdl_wait();
    __shared__ float w[SPLIT_MAX];
    const int h = blockIdx.x, b = blockIdx.y, z = blockIdx.z, Z = gridDim.z;
    const int n = S * Ks, span = (n + Z - 1) / Z, i0 = z * span, i1 = min(n, i0 + span);
    constexpr int PER = SPLIT_SPAN / SPLIT_THREADS;  // span <= SPLIT_SPAN
    float x[PER];
#pragma unroll
    for (int j = 0; j < PER; ++j) {  // attn[b, h, i], i = s*Ks + k, from virtual row b*S + s
        const int i = i0 + j * SPLIT_THREADS + threadIdx.x, s = i / Ks;
        x[j] = i < i1 ? attn_v[((size_t)(b * S + s) * N_HORIZONS + h) * Ks + i - s * Ks] : 0.f;
    }
    if (threadIdx.x < 32) {  // the split weights, one fixed order for every block of the row
        const float* l = lse + ((size_t)b * N_HORIZONS + h) * S;
        float m = -INFINITY, sum = 0.f;
        for (int s = threadIdx.x; s < S; s += 32) m = fmaxf(m, l[s]);
        m = group_max<32>(m);
        for (int s = threadIdx.x; s < S; s += 32) sum += expf(l[s] - m);
        sum = warp_sum(sum);
        for (int s = threadIdx.x; s < S; s += 32) w[s] = expf(l[s] - m) / sum;
    }
    __syncthreads();
    float* out = attn + ((size_t)b * N_HORIZONS + h) * n;
#pragma unroll
    for (int j = 0; j < PER; ++j) {
        const int i = i0 + j * SPLIT_THREADS + threadIdx.x;
        if (i < i1) out[i] = w[i / Ks] * x[j];
    }
    // ctx columns [d0, d1): g lanes a column (a power of two), lane t summing splits t, t+g, ...
    // in order, then the g partial sums added by a fixed shuffle tree
    const int cols = (HIDDEN_DIM + Z - 1) / Z, d0 = z * cols, d1 = min(HIDDEN_DIM, d0 + cols);
    int g = 1;
    while (g < 32 && 2 * g * (d1 - d0) <= SPLIT_THREADS) g *= 2;
    const int t = threadIdx.x % g;
    const float* c = ctx_v + (size_t)b * S * N_HORIZONS * HIDDEN_DIM + h * HIDDEN_DIM;
    for (int e0 = d0; e0 < d1; e0 += SPLIT_THREADS / g) {  // the same trips for every lane
        const int d = e0 + threadIdx.x / g;
        float v = 0.f;
        if (d < d1)
#pragma unroll 4
            for (int s = t; s < S; s += g) v += w[s] * c[(size_t)s * N_HORIZONS * HIDDEN_DIM + d];
        for (int o = g / 2; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
        if (d < d1 && t == 0) ctx[((size_t)b * N_HORIZONS + h) * HIDDEN_DIM + d] = v;
    }
}

// Backward with grad_attn, one block per (h, b): the shift each split's grad_attn takes so that
// the layouts' correction over a split's keys alone, grad_ctx . ctx + sum_(k in s) attn *
// grad_attn, is the whole row's. Shifting a split's grad_attn by delta adds delta * (1 - w_s)
// to every d of the split (w_s: its share of attn), so delta = -(sum over the other splits'
// keys of attn * grad_attn) / (their attn): a weighted mean of grad_attn, bounded by it.
extern "C" __global__ void __launch_bounds__(SPLIT_THREADS)
pool_shift(const float* __restrict__ attn, const float* __restrict__ grad_attn,
           float* __restrict__ shift, const int S, const int Ks)
{
    pdl_wait();
    __shared__ float w[SPLIT_MAX], l[SPLIT_MAX];
    const int h = blockIdx.x, b = blockIdx.y;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const size_t row = (size_t)b * N_HORIZONS + h;
    for (int s = warp; s < S; s += SPLIT_WARPS) {
        const float* a = attn + (row * S + s) * Ks;
        const float* g = grad_attn + (row * S + s) * Ks;
        float ws = 0.f, ls = 0.f;
        for (int k = lane; k < Ks; k += 32) { ws += a[k]; ls += a[k] * g[k]; }
        ws = warp_sum(ws);
        ls = warp_sum(ls);
        if (lane == 0) { w[s] = ws; l[s] = ls; }
    }
    __syncthreads();
    if (threadIdx.x < S) {
        float num = 0.f, den = 0.f;
        for (int t = 0; t < S; ++t)
            if (t != threadIdx.x) { num += l[t]; den += w[t]; }
        shift[row * S + threadIdx.x] = den > 0.f ? -num / den : 0.f;
    }
}

// Backward, one block per (s, b): the row's attn (and grad_attn, shifted) at the split's keys
// and its grad_ctx and ctx, copied to virtual row b*S + s, every horizon's (a virtual row's
// values are contiguous: N_HORIZONS*Ks attention weights, N_HORIZONS*HIDDEN_DIM features). Given
// the whole row's ctx, the layouts' correction is the whole row's and every key's gradient is
// exact.
extern "C" __global__ void __launch_bounds__(SPLIT_THREADS)
pool_spread(const float* __restrict__ attn, const float* __restrict__ grad_ctx,
            const float* __restrict__ ctx, const float* __restrict__ grad_attn,
            const float* __restrict__ shift, float* __restrict__ attn_v,
            float* __restrict__ grad_ctx_v, float* __restrict__ ctx_v,
            float* __restrict__ grad_attn_v, const int S, const int Ks)
{
    pdl_wait();
    const int s = blockIdx.x, b = blockIdx.y, n = N_HORIZONS * Ks;
    const size_t v = ((size_t)b * S + s) * n;  // virtual row b*S + s's first weight
#pragma unroll 4
    for (int e = threadIdx.x; e < n; e += SPLIT_THREADS) {
        const int h = e / Ks;
        const size_t at = (((size_t)b * N_HORIZONS + h) * S + s) * Ks + e - h * Ks;
        attn_v[v + e] = attn[at];
        if (grad_attn)
            grad_attn_v[v + e] = grad_attn[at] + shift[((size_t)b * N_HORIZONS + h) * S + s];
    }
    const size_t f = (size_t)b * N_HORIZONS * HIDDEN_DIM;
    const size_t fv = ((size_t)b * S + s) * N_HORIZONS * HIDDEN_DIM;
#pragma unroll 4
    for (int e = threadIdx.x; e < N_HORIZONS * HIDDEN_DIM; e += SPLIT_THREADS) {
        grad_ctx_v[fv + e] = grad_ctx[f + e];
        ctx_v[fv + e] = ctx[f + e];
    }
}
