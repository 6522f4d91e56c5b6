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
#define MARGIN 8.f
// The forward's knobs: a backward variant compiles the forward entry with them off.
#ifndef SMEM_SCORES
#define SMEM_SCORES 0
#endif
#ifndef LANE_ACC
#define LANE_ACC 0
#endif
#ifndef QREG
#define QREG 0
#endif
#if SMEM_SCORES && TW != 1
#error "SMEM_SCORES needs one-warp teams"
#endif

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

// A warp's rows (r = 0 .. rows-1) and its steps j = 0 .. per_row-1 in each of them. The forward
// takes a row's steps in key order; the backward (FROM_END) from the row's last key: the forward
// read those last, so they are what the L2 still holds when the backward follows it.
template <bool FROM_END = false>
struct Walk {
    int first_row, stride, rows, per_row, wt, last;
    __device__ Walk(const int B, const int K, const int team, const int wt_) : wt(wt_) {
        stride = gridDim.x * TEAMS;
        first_row = blockIdx.x * TEAMS + team;
        rows = first_row < B ? (B - first_row + stride - 1) / stride : 0;
        const int nsteps = (K + SKEYS - 1) / SKEYS;
        per_row = nsteps > wt ? (nsteps - wt + TW - 1) / TW : 0;
        last = nsteps - 1;
    }
    __device__ int row(const int r) const { return first_row + r * stride; }
    __device__ int key0(const int j) const {
        return (FROM_END ? last - (wt + j * TW) : wt + j * TW) * SKEYS;
    }
};

// The producer side of a warp's ring: the (row, step) it copies next and the slot it goes to.
// A slot gets ln rows key0 .. key0+SKEYS-1 (zeros past K) and, when `extra`, attn and grad_attn
// at those keys (zeros where grad_attn is absent).
// The constructor takes warp `warp`'s ring out of `rings` and issues its first STAGES-1 steps.
template <int SLOT>
struct Ring {
    float* slots;
    int pr, pj, pslot;
    template <class W>
    __device__ Ring(float* rings, const int warp, const W& w, const float* __restrict__ ln,
                    const float* __restrict__ attn, const float* __restrict__ gab, const int K,
                    const int lane, const bool extra)
        : slots(rings + warp * STAGES * SLOT), pr(w.per_row ? 0 : w.rows), pj(0), pslot(0)
    {
#pragma unroll
        for (int i = 0; i < STAGES - 1; ++i) issue(w, ln, attn, gab, K, lane, extra);
    }

    template <class W>
    __device__ void issue(const W& w, const float* __restrict__ ln,
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
                              valid ? from + ATTN_HROW(b, h) + k0 + j : ln, valid);
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

