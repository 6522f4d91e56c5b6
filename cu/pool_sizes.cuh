// The pool's sizes, declared once: the kernels take their per-lane register rows and their
// dynamic shared-memory regions from these macros, and the host (pycuda_heads/ops/pool.py)
// reads this file for its restrictions and launch sizes. Each is an integer expression over
// the template constants, the launch knobs and K (the kernels' key count: the POOL_*_FLOATS
// totals, in floats, are per launch); the host evaluates `/` as floor division.
#define NWARPS (BLOCK / 32)

// LAYOUT 0: per warp a partial row [N_HORIZONS][HIDDEN_DIM] (forward: context, backward:
// grad_q_h), a row of scores [N_HORIZONS][K] (two in the backward: attn, dw then ds), per-warp
// and merged max and sum (forward) or c (backward) per horizon.
#define L0_WARP_ROWS (NWARPS * N_HORIZONS * HIDDEN_DIM)
#define L0_SCORES (N_HORIZONS * K)
#define L0_STATS (NWARPS * N_HORIZONS)
#define POOL_FORWARD_FLOATS_L0 (L0_WARP_ROWS + L0_SCORES + 2 * L0_STATS + 2 * N_HORIZONS)
#define POOL_BACKWARD_FLOATS_L0 (L0_WARP_ROWS + 2 * L0_SCORES + N_HORIZONS)

// LAYOUT 1: weighted_rows' items, tiles of HTILE horizons by VEC columns, shared by SLICES
// threads each when there are fewer items than threads; their partial sums in shared memory.
#define HTILE (N_HORIZONS < 8 ? N_HORIZONS : 8)
#define DCHUNKS (HIDDEN_DIM / VEC)
#define ITEMS ((N_HORIZONS + HTILE - 1) / HTILE * DCHUNKS)
#define SLICES (ITEMS < BLOCK ? BLOCK / ITEMS : 1)
#define POOL_FORWARD_FLOATS_L1 (ITEMS < BLOCK ? SLICES * ITEMS * HTILE * VEC : 0)
#define POOL_BACKWARD_FLOATS_L1 POOL_FORWARD_FLOATS_L1

// LAYOUT 2: KPW lane groups of GROUP lanes a warp, SKEYS keys a warp step, GCOLS columns of a
// row a lane, TW warps a team. A ring slot holds a step's ln rows (FSLOT); the backward's
// also attn and grad_attn at those keys, rounded up to keep slots 16-byte aligned (BSLOT).
#define KPW (32 / GROUP)
#define SKEYS (KPW * GROUP_KEYS)
#define GCHUNKS ((HIDDEN_DIM + GROUP * VEC - 1) / (GROUP * VEC))
#define GCOLS (GCHUNKS * VEC)
#define TW (NWARPS / TEAMS)
// The forward's accumulators a lane: its own columns of every row with LANE_ACC, else a group's.
#define L2_ACC_COLS (LANE_ACC ? ROW_PER_LANE : GCOLS)
#define FSLOT (SKEYS * HIDDEN_DIM)
#define BEXTRA ((2 * N_HORIZONS * SKEYS + 3) / 4 * 4)
#define BSLOT (FSLOT + BEXTRA)
// Forward: the rings; the scaled queries (with LANE_ACC rounded up to 4, else none with QREG);
// with LANE_ACC the weights [NWARPS][N_HORIZONS][SKEYS]; without it and with teams of several
// warps the merge accumulators [2][NWARPS][N_HORIZONS*HIDDEN_DIM] and max/sum
// [2][NWARPS][N_HORIZONS][2]; with SMEM_SCORES the raw scores [NWARPS][N_HORIZONS*K].
#define L2_RINGS (NWARPS * STAGES * FSLOT)
#define L2_QUERIES (LANE_ACC ? (N_HORIZONS * HIDDEN_DIM + 3) / 4 * 4 \
                             : QREG ? 0 : N_HORIZONS * HIDDEN_DIM)
#define L2_WEIGHTS (LANE_ACC ? NWARPS * N_HORIZONS * SKEYS : 0)
#define L2_MERGE_ACC (2 * NWARPS * N_HORIZONS * HIDDEN_DIM)
#define L2_MERGE (LANE_ACC || TW == 1 ? 0 : L2_MERGE_ACC + 4 * NWARPS * N_HORIZONS)
#define L2_SCORES (SMEM_SCORES * NWARPS * N_HORIZONS * K)
#define POOL_FORWARD_FLOATS_L2 (L2_RINGS + L2_QUERIES + L2_WEIGHTS + L2_MERGE + L2_SCORES)
// Backward: the rings [NWARPS][STAGES][BSLOT], reused at the end for the per-warp partials
// [NWARPS][N_HORIZONS*HIDDEN_DIM] (the region is the larger of the two), then the queries.
#define BRING (NWARPS * (STAGES * BSLOT > N_HORIZONS * HIDDEN_DIM ? STAGES * BSLOT \
                                                                    : N_HORIZONS * HIDDEN_DIM))
#define POOL_BACKWARD_FLOATS_L2 (BRING + N_HORIZONS * HIDDEN_DIM)

