// LAYOUT 5 (wide rows, tensor cores): ln streamed through a ring of STAGES slots of L5_KC keys
// (cp.async), so a row need not fit shared memory. A block walks its rows (a grid of B, or GRID
// per SM) as one sequence of slots, and the ring runs on across rows. Per slot, as 3xTF32
// mma.sync (tf32_mma.cuh) with the horizons as the n dimension:
//   forward   S^T [KC x H] = LN . Q^T   the warps split D, their partial sums added in warp order
//             online softmax           a warp a horizon: running max and sum in its registers,
//                                      raw scores to attn (normalised at the row's end)
//             ctx^T [D x H] += LN^T . P^T   a warp its D / NWARPS columns, rescaled as the max moves
//   backward  DW^T [KC x H] = LN . G^T (split D as above); DS = scale * A * (DW + GA - c)
//             grad_ln [KC x D] = A^T . G + DS^T . Q   items of 16 keys x 8 L4_GN columns
//             GQ^T [D x H] += LN^T . DS^T             over all the block's rows, gq_scratch[block]
//   c = grad_ctx . ctx (+ sum_k attn * grad_attn); without ctx a first pass over the row's slots
//   sums it from DW, so that row's slots are visited twice.
// Needs N_HORIZONS % 8 == 0, HIDDEN_DIM % (16 * NWARPS) == 0 and shared memory for the ring
// (the host's restrictions say the same).
static_assert(N_HORIZONS % 8 == 0 && HIDDEN_DIM % (16 * NWARPS) == 0, "LAYOUT 5: shape");
#define L5_NT (N_HORIZONS / 8)              // n8 tiles across the horizons
#define L5_CM (HIDDEN_DIM / (16 * NWARPS))  // a warp's m16 tiles of columns
#define L5_DS (HIDDEN_DIM / NWARPS)         // a warp's slice of D in the scores
#define L5_HW ((N_HORIZONS + NWARPS - 1) / NWARPS)  // a warp's horizons in the softmax
#define L5_GN 4                             // grad_ln's n8 tiles of columns an item

// Keys [k0, k0 + L5_KC) of a row's ln (zeros past K) into a slot, L5_LDW floats a key.
__device__ __forceinline__ void l5_fetch_keys(float* dst, const float* __restrict__ lnb,
                                              const int k0, const int K)
{
    for (int e = threadIdx.x; e < L5_KC * (HIDDEN_DIM / 4); e += BLOCK) {
        const int r = e / (HIDDEN_DIM / 4), c = e % (HIDDEN_DIM / 4) * 4;
        const bool valid = k0 + r < K;
        copy_async<16>(dst + r * L5_LDW + c,
                       valid ? lnb + (size_t)(k0 + r) * HIDDEN_DIM + c : lnb, valid);
    }
}

// Slot v of the block's sequence of (row, chunk) visits (vpr a row) lands after
// `cp.async.wait_group STAGES - 2` at visit v: every visit commits one group, empty past the end.
struct L5Visit {
    int b, rem;  // the batch row, and the visit's place among the row's vpr visits
};
__device__ __forceinline__ L5Visit l5_visit(const int v, const int vpr)
{
    return {(int)blockIdx.x + v / vpr * (int)gridDim.x, v % vpr};
}

// The scores' partial sums of the slot ls: warp w's slice of D, every horizon (rows of x ldx
// apart), into sp[w][h][key].
__device__ __forceinline__ void l5_partial_scores(float* sp, const float* ls, const float* x,
                                                  const int ldx)
{
    const int warp = threadIdx.x / 32, d0 = warp * L5_DS;
    float acc[1][L5_NT][4];
    tf32_zero(acc);
    tf32_gemm<1, L5_NT, L5_DS / 8, false, false>(acc, ls + d0, L5_LDW, x + d0, ldx);
    float* spw = sp + warp * N_HORIZONS * L5_KC;
    tf32_each(acc, [=](int m, int n, float v) { spw[n * L5_KC + m] = v; });
}

// Horizon h's sum over the warps' partial sums at key k (warp order).
__device__ __forceinline__ float l5_score(const float* sp, const int h, const int k)
{
    float s = 0.f;
#pragma unroll
    for (int w = 0; w < NWARPS; ++w) s += sp[(w * N_HORIZONS + h) * L5_KC + k];
    return s;
}

