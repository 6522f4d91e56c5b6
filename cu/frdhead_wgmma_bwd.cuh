// FRD head backward stages on Hopper's warpgroup MMA (wgmma, sm_90a), for the model's head
// shape: D_IN = FRD_HIDDEN = 128 and 104 < HA <= 112 (the restriction in ops/frdhead.py). Each
// stage is two launches, then the host's reduce_axis0 over the scratch rows as for mma.sync:
//   grad_w2  frdhead_wg_dhidden   dhidden = G w2                           (G = grad_logits)
//            frdhead_wg_grad_w2   scratch row j = [G^T hidden | sum_b G] over block j's rows
//   grad_w1  frdhead_wg_grad_h_t  grad_h_t = dpre w1,  dpre = dhidden . [hidden > 0]
//            frdhead_wg_grad_w1   scratch row j = [dpre^T h_t | sum_b dpre]
// Why not one kernel a stage: the row product's W^T halves and the weight gradient's transposed
// tiles, each double-buffered, do not fit one block's shared memory.
// The row product reads the ReLU mask (hidden > 0) from global memory into registers: a hidden
// tile beside dpre's would leave room for one warpgroup a block. The weight gradient copies it
// with the step's tiles: loaded as the step starts, its values kept the step waiting on them.
//
// Row products, y [B, 128] = A W with W [KA, 128] row-major: a block of WG warpgroups stages
// W^T once, split into big and small halves in the K-major core-matrix layout (k padded to a
// whole k-step), then each warpgroup walks 64-row tiles of A grid-strided; a tile's fragments
// are read into registers at once, and its buffer takes the next tile's copies during all of
// its products; the fragments are masked, split and multiplied CS k-steps at a time. Under the
// mask each warp loads its 16 hidden rows of the next tile (a float4 a lane) before the
// products, and keeps two words of their signs after the stores.
// Weight gradients, g [MA, 128] = A^T X summed over the batch (the product's K): a block of two
// warpgroups (output rows 0-63 and 64-127; rows >= MA are not stored) walks a contiguous slice
// of the batch BK rows a step, the next STAGES - 1 steps' raw tiles in flight; each step
// transposes and splits its X tile into the core-matrix layout, and A^T's fragments come from
// the raw A tile (masked by the step's hidden tile), whose values also feed the bias sums (a
// quad's butterfly at the end).
// G's rows (HA floats) are not 16-byte aligned, so its tiles are copied as one contiguous span
// (a tile starts at a multiple of 64 or BK rows: 16-byte aligned) and read at row stride HA.
// Fixed orders everywhere (k ascending within a wgmma, the passes in order, the batch steps in
// order): bitwise reruns. Knobs: WG, CS (the row products), BK, OCC, STAGES (the weight
// gradients: batch rows a step, blocks an SM, steps of raw tiles in shared memory).

#include "wgmma.cuh"

#define WB_ROWS 64                      // a row tile: one m64 product
#define WB_N 128                        // every product's n: F or D_IN
#define WB_KG ((HA + 7) / 8 * 8)        // G's k padded to whole k-steps
#define WB_LDR (WB_N + 4)               // a 128-float row tile's stride: reads g * LD + t
#define WB_LDT (WB_N + 8)               // a batch tile's stride: reads t * LD + g, k * LD + n
#define WB_RP_THREADS (128 * WG)
#define WB_GRAD_THREADS 256
// Each launch's dynamic shared memory in floats; the op reads these four.
#define WB_DHIDDEN_FLOATS (2 * WB_N * WB_KG + WG * WB_ROWS * HA)
#define WB_GRAD_H_T_FLOATS (2 * WB_N * FRD_HIDDEN + WG * WB_ROWS * WB_LDR)
#define WB_GRAD_W2_FLOATS (4 * WB_N * BK + STAGES * BK * (HA + WB_LDT))
#define WB_GRAD_W1_FLOATS (4 * WB_N * BK + STAGES * 3 * BK * WB_LDT)
static_assert(D_IN == 128 && FRD_HIDDEN == 128, "the wgmma backward is built for 128 x 128");
static_assert(HA <= 112 && HA > 104, "G's k-steps: 105..112 logits");
static_assert(BK % 16 == 0, "batch steps of whole k-step pairs, 16-byte aligned G spans");

