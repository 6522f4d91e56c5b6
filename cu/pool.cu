// Per-horizon attention pool: N_HORIZONS learned queries attend over ln[B, K, HIDDEN_DIM].
// Template constants: N_HORIZONS, HIDDEN_DIM, BLOCK (threads), VEC (floats per load), UNROLL
// (keys in flight per warp), LAYOUT. No atomics: every output element has exactly one writer.
//   LAYOUT 0: one block per batch row; each warp owns keys k = warp*UNROLL + i*NWARPS*UNROLL
//     and holds the query rows in registers, so ln is streamed once per pass for all horizons.
//     Registers grow with N_HORIZONS*HIDDEN_DIM and shared memory with N_HORIZONS*K.
//   LAYOUT 1: one block per batch row, bounded registers and shared memory for any N_HORIZONS
//     <= 32, HIDDEN_DIM <= 1024 and any K: per-key dot products one horizon at a time, the
//     row's scores kept in global memory, weighted sums over keys split into column tiles.
//   LAYOUT 2: GROUP lanes per key, keys streamed through a per-warp ring of shared-memory
//     slots filled by cp.async, teams of warps per batch row, a grid of blocks looping over the
//     rows; the backward reads ln once and keeps grad_q_h's partial in registers. See below.
//   LAYOUT 3: wide heads (N_HORIZONS and HIDDEN_DIM multiples of 4): one block per batch row,
//     score and context products as FP32 register tiles over shared-memory chunks of keys.
//   LAYOUT 4: many horizons (N_HORIZONS a multiple of 8): a block holds a whole row of ln in
//     shared memory and runs the scores, context and backward products on the tensor cores
//     (3xTF32), every warp on each product in turn.
//   LAYOUT 5: wide rows on the tensor cores: ln streamed through a ring of 16-key slots, an
//     online softmax in the forward, the warps splitting D in the scores (3xTF32, as LAYOUT 4).
//   LAYOUT 6: N_HORIZONS 32, HIDDEN_DIM 128, K <= 64 on Hopper's warpgroup MMA (wgmma, sm_90a):
//     a warpgroup a row, 3xTF32 products with A from registers and B's halves in shared memory.
//   POOL_SPLIT (in place of LAYOUT): split-K's joins (pool_split.cuh). A batch row of K keys
//     runs as SPLIT_COUNT virtual rows of K/SPLIT_COUNT keys through any layout compiled with
//     SPLIT_COUNT (it reads and writes the batch row's attn in place, pool_common.cuh); these
//     kernels combine the splits' softmaxes after the forward, and give the backward the row's
//     sum of attn*grad_attn.
//   The layouts' files: pool_layout<N>.cuh, their sizes (registers rows, shared-memory regions)
//   in pool_sizes.cuh, the pieces they share in pool_common.cuh.
#include "heads_common.cuh"
#include "pool_sizes.cuh"
#include "pool_common.cuh"
// LAYOUT 4's, 5's and 6's products, here rather than in their files: a variant's source inlines
// each header once, where it is first named, even inside an inactive #elif
#if !defined(POOL_SPLIT) && (LAYOUT == 4 || LAYOUT == 5 || LAYOUT == 6)
#include "tf32_mma.cuh"
#endif
#if !defined(POOL_SPLIT) && LAYOUT == 6
#include "wgmma.cuh"
#endif
#ifdef POOL_SPLIT
#include "pool_split.cuh"
#elif LAYOUT == 0
#include "pool_layout0.cuh"
#elif LAYOUT == 1
#include "pool_layout1.cuh"
#elif LAYOUT == 2
#include "pool_layout2.cuh"
#elif LAYOUT == 3
#include "pool_layout3.cuh"
#elif LAYOUT == 4
#include "pool_layout4.cuh"
#elif LAYOUT == 5
#include "pool_layout5.cuh"
#elif LAYOUT == 6
#include "pool_layout6.cuh"
#endif
