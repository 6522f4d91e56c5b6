// Issue 32 probe: the backward's weight gradient g [MA, 128] = A^T X (summed over a block's
// slice of the batch, the product's K) on FP16 pieces, where the library's (wb_weight_grad)
// splits into TF32 halves. wgrad_db showed that a step of the library's kernel waits on shared
// memory (X's transposed split, A's scalar fragment loads), not on the MMA. Here:
// - a step's A tile is cut into FP16 pieces in place, rows b (a row 136 halves: ldmatrix's 8
//   rows on distinct banks), and its fragments come by ldmatrix.x4.trans (a wgmma register-A
//   fragment is, a warp at a time, mma.m16n8k16's A);
// - X's pieces are staged as stage_f16 stages a weight (rows b, K-major core matrices) and read
//   transposed by wgmma (wgmma_f16_t), so there is no transposition pass;
// - three products a k16 step (small.big, big.small, big.big), 12 KB of shared reads a
//   warpgroup where the TF32 kernel's take 24.
// K is the batch, so an operand's scale cannot be a row's: each column of A and of X gets one
// power of two over the block's whole slice, from a first pass over it (its maxima reduced over
// the warps in a fixed order). That pass reads the slice twice; a library version would take
// the maxima from the kernels that write A (see NOTES). The bias sums are the unscaled float32
// values, each thread's two columns over its rows, then the four threads of a column pair in
// order. Sums in a fixed order: bitwise reruns. wgrad_f16.py appends this to the library's
// frdhead module at the backward's WGMMA 2 knobs (BK, STAGES; OCC 1).
#define WH_LDA 136  // halves: a row of A's pieces

__device__ __forceinline__ void ldsm_x4_t(unsigned (&r)[4], const __half* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_address(p)));
}

// wgmma_f16_t with D's scale a predicate: false overwrites D (the slice's first product)
__device__ __forceinline__ void wgmma_f16_tp(float (&d)[64], const unsigned (&a)[4],
                                             unsigned long long db, bool accumulate) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {" WG_REGS_56
                 ", %56, %57, %58, %59, %60, %61, %62, %63}, "
                 "{%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
                 : WG_ACC_56, "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]),
                   "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"((int)accumulate));
}