// Dynamic shared memory (floats): the ring [STAGES][L5_KC][L5_LDW], the partial scores
// [NWARPS][N_HORIZONS][L5_KC], P [N_HORIZONS][L5_LDK], each horizon's rescale and (at a row's
// end) sum [2][N_HORIZONS].
extern "C" __global__ void POOL_BOUNDS pool_forward(POOL_FORWARD_PARAMS)
{
    pdl_wait();
    extern __shared__ __align__(16) float smem[];
    float *ring = smem, *sp = ring + STAGES * L5_FSLOT, *ps = sp + L5_PARTS;
    float *corr = ps + N_HORIZONS * L5_LDK, *lsum = corr + N_HORIZONS;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int d0 = warp * 16 * L5_CM;
    const float to_log2 = scale * LOG2E;
    const int nch = (K + L5_KC - 1) / L5_KC;
    const int rows = B > (int)blockIdx.x ? (B - 1 - (int)blockIdx.x) / (int)gridDim.x + 1 : 0;
    const int visits = rows * nch;
    auto fetch = [&](int v) {
        if (v < visits) {
            const L5Visit at = l5_visit(v, nch);
            l5_fetch_keys(ring + v % STAGES * L5_FSLOT, ln + (size_t)at.b * K * HIDDEN_DIM,
                          at.rem * L5_KC, K);
        }
        copy_commit();
    };
    for (int v = 0; v < STAGES - 1; ++v) fetch(v);

    float top[L5_HW], sum[L5_HW];  // the warp's horizons warp + j NWARPS
    float acc[L5_CM][L5_NT][4];
    for (int v = 0; v < visits; ++v) {
        const L5Visit at = l5_visit(v, nch);
        const int k0 = at.rem * L5_KC;
        asm volatile("cp.async.wait_group %0;\n" ::"n"(STAGES - 2) : "memory");
        __syncthreads();  // slot v is in; every warp is done with visit v - 1
        fetch(v + STAGES - 1);
        const float* ls = ring + v % STAGES * L5_FSLOT;
        if (at.rem == 0) {
#pragma unroll
            for (int j = 0; j < L5_HW; ++j) {
                top[j] = -INFINITY;
                sum[j] = 0.f;
            }
            tf32_zero(acc);
        }
        l5_partial_scores(sp, ls, q_h, HIDDEN_DIM);
        __syncthreads();
        float* attnb = attn + ATTN_ROW(at.b);
        const bool last = at.rem == nch - 1;
#pragma unroll
        for (int j = 0; j < L5_HW; ++j) {
            const int h = warp + j * NWARPS;
            if (h >= N_HORIZONS) break;
            const int k = k0 + lane;
            const bool valid = lane < L5_KC && k < K;
            const float s = valid ? l5_score(sp, h, lane) * to_log2 : -INFINITY;
            if (valid) attnb[(size_t)h * ATTN_STRIDE + k] = s;
            const float mx = fmaxf(top[j], group_max<32>(s));
            const float p = valid ? exp2f(s - mx) : 0.f;
            const float f = top[j] == -INFINITY ? 0.f : exp2f(top[j] - mx);
            sum[j] = fmaf(sum[j], f, warp_sum(p));
            top[j] = mx;
            if (lane < L5_KC) ps[h * L5_LDK + lane] = p;
            if (lane == 0) {
                corr[h] = f;
                if (last) lsum[h] = sum[j];
            }
        }
        __syncthreads();
        tf32_each(acc, [&](int m, int n, float& v) { v *= corr[n]; });
        tf32_gemm<L5_CM, L5_NT, L5_KC / 8, true, false>(acc, ls + d0, L5_LDW, ps, L5_LDK);
        if (last) {
            float* ctxb = ctx + (size_t)at.b * N_HORIZONS * HIDDEN_DIM + d0;
            tf32_each(acc, [=](int m, int n, float& v) {
                ctxb[n * HIDDEN_DIM + m] = v / lsum[n];
            });
#pragma unroll
            for (int j = 0; j < L5_HW; ++j) {
                const int h = warp + j * NWARPS;
                if (h >= N_HORIZONS) break;
                const float inv = 1.f / sum[j];
                float* ah = attnb + (size_t)h * ATTN_STRIDE;
                for (int k = lane; k < K; k += 32) ah[k] = exp2f(ah[k] - top[j]) * inv;
#if SPLIT_COUNT > 1
                if (lane == 0) SPLIT_LSE(at.b, h) = (top[j] + log2f(sum[j])) / LOG2E;
#endif
            }
        }
    }
}