// a 16-byte copy of which only `bytes` are read (the rest of the 16 written as zeros)
__device__ __forceinline__ void copy_part(float* dst, const float* src, int bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                 :: "r"(smem_address(dst)), "l"(src), "r"(bytes) : "memory");
}

// rows [r0, r0 + ROWS) of x [M, COLS] into buf: COLS % 4 != 0 as one contiguous span at stride
// COLS, else row by row at stride LD (rows past M zero); by NT threads from `tid`, unrolled
// so that each copy's offsets are fixed a thread
template <int ROWS, int COLS, int LD, int NT>
__device__ __forceinline__ void wb_copy_rows(float* buf, const float* __restrict__ x, int r0,
                                             int M, int tid) {
    constexpr int N4 = (ROWS * COLS + 3) / 4;  // 16-byte copies
#pragma unroll
    for (int i = 0; i < (N4 + NT - 1) / NT; ++i) {
        const int e = tid + i * NT;
        if (N4 % NT != 0 && e >= N4) break;
        if constexpr (COLS % 4 != 0) {
            const int v = min(max(max(0, min(ROWS, M - r0)) * COLS - 4 * e, 0), 4);
            copy_part(buf + 4 * e, v ? x + (size_t)r0 * COLS + 4 * e : x, 4 * v);
        } else {
            const int r = e / (COLS / 4), c = 4 * (e % (COLS / 4));
            const bool in = r0 + r < M;
            copy16(buf + r * LD + c, in ? x + (size_t)(r0 + r) * COLS + c : x, in);
        }
    }
}

// element (r, k) of a row tile of A: G's span or dhidden's rows; zero for k >= KA (the padded
// k-steps), and where `keep` is false (the ReLU mask). Branch-free, a load then a select: a
// divergent path around the fragments makes ptxas serialize the wgmma (C7520).
template <int KA>
__device__ __forceinline__ float wb_at(const float* buf, int r, int k, bool keep = true) {
    const float v = KA % 4 ? buf[r * KA + min(k, KA - 1)] : buf[r * WB_LDR + k];
    return (KA % 4 == 0 || k < KA) && keep ? v : 0.f;
}

// hidden rows [r0, r0 + 16) of a row tile, a warp's: row r0 + i's float4 `lane` in v[i] (zero
// past M)
__device__ __forceinline__ void wb_mask_load(float4 (&v)[16], const float* __restrict__ mask,
                                             int r0, int M, int lane) {
#pragma unroll
    for (int i = 0; i < 16; ++i)
        v[i] = r0 + i < M ? __ldg(reinterpret_cast<const float4*>(mask + (size_t)(r0 + i) * WB_N)
                                  + lane)
                          : make_float4(0.f, 0.f, 0.f, 0.f);
}

// the signs a lane's fragments need: bit q of bits[h] is hidden[g + 8h][4q + t] > 0 (rows of
// wb_mask_load's 16), so k-step s's k = 8s + t is bit 2s and k + 4 bit 2s + 1
__device__ __forceinline__ void wb_mask_bits(const float4 (&v)[16], unsigned (&bits)[2], int g,
                                             int t) {
#pragma unroll
    for (int i = 0; i < 16; ++i) {
        const unsigned x = __ballot_sync(0xffffffffu, v[i].x > 0.f);
        const unsigned y = __ballot_sync(0xffffffffu, v[i].y > 0.f);
        const unsigned z = __ballot_sync(0xffffffffu, v[i].z > 0.f);
        const unsigned w = __ballot_sync(0xffffffffu, v[i].w > 0.f);
        const unsigned mine = t == 0 ? x : t == 1 ? y : t == 2 ? z : w;
        if (i == g) bits[0] = mine;
        if (i == g + 8) bits[1] = mine;
    }
}