// LAYOUT 3: chunks of KC keys; score tiles of 4 horizons by TK keys, T1 threads a D slice,
// KSPLIT slices of DSLICE columns. Shared rows are padded to WROW floats: float4 reads of 8
// rows cover all 32 banks.
#define WROW (HIDDEN_DIM + 4)
#define KC (CHUNK / HIDDEN_DIM)
#define TK (N_HORIZONS * KC >= 2 * BLOCK ? 2 : 1)
#define T1 (N_HORIZONS * KC / (4 * TK))
#define KSPLIT (BLOCK / T1 > 0 ? BLOCK / T1 : 1)
#define DSLICE (HIDDEN_DIM / KSPLIT)
// Forward: queries [N_HORIZONS][WROW], ln chunks [2][KC][WROW], partial scores
// [KSPLIT][N_HORIZONS][KC], running max, sum and rescale [3][N_HORIZONS]. Backward: queries
// and grad_ctx, the chunks, partial products, attn [N_HORIZONS][KC] and c [N_HORIZONS].
#define L3_ROWS (N_HORIZONS * WROW)
#define L3_CHUNKS (2 * KC * WROW)
#define L3_PRODUCTS (KSPLIT * N_HORIZONS * KC)
#define POOL_FORWARD_FLOATS_L3 (L3_ROWS + L3_CHUNKS + L3_PRODUCTS + 3 * N_HORIZONS)
#define POOL_BACKWARD_FLOATS_L3 (2 * L3_ROWS + L3_CHUNKS + L3_PRODUCTS + N_HORIZONS * KC \
                                 + N_HORIZONS)

// LAYOUT 4: the whole row of ln, L4_KP keys (K rounded up to a multiple of 16), rows padded to
// L4_LDW floats; rows over the keys (scores, P, attn, DS) L4_LDK apart. Forward: ln, P.
// Backward: q and grad_ctx, ln, attn and DS.
#define L4_KP ((K + 15) / 16 * 16)
#define L4_LDW (HIDDEN_DIM + 4)
#define L4_LDK (L4_KP + 4)
#define POOL_FORWARD_FLOATS_L4 (L4_KP * L4_LDW + N_HORIZONS * L4_LDK)
#define POOL_BACKWARD_FLOATS_L4 ((2 * N_HORIZONS + L4_KP) * L4_LDW + 2 * N_HORIZONS * L4_LDK)

// LAYOUT 5: ring slots of L5_KC keys, the forward's rows padded to L5_LDW floats, the
// backward's HIDDEN_DIM floats with their 16-byte chunks swizzled (L5_BLN; its slots also hold
// attn at those keys, [N_HORIZONS][L5_LDK]); the warps' partial scores [NWARPS][N_HORIZONS]
// [L5_SPK]. Forward: the ring, the partials, P [N_HORIZONS][L5_LDK], rescale and sum a horizon.
// Backward: the ring, the G rows of two batch rows, the partials, DS and c.
#define L5_KC 16
#define L5_LDW (HIDDEN_DIM + 4)
#define L5_LDK (L5_KC + 4)
#define L5_FSLOT (L5_KC * L5_LDW)
#define L5_BLN (L5_KC * HIDDEN_DIM)
#define L5_BSLOT (L5_BLN + N_HORIZONS * L5_LDK)
// the partials' horizons L5_SPK floats apart: a warp's fragment stores (lanes 4 apart on the
// horizons) hit distinct banks
#define L5_SPK (L5_KC + 4)
#define L5_PARTS (NWARPS * N_HORIZONS * L5_SPK)
#define POOL_FORWARD_FLOATS_L5 (STAGES * L5_FSLOT + L5_PARTS + N_HORIZONS * L5_LDK \
                                + 2 * N_HORIZONS)
#define POOL_BACKWARD_FLOATS_L5 (STAGES * L5_BSLOT + 2 * N_HORIZONS * L5_LDW + L5_PARTS \
                                 + N_HORIZONS * L5_LDK + N_HORIZONS)

// LAYOUT 6 (N_HORIZONS 32, HIDDEN_DIM 128, K <= 64 on wgmma): q's split halves once a block,
// then per warpgroup (BLOCK / 128 of them) a row of L6_KP keys padded to L6_LDW floats (so that
// the float4 fragment reads hit 32 banks) and: forward, a second row buffer, P's halves and
// the warps' partial max and sum (L6_FWG); backward, G's halves, DS's halves and the warps'
// partial c (L6_BWG).
#define L6_KP 64
#define L6_LDW (HIDDEN_DIM + 16)
#define L6_FWG (2 * L6_KP * L6_LDW + 2 * N_HORIZONS * L6_KP + 2 * 4 * N_HORIZONS)
#define L6_BWG (L6_KP * L6_LDW + 2 * N_HORIZONS * HIDDEN_DIM + 2 * N_HORIZONS * L6_KP \
                + 4 * N_HORIZONS)
#define POOL_FORWARD_FLOATS_L6 (2 * N_HORIZONS * HIDDEN_DIM + BLOCK / 128 * L6_FWG)
#define POOL_BACKWARD_FLOATS_L6 (2 * N_HORIZONS * HIDDEN_DIM + BLOCK / 128 * L6_BWG)

// Split-K (pool_split.cuh): threads a block of its kernels, the most splits of a row (the
// combine holds a row's split weights in shared memory), and the attention weights of a row a
// combining block rescales at most (held in registers, SPLIT_SPAN / SPLIT_THREADS a thread).
#define SPLIT_THREADS 256
#define SPLIT_WARPS (SPLIT_THREADS / 32)
#define SPLIT_MAX 256
#define SPLIT_SPAN 2048
