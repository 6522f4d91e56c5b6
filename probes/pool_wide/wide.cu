// Wide-head pool forward prototype (issue 34: H*D >= 2048), outside the library: run.py compiles
// it per variant with -D options and checks it against the float64 reference.
// One block per batch row. Keys arrive in chunks of KC rows of ln (cp.async into shared memory);
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
// Shared floats: q [H][LDQ], ln chunk [KC][LDL], p [H][LDP], raw scores [H][KP], m, l, alpha [H]
// (KP = K rounded up to KC, a run-time size; run.py computes the same total).
#define WIDE_FLOATS(KP) (H * LDQ + KC * LDL + H * LDP + H * (KP) + 3 * H)

#include "../tf32_mma.cuh"

template <int W>
__device__ __forceinline__ float group_reduce(float v, bool is_max) {
#pragma unroll
    for (int o = W / 2; o > 0; o >>= 1) {
        const float x = __shfl_xor_sync(0xffffffffu, v, o);
        v = is_max ? fmaxf(v, x) : v + x;
    }
    return v;
}

extern "C" __global__ void __launch_bounds__(NTH)
wide_forward(const float* __restrict__ q_h, const float* __restrict__ ln, float* __restrict__ ctx,
             float* __restrict__ attn, const int K, const float scale)
{
    extern __shared__ __align__(16) float smem[];
    const int kp = (K + KC - 1) / KC * KC;
    float* qs = smem;
    float* ls = qs + H * LDQ;
    float* ps = ls + KC * LDL;
    float* ss = ps + H * LDP;
    float* m_s = ss + H * kp;
    float* l_s = m_s + H;
    float* a_s = l_s + H;
    const int b = blockIdx.x, warp = threadIdx.x / 32;
    const float* lnb = ln + (size_t)b * K * D;
    for (int e = threadIdx.x; e < H * D; e += NTH) qs[e / D * LDQ + e % D] = q_h[e];
    if (threadIdx.x < H) { m_s[threadIdx.x] = -INFINITY; l_s[threadIdx.x] = 0.f; }
    float acc[MT_C][NH8][4];
    zero_acc(acc);
    for (int c0 = 0; c0 < K; c0 += KC) {
        __syncthreads();  // the last chunk's ln and p are read
        for (int e = threadIdx.x; e < KC * D / 4; e += NTH) {
            const int r = e / (D / 4), c = e % (D / 4) * 4;
            const bool ok = c0 + r < K;
            const unsigned dst = (unsigned)__cvta_generic_to_shared(ls + r * LDL + c);
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                         :: "r"(dst), "l"(ok ? lnb + (size_t)(c0 + r) * D + c : lnb),
                            "r"(ok ? 16 : 0));
        }
        asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;\n" ::: "memory");
        __syncthreads();
        {
            float sacc[MT_S][NH8][4];
            zero_acc(sacc);
            const int r0 = warp * 16 * MT_S;
            warp_mma<MT_S, NH8, D / 8, false, LDL, false, LDQ>(sacc, ls + r0 * LDL, qs);
            each_acc(sacc, [&](int m, int n, float v) {
                const int key = c0 + r0 + m;
                ss[n * kp + key] = key < K ? v * scale : -INFINITY;
            });
        }
        __syncthreads();
        {   // online softmax, TPH threads a horizon: p for the chunk, the rescale of ctx
            const int h = threadIdx.x / TPH, j = threadIdx.x % TPH;
            float mx = -INFINITY;
            for (int k = j; k < KC; k += TPH) mx = fmaxf(mx, ss[h * kp + c0 + k]);
            mx = group_reduce<TPH>(mx, true);
            const float m_old = m_s[h], m_new = fmaxf(m_old, mx);
            float sum = 0.f;
            for (int k = j; k < KC; k += TPH) {
                const float p = c0 + k < K ? expf(ss[h * kp + c0 + k] - m_new) : 0.f;
                ps[h * LDP + k] = p;
                sum += p;
            }
            sum = group_reduce<TPH>(sum, false);
            __syncwarp();
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
    }
    __syncthreads();
    const int d0 = warp * 16 * MT_C;
    each_acc(acc, [&](int m, int n, float v) {
        ctx[((size_t)b * H + n) * D + d0 + m] = v / l_s[n];
    });
    for (int e = threadIdx.x; e < H * K; e += NTH) {
        const int h = e / K, k = e % K;
        attn[(size_t)b * H * K + e] = expf(ss[h * kp + k] - m_s[h]) / l_s[h];
    }
}