// y [M, WB_N] = A W, A [M, KA] (masked by `mask` under MASK), W [KA, WB_N]
template <int KA, bool MASK>
__device__ __forceinline__ void wb_row_product(const float* __restrict__ a,
                                               const float* __restrict__ mask,
                                               const float* __restrict__ w,
                                               float* __restrict__ y, const int M) {
    constexpr int KP = (KA + 7) / 8 * 8;
    constexpr int LD = KA % 4 ? KA : WB_LDR;
    constexpr int TILE = KA % 4 ? WB_ROWS * KA : WB_ROWS * WB_LDR;
    static_assert(!MASK || KA == WB_N, "the mask's rows are a float4 a lane");
    float* wb = reinterpret_cast<float*>(dynamic_smem);  // W^T big [WB_N x KP], core layout
    float* ws = wb + WB_N * KP;                           // W^T small
    const int wg = threadIdx.x / 128, tid = threadIdx.x % 128;
    const int warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
    float* buf = ws + WB_N * KP + wg * TILE;
    const int tiles = (M + WB_ROWS - 1) / WB_ROWS, stride = gridDim.x * WG;
    auto load = [&](int tile) {  // one commit group a tile (empty past the last)
        if (tile < tiles) wb_copy_rows<WB_ROWS, KA, LD, 128>(buf, a, tile * WB_ROWS, M, tid);
        commit_copies();
    };
    int tile = blockIdx.x * WG + wg;
    float4 hv[MASK ? 16 : 1];
    unsigned bits[2] = {~0u, ~0u};
    load(tile);
    if constexpr (MASK)
        if (tile < tiles) wb_mask_load(hv, mask, tile * WB_ROWS + 16 * warp, M, lane);
    // W^T transposed and split: lane L takes n % 8 = L / 4 and k % 4 = L % 4 (stores hit 32
    // banks; a warp reads 4 rows of W, 8 consecutive floats each). A thread's loads go out in
    // batches of at most 32 before the first split: one at a time, the block waited out 64
    // round trips to L2.
    constexpr int PER = WB_N * KP / WB_RP_THREADS, NB = (PER + 31) / 32, BATCH = PER / NB;
    static_assert(PER % NB == 0, "whole batches of W's loads");
#pragma unroll 1
    for (int j0 = 0; j0 < PER; j0 += BATCH) {
        float v[BATCH];
#pragma unroll
        for (int j = 0; j < BATCH; ++j) {
            const int e = threadIdx.x + (j0 + j) * WB_RP_THREADS, L = e % 32, blk = e / 32;
            const int n = 8 * (blk % (WB_N / 8)) + L / 4, k = 4 * (blk / (WB_N / 8)) + L % 4;
            v[j] = k < KA ? __ldg(w + (size_t)k * WB_N + n) : 0.f;
        }
#pragma unroll
        for (int j = 0; j < BATCH; ++j) {
            const int e = threadIdx.x + (j0 + j) * WB_RP_THREADS, L = e % 32, blk = e / 32;
            const int n = 8 * (blk % (WB_N / 8)) + L / 4, k = 4 * (blk / (WB_N / 8)) + L % 4;
            unsigned big, small;
            split(v[j], big, small);
            wb[core_offset(n, k, WB_N)] = __uint_as_float(big);
            ws[core_offset(n, k, WB_N)] = __uint_as_float(small);
        }
    }
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // seen by wgmma's reads
    __syncthreads();
    if constexpr (MASK)
        if (tile < tiles) wb_mask_bits(hv, bits, g, t);
    const int m = 16 * warp + g;  // the thread's first fragment row in the tile
    for (; tile < tiles; tile += stride) {
        wait_copies<0>();
        wg_barrier(wg);
        // the whole tile's fragments (masked) into registers, then the buffer takes the next
        // tile's copies during all of this tile's products and stores
        float raw[KP / 8][4];
#pragma unroll
        for (int s = 0; s < KP / 8; ++s) {
            const int k = 8 * s + t, q = 2 * s;  // k's sign bit q, k + 4's q + 1
            const auto on = [&](int h, int b) { return !MASK || (bits[h] >> (q + b) & 1u); };
            raw[s][0] = wb_at<KA>(buf, m, k, on(0, 0));
            raw[s][1] = wb_at<KA>(buf, m + 8, k, on(1, 0));
            raw[s][2] = wb_at<KA>(buf, m, k + 4, on(0, 1));
            raw[s][3] = wb_at<KA>(buf, m + 8, k + 4, on(1, 1));
        }
        wg_barrier(wg);
        const bool next = tile + stride < tiles;
        load(tile + stride);
        if constexpr (MASK)  // the next tile's mask rows arrive during this tile's products
            if (next) wb_mask_load(hv, mask, (tile + stride) * WB_ROWS + 16 * warp, M, lane);
        float d[64];
#pragma unroll
        for (int i = 0; i < 64; ++i) d[i] = 0.f;
#pragma unroll
        for (int s0 = 0; s0 < KP / 8; s0 += CS) {
            unsigned big[CS][4], small[CS][4];
#pragma unroll
            for (int s = 0; s < CS && s0 + s < KP / 8; ++s)  // the last chunk may be short
#pragma unroll
                for (int i = 0; i < 4; ++i) split(raw[s0 + s][i], big[s][i], small[s][i]);
            asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
            for (int s = 0; s < CS && s0 + s < KP / 8; ++s) {
                const int kb = 2 * (s0 + s) * (WB_N / 8) * 32;
                wgmma_3xtf32(d, big[s], small[s], wb + kb, ws + kb, WB_N);
            }
            asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
            // the chunk before is done (its A registers free): this one's products overlap the
            // next chunk's splits
            asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
        }
        asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
        const int r0 = tile * WB_ROWS + m;
#pragma unroll
        for (int j = 0; j < WB_N / 8; ++j)
#pragma unroll
            for (int h = 0; h < 2; ++h)
                if (r0 + 8 * h < M)
                    *reinterpret_cast<float2*>(y + (size_t)(r0 + 8 * h) * WB_N + 8 * j + 2 * t) =
                        make_float2(d[4 * j + 2 * h], d[4 * j + 2 * h + 1]);
        if constexpr (MASK)
            if (next) wb_mask_bits(hv, bits, g, t);
    }
}

