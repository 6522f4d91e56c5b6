// Split-K's joins (cu/pool.cu with POOL_SPLIT). Batch row b's K keys run through the layouts
// (compiled with SPLIT_COUNT = S) as S virtual rows b*S + s of Ks = K/S keys each (ln[B, K, D]
// is already [B*S, Ks, D] in memory), each with a softmax of its own: the forward writes each
// split's weights in place in attn[B, N_HORIZONS, K], its ctx to ctx_v[B*S, N_HORIZONS, D] and
// its log-sum-exp to lse[B, N_HORIZONS, S]. Every sum runs in a fixed order and every output
// has one writer.

// Forward, a block per (h, b, z) (grid (H, B, Z), Z = ceil(K / SPLIT_SPAN)): the splits' weights
// exp(lse_s - LSE) scale the row's attention weights in the z-th of Z equal spans (in place),
// and the splits' ctx at the z-th of Z equal spans of columns. The span's weights are loaded
// before the split weights are known, so a block waits on memory about twice, not once a split.
extern "C" __global__ void __launch_bounds__(SPLIT_THREADS)
pool_combine(const float* __restrict__ ctx_v, const float* __restrict__ lse,
             float* __restrict__ ctx, float* __restrict__ attn, const int S, const int Ks)
{
    pdl_wait();
    __shared__ float w[SPLIT_MAX];
    const int h = blockIdx.x, b = blockIdx.y, z = blockIdx.z, Z = gridDim.z;
    const int n = S * Ks, span = (n + Z - 1) / Z, i0 = z * span, i1 = min(n, i0 + span);
    constexpr int PER = SPLIT_SPAN / SPLIT_THREADS;  // span <= SPLIT_SPAN
    float* row = attn + ((size_t)b * N_HORIZONS + h) * n;  // key i = s*Ks + k of split s
    float x[PER];
#pragma unroll
    for (int j = 0; j < PER; ++j) {
        const int i = i0 + j * SPLIT_THREADS + threadIdx.x;
        x[j] = i < i1 ? row[i] : 0.f;
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
#pragma unroll
    for (int j = 0; j < PER; ++j) {
        const int i = i0 + j * SPLIT_THREADS + threadIdx.x;
        if (i < i1) row[i] = w[i / Ks] * x[j];
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

// Backward with grad_attn, a block per (h, b): the batch row's sum_k attn*grad_attn over all
// its keys, the part of the softmax correction that a split's own keys do not give; the
// layouts take it whole (SPLIT_ATTN_DOT) in place of their keys' share.
extern "C" __global__ void __launch_bounds__(SPLIT_THREADS)
pool_attn_dot(const float* __restrict__ attn, const float* __restrict__ grad_attn,
              float* __restrict__ attn_dot, const int K)
{
    pdl_wait();
    __shared__ float part[SPLIT_WARPS];
    const int h = blockIdx.x, b = blockIdx.y;
    const size_t row = ((size_t)b * N_HORIZONS + h) * K;
    float v = 0.f;
    for (int k = threadIdx.x; k < K; k += SPLIT_THREADS)
        v = fmaf(attn[row + k], grad_attn[row + k], v);
    v = warp_sum(v);
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
    __syncthreads();
    if (threadIdx.x == 0) {
        float t = 0.f;
        for (int u = 0; u < SPLIT_WARPS; ++u) t += part[u];
        attn_dot[(size_t)b * N_HORIZONS + h] = t;
    }
}