// Where the column scales come from (SCALES):
//   WS_FIRST    a first pass over the block's slice, both operands
//   WS_GIVEN    colmax ([128] of A's maxima, then [128] of X's), as a producer of both would
//               leave them; WS_GIVEN_A: A's given, X's from the first pass (the rows launch
//               writes dpre; h_t has no producer)
//   WS_RUNNING  no pass: each step's tiles' maxima (a thread a column, from the raw tiles) grow
//               a running scale a column; when one shrinks, the accumulator is rescaled by the
//               ratios (powers of two, exact) between the previous step's MMA and this one's
#define WS_FIRST 0
#define WS_GIVEN 1
#define WS_GIVEN_A 2
#define WS_RUNNING 3
template <int MA, int SCALES>
__device__ __forceinline__ void wgrad_f16(const float* __restrict__ a, const float* __restrict__ x,
                                          float* __restrict__ scratch, const int B,
                                          const int rows_per_block,
                                          const float* __restrict__ colmax) {
    constexpr int LDA = MA % 4 ? MA : WB_LDT;   // the raw A tile's row stride (floats)
    constexpr int ATILE = BK * LDA;
    constexpr int STEP = ATILE + BK * WB_LDT;   // a step's raw tiles: A, X
    constexpr int XH = BK * WB_N;               // one X piece (halves)
    constexpr int AH = BK * WH_LDA;             // one A piece (halves)
    static_assert(BK % 16 == 0 && (8 / (BK / 8)) * (BK / 8) == 8, "whole k16 steps, 8 warps");
    __half* xbuf = reinterpret_cast<__half*>(dynamic_smem);  // 2 steps x (X big, X small)
    __half* abig = xbuf + 4 * XH;                             // A big, A small
    __half* asmall = abig + AH;
    float* s_a = reinterpret_cast<float*>(asmall + AH);       // A's column scales [128]
    float* s_x = s_a + WB_N;                                  // X's [128]
    float* ratio = s_x + WB_N;                                // WS_RUNNING: [A's 128, X's 128]
    float* red = ratio + 2 * WB_N;                            // 8 warps x 256 maxima
    float* raw = red + 8 * 2 * WB_N;                          // STAGES steps' raw tiles
    const int tid = threadIdx.x, wg = tid / 128, warp = (tid / 32) % 4, lane = tid % 32;
    const int g = lane / 4, t = lane % 4;
    const int begin = blockIdx.x * rows_per_block, end = min(B, begin + rows_per_block);
    auto load = [&](int i) {
        const int b0 = begin + i * BK;
        if (b0 < end) {
            float* at = raw + (i % STAGES) * STEP;
            wb_copy_rows<BK, MA, LDA, WB_GRAD_THREADS>(at, a, b0, end, tid);
            wb_copy_rows<BK, WB_N, WB_LDT, WB_GRAD_THREADS>(at + ATILE, x, b0, end, tid);
        }
        commit_copies();
    };
#pragma unroll
    for (int i = 0; i < STAGES - 1; ++i) load(i);  // in flight during the first pass
    {   // each column's largest magnitude over the slice: given, or from a first pass over it
        // (a lane 4 columns, the warps' maxima reduced in a fixed order)
        constexpr bool GIVEN_A = SCALES == WS_GIVEN || SCALES == WS_GIVEN_A;
        constexpr bool GIVEN_X = SCALES == WS_GIVEN;
        float ma[4] = {0.f, 0.f, 0.f, 0.f}, mx[4] = {0.f, 0.f, 0.f, 0.f};
        if (SCALES == WS_FIRST || SCALES == WS_GIVEN_A) {
            // last row first: the slice's first steps are what L2 holds when the steps begin
#pragma unroll 4
            for (int r = end - 1 - tid / 32; r >= begin; r -= 8)
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    const int c = lane + 32 * j;
                    if (!GIVEN_A && c < MA) ma[j] = fmaxf(ma[j], fabsf(__ldg(a + (size_t)r * MA + c)));
                    if (!GIVEN_X) mx[j] = fmaxf(mx[j], fabsf(__ldg(x + (size_t)r * WB_N + c)));
                }
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                red[(tid / 32) * 2 * WB_N + lane + 32 * j] = ma[j];
                red[(tid / 32) * 2 * WB_N + WB_N + lane + 32 * j] = mx[j];
            }
            __syncthreads();
        }
        float m = 0.f;
        if (tid < WB_N ? GIVEN_A : GIVEN_X) {
            m = colmax[tid];
        } else if (SCALES != WS_RUNNING) {
#pragma unroll
            for (int w = 0; w < 8; ++w) m = fmaxf(m, red[w * 2 * WB_N + tid]);
        }
        // WS_RUNNING: 2^127, above any scale pow2_scale gives, until a column's first nonzero
        (tid < WB_N ? s_a : s_x)[tid % WB_N] =
            SCALES == WS_RUNNING ? __int_as_float(254 << 23) : pow2_scale(m);
        __syncthreads();
    }
    // the A split: a thread's column pair pm = tid % 64 over rows tid / 64 + 4i
    const int pm = 2 * (tid % 64);
    float bias[2] = {0.f, 0.f};
    // the X split: warp w stages row group w % (BK / 8), its share of the 16 column groups
    constexpr int WPG = 8 / (BK / 8), CPW = 16 / WPG;
    const int xgrp = (tid / 32) % (BK / 8), xc0 = ((tid / 32) / (BK / 8)) * CPW;
    const int m0 = 64 * wg + 16 * warp;  // the warp's 16 output rows
    // no zeroing: the slice's first product overwrites D (zeroed here, the accumulators were
    // defined by other instructions inside the wgmma pipeline and ptxas serialized it, C7515);
    // every block has at least one step (_wg_batch_split)
    float d[64];
    for (int b0 = begin, i = 0; b0 < end; b0 += BK, ++i) {
        const float* ra = raw + (i % STAGES) * STEP;
        const float* rx = ra + ATILE;
        __half* xb = xbuf + (i & 1) * 2 * XH;
        __half* xs = xb + XH;
        wait_copies<STAGES - 2>();
        __syncthreads();  // step i's tiles are in; step i - 1 is done with its slot and A's
        load(i + STAGES - 1);
        bool rescale = false;
        if (SCALES == WS_RUNNING) {  // thread c: X's column c; 128 + c: A's column c
            const int c = tid % WB_N;
            const float* col = tid < WB_N ? rx + c : ra + c;
            const int ld = tid < WB_N ? WB_LDT : LDA;
            float m = 0.f;
            if (tid < WB_N || c < MA)
#pragma unroll 8
                for (int r = 0; r < BK; ++r) m = fmaxf(m, fabsf(col[r * ld]));
            float* sc = tid < WB_N ? s_x + c : s_a + c;
            const float before = *sc, now = m > 0.f ? fminf(before, pow2_scale(m)) : before;
            ratio[(tid < WB_N ? WB_N : 0) + c] = now / before;
            *sc = now;  // every read of the old scale was in step i - 1's split
            rescale = __syncthreads_or(now != before) && i > 0;
        }
        const float sa0 = s_a[pm], sa1 = s_a[pm + 1];
#pragma unroll
        for (int r = tid / 64; r < BK; r += 4) {
            const float v0 = pm < MA ? ra[r * LDA + pm] : 0.f;
            const float v1 = pm + 1 < MA ? ra[r * LDA + pm + 1] : 0.f;
            bias[0] += v0;
            bias[1] += v1;
            unsigned bg, sm;
            split_pair(v0 * sa0, v1 * sa1, bg, sm);
            *reinterpret_cast<unsigned*>(abig + r * WH_LDA + pm) = bg;
            *reinterpret_cast<unsigned*>(asmall + r * WH_LDA + pm) = sm;
        }
#pragma unroll
        for (int c = xc0; c < xc0 + CPW; ++c) {
            const int r = 8 * xgrp + lane / 4, n = 8 * c + 2 * t;
            const float2 v = *reinterpret_cast<const float2*>(rx + r * WB_LDT + n);
            unsigned bg, sm;
            split_pair(v.x * s_x[n], v.y * s_x[n + 1], bg, sm);
            const int at = core_offset_h(r, n, BK);
            *reinterpret_cast<unsigned*>(xb + at) = bg;
            *reinterpret_cast<unsigned*>(xs + at) = sm;
        }
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // X: wgmma's reads
        asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");  // step i - 1's
        if (SCALES == WS_RUNNING && rescale)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const float ra_h = ratio[m0 + g + 8 * h];
#pragma unroll
                for (int j = 0; j < WB_N / 8; ++j) {
                    const int n = 8 * j + 2 * t;
                    d[4 * j + 2 * h] *= ra_h * ratio[WB_N + n];
                    d[4 * j + 2 * h + 1] *= ra_h * ratio[WB_N + n + 1];
                }
            }
        __syncthreads();
        unsigned fb[BK / 16][4], fs[BK / 16][4];