// scratch row blockIdx.x = [A^T X | sum_b A] over batch rows [begin, end) of this block, A
// [B, MA] (masked by `mask` [B, MA] under MASK), X [B, WB_N]. Step i's X halves go to buffer
// i % 2, so its copies and transposed split overlap step i - 1's products.
template <int MA, bool MASK>
__device__ __forceinline__ void wb_weight_grad(const float* __restrict__ a,
                                               const float* __restrict__ mask,
                                               const float* __restrict__ x,
                                               float* __restrict__ scratch, const int B,
                                               const int rows_per_block) {
    constexpr int LDA = MA % 4 ? MA : WB_LDT;
    constexpr int ATILE = BK * LDA;
    constexpr int STEP = (MASK ? 2 : 1) * ATILE + BK * WB_LDT;  // a step's raw tiles: A, X, mask
    constexpr int XH = WB_N * BK;              // an X half [WB_N x BK], core layout
    float* xbuf = reinterpret_cast<float*>(dynamic_smem);  // 2 x (X big, X small)
    float* raw = xbuf + 4 * XH;                             // STAGES steps' raw tiles
    const int wg = threadIdx.x / 128, warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
    const int g = lane / 4, t = lane % 4;
    const int begin = blockIdx.x * rows_per_block, end = min(B, begin + rows_per_block);
    // step i's tiles into ring slot i % STAGES, one commit group a step (empty past the slice),
    // so that "the group of step i is complete" is always wait_group STAGES - 2
    auto load = [&](int i) {
        const int b0 = begin + i * BK;
        if (b0 < end) {
            float* at = raw + (i % STAGES) * STEP;
            wb_copy_rows<BK, MA, LDA, WB_GRAD_THREADS>(at, a, b0, end, threadIdx.x);
            wb_copy_rows<BK, WB_N, WB_LDT, WB_GRAD_THREADS>(at + ATILE, x, b0, end, threadIdx.x);
            if constexpr (MASK)
                wb_copy_rows<BK, MA, LDA, WB_GRAD_THREADS>(at + ATILE + BK * WB_LDT, mask, b0, end,
                                                           threadIdx.x);
        }
        commit_copies();
    };
    const int m = 64 * wg + 16 * warp + g;  // the thread's output rows m and m + 8
    float d[64], bias[2] = {0.f, 0.f};
#pragma unroll
    for (int i = 0; i < 64; ++i) d[i] = 0.f;
#pragma unroll
    for (int i = 0; i < STAGES - 1; ++i) load(i);
    for (int b0 = begin, i = 0; b0 < end; b0 += BK, ++i) {
        const float* ra = raw + (i % STAGES) * STEP;
        const float* rx = ra + ATILE;
        const float* rh = rx + BK * WB_LDT;  // the mask tile (under MASK)
        float* xb = xbuf + (i & 1) * 2 * XH;
        float* xs = xb + XH;
        wait_copies<STAGES - 2>();
        __syncthreads();  // step i's tiles are in; step i - 1 has read its slot
        load(i + STAGES - 1);  // into step i - 1's slot
        // X transposed and split: element e = threadIdx.x + 256 j is (n = 8 (e / 32 % 16) + L / 4,
        // k = 4 (e / 512) + L % 4), at core offset e: consecutive stores, reads on 32 banks
#pragma unroll
        for (int j = 0; j < XH / WB_GRAD_THREADS; ++j) {
            const int e = threadIdx.x + j * WB_GRAD_THREADS, blk = e / 32, L = e % 32;
            const int n = 8 * (blk % (WB_N / 8)) + L / 4, k = 4 * (blk / (WB_N / 8)) + L % 4;
            unsigned big, small;
            split(rx[k * WB_LDT + n], big, small);
            xb[e] = __uint_as_float(big);
            xs[e] = __uint_as_float(small);
        }
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        // step i - 1's products are done: A's registers are free, and after the barrier every
        // warpgroup's, so step i + 1 may write their buffer
        asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
        __syncthreads();
        unsigned big[BK / 8][4], small[BK / 8][4];
#pragma unroll
        for (int s = 0; s < BK / 8; ++s)
#pragma unroll
            for (int i = 0; i < 4; ++i) {  // a_i = A^T (m + 8 (i & 1), k = 8s + t + 4 (i >> 1))
                const int r = 8 * s + t + 4 * (i >> 1), c = m + 8 * (i & 1);
                float v = c < MA ? ra[r * LDA + c] : 0.f;
                if constexpr (MASK) v = rh[r * LDA + c] > 0.f ? v : 0.f;
                bias[i & 1] += v;
                split(v, big[s][i], small[s][i]);
            }
        asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
        for (int s = 0; s < BK / 8; ++s) {
            const int kb = 2 * s * (WB_N / 8) * 32;
            wgmma_3xtf32(d, big[s], small[s], xb + kb, xs + kb, WB_N);
        }
        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    }
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    float* out = scratch + (size_t)blockIdx.x * (MA * WB_N + MA);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int r = m + 8 * h;
        float b = bias[h];  // the quad's four k columns: the same sum on every lane
        b += __shfl_xor_sync(0xffffffffu, b, 1);
        b += __shfl_xor_sync(0xffffffffu, b, 2);
        if (r < MA) {
#pragma unroll
            for (int j = 0; j < WB_N / 8; ++j) {  // scalar stores: MA * WB_N + MA may be odd
                out[r * WB_N + 8 * j + 2 * t] = d[4 * j + 2 * h];
                out[r * WB_N + 8 * j + 2 * t + 1] = d[4 * j + 2 * h + 1];
            }
            if (t == 0) out[MA * WB_N + r] = b;
        }
    }
}

