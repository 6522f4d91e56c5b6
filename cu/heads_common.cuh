// Shared device helpers for pycuda-heads kernels. Template constants (N_HORIZONS, HIDDEN_DIM,
// N_ATOMS, BLOCK, VEC, ...) arrive as #defines from the Python renderer.
#define FULL_MASK 0xffffffffu

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    return v;
}

// Butterfly over groups of W consecutive lanes (W a power of two <= 32): every lane of the group
// ends with the same value, so the result is independent of which lane reads it.
template <int W>
__device__ __forceinline__ float group_sum(float v) {
#pragma unroll
    for (int o = W / 2; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    return v;
}

template <int W>
__device__ __forceinline__ float group_max(float v) {
#pragma unroll
    for (int o = W / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, o));
    return v;
}

// V consecutive floats; p must be aligned to 4*V bytes (the binding checks pointer alignment).
template <int V>
__device__ __forceinline__ void load_vec(const float* __restrict__ p, float* out) {
    if (V == 4) {
        const float4 t = __ldg(reinterpret_cast<const float4*>(p));
        out[0] = t.x; out[1] = t.y; out[2] = t.z; out[3] = t.w;
    } else if (V == 2) {
        const float2 t = __ldg(reinterpret_cast<const float2*>(p));
        out[0] = t.x; out[1] = t.y;
    } else {
#pragma unroll
        for (int i = 0; i < V; ++i) out[i] = __ldg(p + i);
    }
}

template <int V>
__device__ __forceinline__ void store_vec(float* p, const float* v) {
    if (V == 4) {
        *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
    } else if (V == 2) {
        *reinterpret_cast<float2*>(p) = make_float2(v[0], v[1]);
    } else {
#pragma unroll
        for (int i = 0; i < V; ++i) p[i] = v[i];
    }
}

#if defined(HIDDEN_DIM) && defined(VEC)
// A row of HIDDEN_DIM floats spread over one warp: lane l holds columns
// (c*32 + l)*VEC + v for c < ROW_CHUNKS, v < VEC (columns >= HIDDEN_DIM are padding, kept 0).
#define ROW_CHUNKS ((HIDDEN_DIM + 32 * VEC - 1) / (32 * VEC))
#define ROW_PER_LANE (ROW_CHUNKS * VEC)

__device__ __forceinline__ int row_col(int c, int lane) { return (c * 32 + lane) * VEC; }

__device__ __forceinline__ void load_row(const float* __restrict__ row, int lane, float* out) {
#pragma unroll
    for (int c = 0; c < ROW_CHUNKS; ++c) {
        const int d = row_col(c, lane);
        if (d < HIDDEN_DIM) {
            load_vec<VEC>(row + d, out + c * VEC);
        } else {
#pragma unroll
            for (int v = 0; v < VEC; ++v) out[c * VEC + v] = 0.f;
        }
    }
}

__device__ __forceinline__ void store_row(float* row, int lane, const float* in) {
#pragma unroll
    for (int c = 0; c < ROW_CHUNKS; ++c) {
        const int d = row_col(c, lane);
        if (d < HIDDEN_DIM) store_vec<VEC>(row + d, in + c * VEC);
    }
}

#if defined(N_HORIZONS) && defined(ROWS) && defined(BLOCK)
// The residual projection's loop: one warp per (b, h) pair of block blockIdx.x's ROWS batch rows,
// dot = w_res[h,:] . ctx[b,h,:] in a fixed order; lane 0 calls emit(p, h, dot), p = b*N_HORIZONS+h.
template <typename Emit>
__device__ __forceinline__ void residual_pairs(const float* __restrict__ ctx,
                                               const float* __restrict__ w_res, int B, Emit emit) {
    const int lane = threadIdx.x & 31;
    const int p0 = blockIdx.x * ROWS * N_HORIZONS;
    const int p1 = min(B * N_HORIZONS, p0 + ROWS * N_HORIZONS);
    for (int p = p0 + (threadIdx.x >> 5); p < p1; p += BLOCK / 32) {
        const int h = p % N_HORIZONS;
        float x[ROW_PER_LANE], w[ROW_PER_LANE];
        load_row(ctx + (size_t)p * HIDDEN_DIM, lane, x);
        load_row(w_res + h * HIDDEN_DIM, lane, w);
        float dot = 0.f;
#pragma unroll
        for (int j = 0; j < ROW_PER_LANE; ++j) dot = fmaf(w[j], x[j], dot);
        dot = warp_sum(dot);
        if (lane == 0) emit(p, h, dot);
    }
}
#endif
#endif