// Dynamic shared memory (floats): the ring [STAGES] of slots (ln [L5_KC][L5_LDW], then attn
// [N_HORIZONS][L5_LDK]); the G rows of two batch rows [2][N_HORIZONS][L5_LDW]; the partial
// products [NWARPS][N_HORIZONS][L5_KC]; DS [N_HORIZONS][L5_LDK]; c [N_HORIZONS]. q through L1,
// so that two blocks of 256 fit an SM at H=8, D=512.
extern "C" __global__ void POOL_BOUNDS pool_backward(POOL_BACKWARD_PARAMS)
{
    pdl_wait();
    extern __shared__ __align__(16) float smem[];
    float *ring = smem, *gs2 = ring + STAGES * L5_BSLOT;
    float *sp = gs2 + 2 * N_HORIZONS * L5_LDW, *ds = sp + L5_PARTS;
    float *cst = ds + N_HORIZONS * L5_LDK;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int d0 = warp * 16 * L5_CM;
    constexpr int items = HIDDEN_DIM / (8 * L5_GN);
    const int nch = (K + L5_KC - 1) / L5_KC;
    const int passes = ctx ? 1 : 2;  // without ctx, a first pass over the slots forms c
    const int vpr = passes * nch;
    const int rows = B > (int)blockIdx.x ? (B - 1 - (int)blockIdx.x) / (int)gridDim.x + 1 : 0;
    const int visits = rows * vpr;
    auto fetch = [&](int v) {
        if (v < visits) {
            const L5Visit at = l5_visit(v, vpr);
            const int k0 = at.rem % nch * L5_KC;
            float* slot = ring + v % STAGES * L5_BSLOT;
            l5_fetch_keys(slot, ln + (size_t)at.b * K * HIDDEN_DIM, k0, K);
            const float* attnb = attn + ATTN_ROW(at.b);
            for (int e = threadIdx.x; e < N_HORIZONS * L5_KC; e += BLOCK) {
                const int h = e / L5_KC, k = k0 + e % L5_KC;
                copy_async<4>(slot + L5_FSLOT + h * L5_LDK + e % L5_KC,
                              k < K ? attnb + (size_t)h * ATTN_STRIDE + k : attnb, k < K);
            }
            if (at.rem == 0) {  // the row's G, beside the previous row's
                const float* gcb = grad_ctx + (size_t)BATCH_ROW(at.b) * N_HORIZONS * HIDDEN_DIM;
                float* gs = gs2 + v / vpr % 2 * N_HORIZONS * L5_LDW;
                for (int e = threadIdx.x; e < N_HORIZONS * (HIDDEN_DIM / 4); e += BLOCK) {
                    const int r = e / (HIDDEN_DIM / 4), c = e % (HIDDEN_DIM / 4) * 4;
                    copy_async<16>(gs + r * L5_LDW + c, gcb + (size_t)r * HIDDEN_DIM + c, true);
                }
            }
        }
        copy_commit();
    };
    // slots in flight: a row of fewer than STAGES - 1 slots takes fewer, so that the G rows of
    // the row after next never land on those of a row still in use
    const int ahead = min(STAGES - 1, nch);
    for (int v = 0; v < ahead; ++v) fetch(v);

    float gq[L5_CM][L5_NT][4];
    tf32_zero(gq);
    for (int v = 0; v < visits; ++v) {
        const L5Visit at = l5_visit(v, vpr);
        const int k0 = at.rem % nch * L5_KC;
        const bool forming = at.rem < (passes - 1) * nch;  // the first pass without ctx
        if (ahead == STAGES - 1)
            asm volatile("cp.async.wait_group %0;\n" ::"n"(STAGES - 2) : "memory");
        else
            asm volatile("cp.async.wait_group 0;\n" ::: "memory");
        __syncthreads();  // slot v is in; every warp is done with visit v - 1
        fetch(v + ahead);
        const float* ls = ring + v % STAGES * L5_BSLOT;
        const float* as = ls + L5_FSLOT;
        const float* gs = gs2 + v / vpr % 2 * N_HORIZONS * L5_LDW;
        const float* gab = grad_attn ? grad_attn + ATTN_ROW(at.b) : nullptr;
        if (at.rem == 0) {  // c from ctx, or zero for the first pass to sum
#pragma unroll
            for (int j = 0; j < L5_HW; ++j) {
                const int h = warp + j * NWARPS;
                if (h >= N_HORIZONS) break;
                float c = 0.f;
                if (ctx) {
                    const float* cb = ctx + ((size_t)BATCH_ROW(at.b) * N_HORIZONS + h) * HIDDEN_DIM;
                    for (int d = lane; d < HIDDEN_DIM; d += 32)
                        c = fmaf(gs[h * L5_LDW + d], cb[d], c);
#if SPLIT_COUNT == 1
                    if (gab)
                        for (int k = lane; k < K; k += 32)
                            c = fmaf(attn[ATTN_ROW(at.b) + (size_t)h * K + k],
                                     gab[(size_t)h * K + k], c);
#endif
                    c = warp_sum(c);
#if SPLIT_COUNT > 1
                    if (gab) c += SPLIT_ATTN_DOT(at.b, h);
#endif
                }
                if (lane == 0) cst[h] = c;
            }
        }
        l5_partial_scores(sp, ls, gs, L5_LDW);
        __syncthreads();
        if (forming) {  // c[h] += sum over the slot's keys of A (DW + GA), a warp a horizon
#pragma unroll
            for (int j = 0; j < L5_HW; ++j) {
                const int h = warp + j * NWARPS;
                if (h >= N_HORIZONS) break;
                const int k = k0 + lane;
                float t = 0.f;
                if (lane < L5_KC && k < K)
                    t = as[h * L5_LDK + lane]
                        * (l5_score(sp, h, lane) + (gab ? gab[(size_t)h * ATTN_STRIDE + k] : 0.f));
                t = warp_sum(t);
                if (lane == 0) cst[h] += t;
            }
            continue;  // the next visit's barrier orders c and sp
        }
        for (int e = threadIdx.x; e < N_HORIZONS * L5_KC; e += BLOCK) {
            const int h = e / L5_KC, m = e % L5_KC, k = k0 + m;
            const float ga = gab && k < K ? gab[(size_t)h * ATTN_STRIDE + k] : 0.f;
            ds[h * L5_LDK + m] = scale * as[h * L5_LDK + m] * (l5_score(sp, h, m) + ga - cst[h]);
        }
        __syncthreads();
        float* glb = grad_ln + (size_t)at.b * K * HIDDEN_DIM;
        for (int it = warp; it < items; it += NWARPS) {
            const int n0 = it * 8 * L5_GN;
            float acc[1][L5_GN][4];
            tf32_zero(acc);
            tf32_gemm<1, L5_GN, N_HORIZONS / 8, true, true>(acc, as, L5_LDK, gs + n0, L5_LDW);
            tf32_gemm<1, L5_GN, N_HORIZONS / 8, true, true>(acc, ds, L5_LDK, q_h + n0, HIDDEN_DIM);
            // a lane's pairs of columns (8 j + 2 t) at rows g and g + 8: one 8-byte store each
            const int g = lane / 4, t = lane % 4;
#pragma unroll
            for (int j = 0; j < L5_GN; ++j)
#pragma unroll
                for (int r = 0; r < 2; ++r)
                    if (k0 + g + 8 * r < K)
                        *reinterpret_cast<float2*>(glb + (size_t)(k0 + g + 8 * r) * HIDDEN_DIM
                                                   + n0 + 8 * j + 2 * t) =
                            make_float2(acc[0][j][2 * r], acc[0][j][2 * r + 1]);
        }
        tf32_gemm<L5_CM, L5_NT, L5_KC / 8, true, false>(gq, ls + d0, L5_LDW, ds, L5_LDK);
    }
    float* row = gq_scratch + (size_t)blockIdx.x * N_HORIZONS * HIDDEN_DIM + d0;
    tf32_each(gq, [=](int m, int n, float& v) { row[n * HIDDEN_DIM + m] = v; });
}