extern "C" __global__ void __launch_bounds__(WB_RP_THREADS, 1)
frdhead_wg_dhidden(const float* __restrict__ grad_logits, const float* __restrict__ w2,
                   float* __restrict__ dhidden, const int B)
{
    wb_row_product<HA, false>(grad_logits, nullptr, w2, dhidden, B);
}

extern "C" __global__ void __launch_bounds__(WB_RP_THREADS, 1)
frdhead_wg_grad_h_t(const float* __restrict__ dhidden, const float* __restrict__ hidden,
                    const float* __restrict__ w1, float* __restrict__ grad_h_t, const int B)
{
    wb_row_product<FRD_HIDDEN, true>(dhidden, hidden, w1, grad_h_t, B);
}

extern "C" __global__ void __launch_bounds__(WB_GRAD_THREADS, OCC)
frdhead_wg_grad_w2(const float* __restrict__ grad_logits, const float* __restrict__ hidden,
                   float* __restrict__ scratch, const int B, const int rows_per_block)
{
    wb_weight_grad<HA, false>(grad_logits, nullptr, hidden, scratch, B, rows_per_block);
}

extern "C" __global__ void __launch_bounds__(WB_GRAD_THREADS, OCC)
frdhead_wg_grad_w1(const float* __restrict__ dhidden, const float* __restrict__ hidden,
                   const float* __restrict__ h_t, float* __restrict__ scratch, const int B,
                   const int rows_per_block)
{
    wb_weight_grad<FRD_HIDDEN, true>(dhidden, hidden, h_t, scratch, B, rows_per_block);
}
