// LAYOUT 2 of the pool (cu/pool.cu): lane groups over keys fed by a cp.async ring per warp.
#include "pool_ring.cuh"

#if LANE_ACC && (TW != 1 || SKEYS % 4)
#error "LANE_ACC needs one-warp teams and steps of a multiple of 4 keys"
#endif
// The forward's horizon h query columns of lane gl (its group's columns) as qh: with QREG the
// row q[h] in registers, else read from the shared copy qs. A macro: it declares qh.
#if QREG
#define QUERY_COLS(h) const float* qh = q[h]
#else
#define QUERY_COLS(h) float qh[GCOLS]; group_cols(qs + (h) * HIDDEN_DIM, gl, qh)
#endif
// Forward. Scores: a lane group per key (q read once for the group's GROUP_KEYS keys).
// Softmax: online, in log2 units (q is pre-scaled by scale*log2(e)); the running max moves
// only when a score passes it by MARGIN (a warp vote), so most keys skip the rescale.
// One body: the query setup, the step's work and the row's end are #if LANE_ACC pieces of it,
// kept whole so that each variant compiles to the code its tuned timings were measured on.
// LANE_ACC chooses where the accumulators live.
// LANE_ACC 0: per lane group, each with its own running max and sum. Raw scores go to attn
// (with SMEM_SCORES, a one-warp team keeps them in shared memory instead, so attn is written
// once) and are normalised at the row's end. Row end: groups merge by butterfly. A one-warp
// team then writes ctx and attn from its registers; larger teams merge through shared memory
// (one team barrier per row; the merge buffers alternate between rows so the next row's writes
// cannot meet this row's reads).
// LANE_ACC 1: lane-owned accumulators (one-warp teams). Each group's softmax weights go
// through the warp's buffer pw and every lane accumulates its own columns (group_cols<32>) of
// the step's SKEYS rows: N_HORIZONS*ROW_PER_LANE accumulators a lane instead of
// N_HORIZONS*GCOLS repeated in every group, and no merge of the groups at the row's end. The
// running max is the warp's (one vote a step for all horizons); the sums are per lane group.
// Dynamic shared memory: POOL_FORWARD_FLOATS_L2 (pool_sizes.cuh).
extern "C" __global__ void POOL_BOUNDS pool_forward(POOL_FORWARD_PARAMS)
{
    pdl_wait();
    extern __shared__ __align__(16) float smem[];
    float* ring = smem;
    float* qs = ring + L2_RINGS;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane / GROUP, gl = lane % GROUP;
    const float qscale = scale * LOG2E;
#if LANE_ACC
    float* pw = qs + L2_QUERIES;
    for (int e = threadIdx.x; e < N_HORIZONS * HIDDEN_DIM; e += BLOCK) qs[e] = q_h[e] * qscale;
#if SMEM_SCORES
    float* wsc = pw + L2_WEIGHTS + warp * N_HORIZONS * K;
#endif
    pw += warp * N_HORIZONS * SKEYS;
    __syncthreads();
#if QREG
    float q[N_HORIZONS][GCOLS];
#pragma unroll
    for (int h = 0; h < N_HORIZONS; ++h) group_cols(qs + h * HIDDEN_DIM, gl, q[h]);
#endif

    const Walk<> w(B, K, warp, 0);
#else
    const int team = warp / TW, wt = warp % TW;
#if QREG
    float q[N_HORIZONS][GCOLS];
#pragma unroll
    for (int h = 0; h < N_HORIZONS; ++h) {
        group_cols(q_h + h * HIDDEN_DIM, gl, q[h]);
#pragma unroll
        for (int j = 0; j < GCOLS; ++j) q[h][j] *= qscale;
    }
#else
    for (int e = threadIdx.x; e < N_HORIZONS * HIDDEN_DIM; e += BLOCK) qs[e] = q_h[e] * qscale;
    __syncthreads();
#endif
    [[maybe_unused]] float* macc = qs + L2_QUERIES;
#if SMEM_SCORES
    float* wsc = macc + warp * N_HORIZONS * K;  // one-warp teams only: no merge buffers there
#endif

    const Walk<> w(B, K, team, wt);
#endif
    Ring<FSLOT> ring_in(ring, warp, w, ln, nullptr, nullptr, K, lane, false);

    int cslot = 0;
    for (int r = 0; r < w.rows; ++r) {
        const int b = w.row(r);
        float* attnb = attn + ATTN_ROW(b);
        float m[N_HORIZONS], l[N_HORIZONS], acc[N_HORIZONS][L2_ACC_COLS];
        row_start(m, l, acc);
        for (int j = 0; j < w.per_row; ++j) {
            ring_in.issue(w, ln, nullptr, nullptr, K, lane, false);
            copy_wait();
            __syncwarp();
#if LANE_ACC
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
                QUERY_COLS(h);
#pragma unroll
                for (int u = 0; u < GROUP_KEYS; ++u) {
                    const int k = k0 + u * KPW + g;
                    const float v = group_sum<GROUP>(lane_dot(qh, x[u]));
                    sc[u][h] = k < K ? v : -INFINITY;
#if SMEM_SCORES
                    if (gl == 0 && k < K) wsc[h * K + k] = v;
#else
                    if (gl == 0 && k < K) attnb[(size_t)h * ATTN_STRIDE + k] = v;
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
#else
            const int k = w.key0(j) + g;
            const bool valid = k < K;
            float x[GCOLS];
            group_cols(ring_in.slots + cslot * FSLOT + g * HIDDEN_DIM, gl, x);
#pragma unroll
            for (int h = 0; h < N_HORIZONS; ++h) {
                QUERY_COLS(h);
                const float sc = group_sum<GROUP>(lane_dot(qh, x));
#if SMEM_SCORES
                if (gl == 0 && valid) wsc[h * K + k] = sc;
#else
                if (gl == 0 && valid) attnb[(size_t)h * ATTN_STRIDE + k] = sc;
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
#endif
            cslot = cslot + 1 == STAGES ? 0 : cslot + 1;
        }
#if LANE_ACC
        float* ctxb = ctx + (size_t)b * N_HORIZONS * HIDDEN_DIM;
#pragma unroll
        for (int h = 0; h < N_HORIZONS; ++h) {
            l[h] = 1.f / across_groups(l[h]);
#if SPLIT_COUNT > 1
            if (lane == 0) SPLIT_LSE(b, h) = (m[h] - log2f(l[h])) / LOG2E;  // l: 1 / the sum
#endif
            float o[ROW_PER_LANE];
#pragma unroll
            for (int i = 0; i < ROW_PER_LANE; ++i) o[i] = acc[h][i] * l[h];
            store_row(ctxb + h * HIDDEN_DIM, lane, o);
        }
        __syncwarp();  // the raw scores this warp's lanes wrote are complete
#pragma unroll
        for (int h = 0; h < N_HORIZONS; ++h) {
            float* ah = attnb + (size_t)h * ATTN_STRIDE;
#if SMEM_SCORES
            const float* sh = wsc + h * K;
#else
            const float* sh = ah;
#endif
            for (int k = lane; k < K; k += 32) ah[k] = exp2f(sh[k] - m[h]) * l[h];
        }
        __syncwarp();  // this row's scores are read before the next row's are written
#else

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
#if SPLIT_COUNT > 1
            if (lane == 0) SPLIT_LSE(b, h) = (m[h] + log2f(l[h])) / LOG2E;
#endif
            l[h] = 1.f / l[h];
            if (h % KPW == g) store_group_cols(ctxb + h * HIDDEN_DIM, gl, acc[h], l[h]);
        }
        __syncwarp();
#pragma unroll 1
        for (int h = 0; h < N_HORIZONS; ++h) {
            float* ah = attnb + (size_t)h * ATTN_STRIDE;
#if SMEM_SCORES
            const float* sh = wsc + h * K;
            for (int k = lane; k < K; k += 32) ah[k] = exp2f(sh[k] - m[h]) * l[h];
#else
            for (int k = lane; k < K; k += 32) ah[k] = exp2f(ah[k] - m[h]) * l[h];
#endif
        }
        __syncwarp();  // this row's scores are read before the next row's are written
#else
        float* mml = macc + L2_MERGE_ACC;
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
#if SPLIT_COUNT > 1
            if (t == 0) SPLIT_LSE(b, h) = (mt + log2f(lt)) / LOG2E;
#endif
            float* ctxh = ctxb + h * HIDDEN_DIM;
            for (int d = t; d < HIDDEN_DIM; d += TW * 32) {
                float v = 0.f;
#pragma unroll
                for (int u = 0; u < TW; ++u)
                    v = fmaf(tacc[u * N_HORIZONS * HIDDEN_DIM + h * HIDDEN_DIM + d], f[u], v);
                ctxh[d] = v * inv;
            }
            float* ah = attnb + (size_t)h * ATTN_STRIDE;
            for (int k = t; k < K; k += TW * 32) ah[k] = exp2f(ah[k] - mt) * inv;
        }
#endif
#endif
    }
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
extern "C" __global__ void POOL_BOUNDS pool_backward(POOL_BACKWARD_PARAMS)
{
    pdl_wait();
    extern __shared__ __align__(16) float smem[];
    float* qs = smem + BRING;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int team = warp / TW, wt = warp % TW;
    const int g = lane / GROUP, gl = lane % GROUP;
    for (int e = threadIdx.x; e < N_HORIZONS * HIDDEN_DIM; e += BLOCK) qs[e] = q_h[e] * scale;
    __syncthreads();

    const Walk<true> w(B, K, team, wt);
    Ring<BSLOT> ring_in(smem, warp, w, ln, attn, grad_attn, K, lane, true);

    float gq[N_HORIZONS][GCOLS];
#pragma unroll
    for (int h = 0; h < N_HORIZONS; ++h)
#pragma unroll
        for (int c = 0; c < GCOLS; ++c) gq[h][c] = 0.f;

    int cslot = 0;
    for (int r = 0; r < w.rows; ++r) {
        const int b = w.row(r);
        const float* gcb = grad_ctx + (size_t)BATCH_ROW(b) * N_HORIZONS * HIDDEN_DIM;
        const float* attnb = attn + ATTN_ROW(b);
        float gc[N_HORIZONS][GCOLS], c[N_HORIZONS];
#pragma unroll
        for (int h = 0; h < N_HORIZONS; ++h) {
            group_cols(gcb + h * HIDDEN_DIM, gl, gc[h]);
            float v = 0.f;
            if (ctx) {
                float y[GCOLS];
                group_cols(ctx + ((size_t)BATCH_ROW(b) * N_HORIZONS + h) * HIDDEN_DIM, gl, y);
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
                    if (k < K) share[h] = fmaf(attnb[(size_t)h * ATTN_STRIDE + k], dot, share[h]);
                }
            }
#pragma unroll
            for (int h = 0; h < N_HORIZONS; ++h) c[h] = across_groups(share[h]);
        }
        if (grad_attn) {
#if SPLIT_COUNT > 1
#pragma unroll
            for (int h = 0; h < N_HORIZONS; ++h) c[h] += SPLIT_ATTN_DOT(b, h);
#else
            const float* gab = grad_attn + (size_t)b * N_HORIZONS * K;
#pragma unroll 1
            for (int h = 0; h < N_HORIZONS; ++h) {
                float v = 0.f;
                for (int k = lane; k < K; k += 32)
                    v = fmaf(attnb[(size_t)h * K + k], gab[(size_t)h * K + k], v);
                c[h] += warp_sum(v);
            }
#endif
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