#pragma unroll
        for (int s = 0; s < BK / 16; ++s) {
            // lane L addresses matrix L / 8's row L % 8: rows b = 16s + 8 (q >> 1) + L % 8,
            // columns m0 + 8 (q & 1)
            const int q = lane / 8;
            const int off = (16 * s + 8 * (q >> 1) + lane % 8) * WH_LDA + m0 + 8 * (q & 1);
            ldsm_x4_t(fb[s], abig + off);
            ldsm_x4_t(fs[s], asmall + off);
        }
        asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
        for (int s = 0; s < BK / 16; ++s) {
            const int kb = 2 * s * 64;  // halves to this k16 step's first core matrix
            wgmma_f16_tp(d, fs[s], wg_desc(reinterpret_cast<const float*>(xb + kb), 128, BK * 16),
                         i > 0 || s > 0);
            wgmma_f16_t(d, fb[s], wg_desc(reinterpret_cast<const float*>(xs + kb), 128, BK * 16));
            wgmma_f16_t(d, fb[s], wg_desc(reinterpret_cast<const float*>(xb + kb), 128, BK * 16));
        }
        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    }
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    __syncthreads();  // every thread past its last A split: red takes the bias partials
    red[(tid / 64) * WB_N + pm] = bias[0];
    red[(tid / 64) * WB_N + pm + 1] = bias[1];
    __syncthreads();
    float* out = scratch + (size_t)blockIdx.x * (MA * WB_N + MA);
    if (tid < MA) out[MA * WB_N + tid] = ((red[tid] + red[WB_N + tid]) + red[2 * WB_N + tid])
                                         + red[3 * WB_N + tid];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int r = m0 + g + 8 * h;
        if (r < MA) {
            const float inv_a = 1.f / s_a[r];
#pragma unroll
            for (int j = 0; j < WB_N / 8; ++j) {
                const int n = 8 * j + 2 * t;
                out[r * WB_N + n] = d[4 * j + 2 * h] * (inv_a / s_x[n]);
                out[r * WB_N + n + 1] = d[4 * j + 2 * h + 1] * (inv_a / s_x[n + 1]);
            }
        }
    }
}

#define WGRAD_F16_ENTRY(NAME, MA, SCALES, A, X)                                             \
    extern "C" __global__ void __launch_bounds__(WB_GRAD_THREADS, 1)                         \
    NAME(const float* __restrict__ A, const float* __restrict__ X, float* __restrict__ scratch, \
         const int B, const int rows_per_block, const float* __restrict__ colmax) {          \
        wgrad_f16<MA, SCALES>(A, X, scratch, B, rows_per_block, colmax);                     \
    }
WGRAD_F16_ENTRY(wgrad_f16_w2, HA, WS_FIRST, grad_logits, hidden)
WGRAD_F16_ENTRY(wgrad_f16_w1, FRD_HIDDEN, WS_FIRST, dpre, h_t)
WGRAD_F16_ENTRY(wgrad_f16_w2_given, HA, WS_GIVEN, grad_logits, hidden)
WGRAD_F16_ENTRY(wgrad_f16_w1_given, FRD_HIDDEN, WS_GIVEN, dpre, h_t)
WGRAD_F16_ENTRY(wgrad_f16_w1_given_a, FRD_HIDDEN, WS_GIVEN_A, dpre, h_t)
WGRAD_F16_ENTRY(wgrad_f16_w2_running, HA, WS_RUNNING, grad_logits, hidden)
WGRAD_F16_ENTRY(wgrad_f16_w1_running, FRD_HIDDEN, WS_RUNNING, dpre, h_t)
