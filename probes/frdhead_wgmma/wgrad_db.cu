// Issue 32 probe: frdhead_wgmma_bwd.cuh's weight gradient (wb_weight_grad, unmasked) with A's
// pieces in two register sets, so that a step waits only for the step two back
// (wgmma.wait_group 1) and step i's X transposition and A fragments are made while step i - 1's
// products run; the library's waits for step i - 1 (wait_group 0) before reading step i's A.
// One barrier a step where the library has two. Same sums in the same order: the scratch rows
// must equal the library's bit for bit. wgrad_db.py appends it to the library's frdhead module
// at the backward's WGMMA 2 knobs. Step i: wait for step i's tiles and for this warpgroup's step
// i - 2; a barrier (every warpgroup past step i - 2: X buffer i % 2 and A set i % 2 are free,
// and every thread past step i - 1's reads of its ring slot); the next copies into that slot;
// X's transposed split into buffer i % 2; A's fragments into set i % 2; a barrier (X written);
// the products.
#include <type_traits>

template <int MA>
__device__ __forceinline__ void wgrad_db(const float* __restrict__ a, const float* __restrict__ x,
                                         float* __restrict__ scratch, const int B,
                                         const int rows_per_block) {
    constexpr int LDA = MA % 4 ? MA : WB_LDT;
    constexpr int ATILE = BK * LDA;
    constexpr int STEP = ATILE + BK * WB_LDT;  // a step's raw tiles: A, X
    constexpr int XH = WB_N * BK;              // an X half [WB_N x BK], core layout
    float* xbuf = reinterpret_cast<float*>(dynamic_smem);  // 2 x (X big, X small)
    float* raw = xbuf + 4 * XH;                             // STAGES steps' raw tiles
    const int wg = threadIdx.x / 128, warp = (threadIdx.x / 32) % 4, lane = threadIdx.x % 32;
    const int g = lane / 4, t = lane % 4;
    const int begin = blockIdx.x * rows_per_block, end = min(B, begin + rows_per_block);
    auto load = [&](int i) {
        const int b0 = begin + i * BK;
        if (b0 < end) {
            float* at = raw + (i % STAGES) * STEP;
            wb_copy_rows<BK, MA, LDA, WB_GRAD_THREADS>(at, a, b0, end, threadIdx.x);
            wb_copy_rows<BK, WB_N, WB_LDT, WB_GRAD_THREADS>(at + ATILE, x, b0, end, threadIdx.x);
        }
        commit_copies();
    };
    const int m = 64 * wg + 16 * warp + g;
    float d[64], bias[2] = {0.f, 0.f};
#pragma unroll
    for (int i = 0; i < 64; ++i) d[i] = 0.f;
    unsigned big[2][BK / 8][4], small[2][BK / 8][4];
#pragma unroll
    for (int i = 0; i < STAGES - 1; ++i) load(i);
    auto step = [&](int i, auto set_c) {
        constexpr int SET = decltype(set_c)::value;
        const float* ra = raw + (i % STAGES) * STEP;
        const float* rx = ra + ATILE;
        float* xb = xbuf + SET * 2 * XH;
        float* xs = xb + XH;
        wait_copies<STAGES - 2>();
        asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
        __syncthreads();
        load(i + STAGES - 1);
#pragma unroll
        for (int j = 0; j < XH / WB_GRAD_THREADS; ++j) {
            const int e = threadIdx.x + j * WB_GRAD_THREADS, blk = e / 32, L = e % 32;
            const int n = 8 * (blk % (WB_N / 8)) + L / 4, k = 4 * (blk / (WB_N / 8)) + L % 4;
            unsigned bg, sm;
            split(rx[k * WB_LDT + n], bg, sm);
            xb[e] = __uint_as_float(bg);
            xs[e] = __uint_as_float(sm);
        }
#pragma unroll
        for (int s = 0; s < BK / 8; ++s)
#pragma unroll
            for (int q = 0; q < 4; ++q) {
                const int r = 8 * s + t + 4 * (q >> 1), c = m + 8 * (q & 1);
                const float v = c < MA ? ra[r * LDA + c] : 0.f;
                bias[q & 1] += v;
                split(v, big[SET][s][q], small[SET][s][q]);
            }
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        __syncthreads();
        asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
        for (int s = 0; s < BK / 8; ++s) {
            const int kb = 2 * s * (WB_N / 8) * 32;
            wgmma_3xtf32(d, big[SET][s], small[SET][s], xb + kb, xs + kb, WB_N);
        }
        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    };
    for (int i = 0; begin + i * BK < end; i += 2) {
        step(i, std::integral_constant<int, 0>());
        if (begin + (i + 1) * BK >= end) break;
        step(i + 1, std::integral_constant<int, 1>());
    }
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    float* out = scratch + (size_t)blockIdx.x * (MA * WB_N + MA);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int r = m + 8 * h;
        float b = bias[h];
        b += __shfl_xor_sync(0xffffffffu, b, 1);
        b += __shfl_xor_sync(0xffffffffu, b, 2);
        if (r < MA) {
#pragma unroll
            for (int j = 0; j < WB_N / 8; ++j) {
                out[r * WB_N + 8 * j + 2 * t] = d[4 * j + 2 * h];
                out[r * WB_N + 8 * j + 2 * t + 1] = d[4 * j + 2 * h + 1];
            }
            if (t == 0) out[MA * WB_N + r] = b;
        }
    }
}

extern "C" __global__ void __launch_bounds__(WB_GRAD_THREADS, OCC)
wgrad_db_w2(const float* __restrict__ grad_logits, const float* __restrict__ hidden,
            float* __restrict__ scratch, const int B, const int rows_per_block)
{
    wgrad_db<HA>(grad_logits, hidden, scratch, B, rows_per_block);
}

extern "C" __global__ void __launch_bounds__(WB_GRAD_THREADS, OCC)
wgrad_db_w1(const float* __restrict__ dpre, const float* __restrict__ h_t,
            float* __restrict__ scratch, const int B, const int rows_per_block)
{
    wgrad_db<FRD_HIDDEN>(dpre, h_t, scratch, B, rows_per_block);
}
