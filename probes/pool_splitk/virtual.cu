// Split-K by "virtual rows" (probe): the library's tuned pool runs ln viewed as
// [B*S, K/S, D], each split a row of its own with its own softmax; these kernels join the
// splits. Constants: N_HORIZONS, HIDDEN_DIM (-D options).
#define H N_HORIZONS
#define D HIDDEN_DIM
#define MAX_SPLIT 256

// One block per (h, b). A split's log-sum-exp comes from its largest attention weight a*:
// a* = exp(score* - lse), so lse = score* - log(a*), score* recomputed from q_h and the key's
// ln row (a* >= 1/Ks, so the log is well conditioned). Weights w_s = exp(lse_s - LSE) are
// summed in split order; every output has one writer.
extern "C" __global__ void virtual_combine(
        const float* __restrict__ q_h, const float* __restrict__ ln,
        const float* __restrict__ ctx_v, const float* __restrict__ attn_v,
        float* __restrict__ ctx, float* __restrict__ attn, float* __restrict__ attn_gv,
        float* __restrict__ ctx_rep, const int S, const int Ks, const float scale) {
    __shared__ float w[MAX_SPLIT];
    const int h = blockIdx.x, b = blockIdx.y, lane = threadIdx.x % 32;
    const int warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
    for (int s = warp; s < S; s += nwarps) {
        const float* a = attn_v + ((size_t)(b * S + s) * H + h) * Ks;
        float best = -1.f;
        int at = 0;
        for (int k = lane; k < Ks; k += 32)
            if (a[k] > best) { best = a[k]; at = k; }
        for (int o = 16; o > 0; o >>= 1) {  // the largest, the first key on a tie
            const float ob = __shfl_xor_sync(0xffffffffu, best, o);
            const int oa = __shfl_xor_sync(0xffffffffu, at, o);
            if (ob > best || (ob == best && oa < at)) { best = ob; at = oa; }
        }
        const float* row = ln + ((size_t)b * S * Ks + (size_t)s * Ks + at) * D;
        float dot = 0.f;
        for (int d = lane; d < D; d += 32) dot += q_h[h * D + d] * row[d];
        for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
        if (lane == 0) w[s] = scale * dot - logf(best);
    }
    __syncthreads();
    float m = -INFINITY, sum = 0.f;  // every thread the same, in split order
    for (int s = 0; s < S; ++s) m = fmaxf(m, w[s]);
    for (int s = 0; s < S; ++s) sum += expf(w[s] - m);
    __syncthreads();
    if (threadIdx.x < S) w[threadIdx.x] = expf(w[threadIdx.x] - m) / sum;
    __syncthreads();
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        float v = 0.f;
        for (int s = 0; s < S; ++s) v += w[s] * ctx_v[((size_t)(b * S + s) * H + h) * D + d];
        ctx[((size_t)b * H + h) * D + d] = v;
        for (int s = 0; s < S; ++s) ctx_rep[((size_t)(b * S + s) * H + h) * D + d] = v;
    }
    for (int i = threadIdx.x; i < S * Ks; i += blockDim.x) {
        const int s = i / Ks, k = i % Ks;
        const size_t v = ((size_t)(b * S + s) * H + h) * Ks + k;
        const float x = w[s] * attn_v[v];
        attn[((size_t)b * H + h) * S * Ks + i] = x;
        attn_gv[v] = x;
    }
}

// grad_ctx [B, H, D] -> [B*S, H, D], each split's row a copy (the backward's virtual rows)
extern "C" __global__ void virtual_replicate(const float* __restrict__ src,
                                             float* __restrict__ dst, const int S) {
    const int s = blockIdx.x, b = blockIdx.y;
    for (int i = threadIdx.x; i < H * D; i += blockDim.x)
        dst[(size_t)(b * S + s) * H * D + i] = src[(size_t)b * H * D + i];
}
