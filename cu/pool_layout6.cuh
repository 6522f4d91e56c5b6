// LAYOUT 6 (N_HORIZONS 32, HIDDEN_DIM 128, K <= 64; Hopper's warpgroup MMA, built for sm_90a):
// a warpgroup a row, BLOCK / 128 warpgroups a block and a block an SM, grid-strided over the
// rows. The products are 3xTF32 wgmma (wgmma.cuh: A from registers, B's split halves in
// shared memory), a row's keys the m64 of the key-major ones:
//   forward   S [key x h] = LN . Q^T           m64n32, q's halves staged once a block
//             softmax over the keys            from the accumulators: a quad's shuffles, then
//                                              the 4 warps' partial max and sum in warp order
//             ctx^T [d x h] = LN^T . P^T       two m64n32 tiles of D, P's halves staged by the
//                                              softmax
//   backward  DW [key x h] = LN . G^T          G's halves staged a row
//             DS = scale A (DW + GA - c), c = sum_k A (DW + GA), in the accumulators
//             GQ^T [d x h] += LN^T . DS^T      over the warpgroup's rows; the block's
//                                              warpgroups added in order into gq_scratch[block]
//             grad_ln [key x d] = A^T G + DS^T Q   m64n128 over the horizons: A and DS straight
//                                              from their registers, G's and q's halves by d
// A lane's accumulators are keys 16 warp + g (+ 8) and horizons 8 j + 2 t (+ 1) (g = lane / 4,
// t = lane % 4). The forward keeps the next row's copies in flight in a second buffer; the
// backward's one buffer takes them once GQ has read the row, so they overlap grad_ln.
static_assert(N_HORIZONS == 32 && HIDDEN_DIM == 128 && (BLOCK == 128 || BLOCK == 256)
                  && SPLIT_COUNT == 1, "LAYOUT 6: shape");
#define L6_WG (BLOCK / 128)  // warpgroups a block
#define L6_FCS 8             // the forward's k-steps a chunk of A fragments
#define L6_BCS 4             // the backward's

// d (m64n32) += A (registers) . B (descriptor db)^T
__device__ __forceinline__ void l6_wgmma(float (&d)[16], const unsigned (&a)[4],
                                         unsigned long long db)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n32k8.f32.tf32.tf32 "
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
                 "{%16, %17, %18, %19}, %20, p, 1, 1;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),
                   "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
                   "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}

// d += A . B^T over one k-step in 3xTF32, B's halves of N_HORIZONS rows at this k-step's core
// matrices
__device__ __forceinline__ void l6_step(float (&d)[16], const unsigned (&big)[4],
                                        const unsigned (&small)[4], const float* wb,
                                        const float* ws)
{
    l6_wgmma(d, small, wg_desc(wb, N_HORIZONS * 16, 128));
    l6_wgmma(d, big, wg_desc(ws, N_HORIZONS * 16, 128));
    l6_wgmma(d, big, wg_desc(wb, N_HORIZONS * 16, 128));
}

__device__ __forceinline__ void l6_fence_operands()
{
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void l6_commit_wait()
{
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
}
// generic-proxy stores to shared memory, then read by wgmma (the async proxy)
__device__ __forceinline__ void l6_fence_proxy()
{
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// row b of ln into buf [L6_KP][L6_LDW] (keys past K zeros) by the warpgroup, one commit group
__device__ __forceinline__ void l6_load_row(float* buf, const float* __restrict__ ln, const int b,
                                            const int K, const int tid)
{
    const float* src = ln + (size_t)b * K * HIDDEN_DIM;
    for (int e = tid; e < L6_KP * HIDDEN_DIM / 4; e += 128) {
        const int r = e / (HIDDEN_DIM / 4), c = 4 * (e % (HIDDEN_DIM / 4));
        copy_async<16>(buf + r * L6_LDW + c, r < K ? src + (size_t)r * HIDDEN_DIM + c : src,
                       r < K);
    }
    copy_commit();
}

// d += CS k-steps from k-step c0 (a chunk): A's halves from registers, B's at wb, ws; waited
// for, so that the registers take the next chunk
template <int CS>
__device__ __forceinline__ void l6_chunk(float (&d)[16], const unsigned (&big)[CS][4],
                                         const unsigned (&small)[CS][4], const float* wb,
                                         const float* ws, const int c0)
{
    l6_fence_operands();
#pragma unroll
    for (int k = 0; k < CS; ++k) {
        const int off = 2 * (c0 + k) * (N_HORIZONS / 8) * 32;
        l6_step(d, big[k], small[k], wb + off, ws + off);
    }
    l6_commit_wait();
}

// A warpgroup's share of x [N_HORIZONS, HIDDEN_DIM]: thread (warp, lane) holds row
// 8 warp + lane / 4, float4 lane % 4 of each 16 columns (v[c]: columns 16 c + 4 (lane % 4) ..),
// so that both stagings below store to 32 banks
__device__ __forceinline__ void l6_load_share(float4 (&v)[8], const float* __restrict__ x,
                                              const int warp, const int lane)
{
    const float4* row = reinterpret_cast<const float4*>(x + (8 * warp + lane / 4) * HIDDEN_DIM);
#pragma unroll
    for (int c = 0; c < 8; ++c) v[c] = row[4 * c + lane % 4];
}

__device__ __forceinline__ float l6_part(const float4& v, const int i)
{
    return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

__device__ __forceinline__ void l6_store_split(float* wb, float* ws, const int at, const float x)
{
    unsigned big, small;
    tf32_split(x, big, small);
    wb[at] = __uint_as_float(big);
    ws[at] = __uint_as_float(small);
}

// The share into halves [N_HORIZONS rows x HIDDEN_DIM] for l6_keys_by_horizons: physical
// columns 16 c + 4 j + i are logical (k-step 2 c + i / 2, k j + 4 (i % 2)), the order that
// reads A's float4s in. A warp's stores: rows n % 8 = lane / 4, k % 4 = lane % 4.
__device__ __forceinline__ void l6_stage_by_d(float* wb, float* ws, const float4 (&v)[8],
                                              const int warp, const int lane)
{
    const int h = 8 * warp + lane / 4, j = lane % 4;
#pragma unroll
    for (int c = 0; c < 8; ++c)
#pragma unroll
        for (int i = 0; i < 4; ++i)
            l6_store_split(wb, ws,
                           core_offset(h, 8 * (2 * c + i / 2) + j + 4 * (i % 2), N_HORIZONS),
                           l6_part(v[c], i));
}

// k of horizon h in grad_ln's products: a lane's accumulators hold horizons 8 j + 2 t and
// 8 j + 2 t + 1, which k-step j's A fragment takes as its k = t and t + 4
__device__ __forceinline__ int l6_hk(const int h)
{
    return 8 * (h / 8) + (h % 8) / 2 + 4 * (h % 2);
}

// The share into halves [HIDDEN_DIM rows x N_HORIZONS] (k = l6_hk(h)) for l6_keys_by_columns.
// Lane (a = lane % 4, b = lane / 4) stores column 16 c + 4 a + jj, jj rotated by
// 2 (a / 2) + b % 2: a warp's (d % 8, k % 4) = (4 (a % 2) + jj, b / 2) hit 32 banks.
__device__ __forceinline__ void l6_stage_by_h(float* wb, float* ws, const float4 (&v)[8],
                                              const int warp, const int lane)
{
    const int a = lane % 4, b = lane / 4, k = l6_hk(8 * warp + b), rot = 2 * (a / 2) + b % 2;
#pragma unroll
    for (int c = 0; c < 8; ++c)
#pragma unroll
        for (int s = 0; s < 4; ++s) {
            const int jj = (s + rot) % 4;
            l6_store_split(wb, ws, core_offset(16 * c + 4 * a + jj, k, HIDDEN_DIM),
                           l6_part(v[c], jj));
        }
}

// s [key x h] = LN . X^T over HIDDEN_DIM, the warp's keys; X's halves by l6_stage_by_d
template <int CS>
__device__ __forceinline__ void l6_keys_by_horizons(float (&s)[16], const float* buf,
                                                    const float* xb, const float* xs,
                                                    const int warp, const int g, const int t)
{
#pragma unroll
    for (int e = 0; e < 16; ++e) s[e] = 0.f;
#pragma unroll
    for (int c0 = 0; c0 < HIDDEN_DIM / 8; c0 += CS) {
        unsigned big[CS][4], small[CS][4];
#pragma unroll
        for (int c = 0; c < CS / 2; ++c) {  // a float4 of rows g and g + 8: two k-steps
            const int col = 16 * (c0 / 2 + c) + 4 * t;
            const float4 r0 =
                *reinterpret_cast<const float4*>(buf + (16 * warp + g) * L6_LDW + col);
            const float4 r1 =
                *reinterpret_cast<const float4*>(buf + (16 * warp + g + 8) * L6_LDW + col);
#pragma unroll
            for (int k = 0; k < 2; ++k) {
                tf32_split(l6_part(r0, 2 * k), big[2 * c + k][0], small[2 * c + k][0]);
                tf32_split(l6_part(r1, 2 * k), big[2 * c + k][1], small[2 * c + k][1]);
                tf32_split(l6_part(r0, 2 * k + 1), big[2 * c + k][2], small[2 * c + k][2]);
                tf32_split(l6_part(r1, 2 * k + 1), big[2 * c + k][3], small[2 * c + k][3]);
            }
        }
        l6_chunk<CS>(s, big, small, xb, xs, c0);
    }
}

// a [d x h] += LN^T . Y^T over the row's keys, columns 64 mt + 16 warp + g (+ 8); Y's halves
// [N_HORIZONS x L6_KP] by l6_stage_by_keys
template <int CS>
__device__ __forceinline__ void l6_columns_by_horizons(float (&a)[16], const float* buf,
                                                       const float* yb, const float* ys,
                                                       const int mt, const int warp, const int g,
                                                       const int t)
{
    const int dm = 64 * mt + 16 * warp + g;
#pragma unroll
    for (int c0 = 0; c0 < L6_KP / 8; c0 += CS) {
        unsigned big[CS][4], small[CS][4];
#pragma unroll
        for (int k = 0; k < CS; ++k) {
            const float* r0 = buf + (8 * (c0 + k) + t) * L6_LDW + dm;
            const float* r4 = r0 + 4 * L6_LDW;
            tf32_split(r0[0], big[k][0], small[k][0]);
            tf32_split(r0[8], big[k][1], small[k][1]);
            tf32_split(r4[0], big[k][2], small[k][2]);
            tf32_split(r4[8], big[k][3], small[k][3]);
        }
        l6_chunk<CS>(a, big, small, yb, ys, c0);
    }
}

// v (a lane's accumulators of a key-major product) into halves [N_HORIZONS x L6_KP]
__device__ __forceinline__ void l6_stage_by_keys(float* yb, float* ys, const float (&v)[16],
                                                 const int warp, const int g, const int t)
{
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int r = 0; r < 2; ++r)
#pragma unroll
            for (int e = 0; e < 2; ++e)
                l6_store_split(yb, ys,
                               core_offset(8 * j + 2 * t + e, 16 * warp + g + 8 * r, N_HORIZONS),
                               v[4 * j + 2 * r + e]);
}

// Each horizon's sum (or max) of x over the warp's 16 keys (lanes 4 apart: a quad's column),
// then over the 4 warps in warp order through part [4][N_HORIZONS]; x[2 j + e] is horizon
// 8 j + 2 t + e. part is read after the warpgroup's barrier, so it must not be written again
// before the next one.
template <bool MAX>
__device__ __forceinline__ void l6_over_keys(float (&x)[8], float* part, const int wg,
                                             const int warp, const int lane)
{
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int o = 4; o < 32; o *= 2) {
            const float y = __shfl_xor_sync(0xffffffffu, x[i], o);
            x[i] = MAX ? fmaxf(x[i], y) : x[i] + y;
        }
    if (lane < 4)
#pragma unroll
        for (int i = 0; i < 8; ++i) part[warp * N_HORIZONS + 8 * (i / 2) + 2 * lane + i % 2] = x[i];
    wg_barrier(wg);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const float* p = part + 8 * (i / 2) + 2 * (lane % 4) + i % 2;
        x[i] = MAX ? fmaxf(fmaxf(p[0], p[N_HORIZONS]), fmaxf(p[2 * N_HORIZONS], p[3 * N_HORIZONS]))
                   : ((p[0] + p[N_HORIZONS]) + p[2 * N_HORIZONS]) + p[3 * N_HORIZONS];
    }
}

// A thread's place: its warpgroup, its thread, warp and lane there, the lane's group g and
// thread t, its keys k0 and k0 + 8 in a row's accumulators; in shared memory q's halves qb, qs
// and its warpgroup's region of `floats` behind them; its warpgroup's first row and stride
struct L6Place {
    int wg, tid, warp, lane, g, t, k0;
    float *qb, *qs, *mine;
    int first, stride;
    __device__ __forceinline__ L6Place(float* smem, const int floats)
        : wg(threadIdx.x / 128), tid(threadIdx.x % 128), warp(tid / 32), lane(tid % 32),
          g(lane / 4), t(lane % 4), k0(16 * warp + g), qb(smem),
          qs(smem + N_HORIZONS * HIDDEN_DIM), mine(qs + N_HORIZONS * HIDDEN_DIM + wg * floats),
          first(blockIdx.x * L6_WG + wg), stride(gridDim.x * L6_WG)
    {
    }
};

// The kernels' start: the warpgroup's first row into its region, and q's halves by the first
// warpgroup (by h for grad_ln's product, else by d for the scores'), seen by every
// warpgroup's wgmma
template <bool BY_H>
__device__ __forceinline__ void l6_start(const L6Place& me, const float* __restrict__ q_h,
                                         const float* __restrict__ ln, const int B, const int K)
{
    if (me.first < B) l6_load_row(me.mine, ln, me.first, K, me.tid);
    if (me.wg == 0) {
        float4 v[8];
        l6_load_share(v, q_h, me.warp, me.lane);
        if constexpr (BY_H)
            l6_stage_by_h(me.qb, me.qs, v, me.warp, me.lane);
        else
            l6_stage_by_d(me.qb, me.qs, v, me.warp, me.lane);
    }
    l6_fence_proxy();
    __syncthreads();
}

// Dynamic shared memory (floats, pool_sizes.cuh): q's halves [N_HORIZONS x HIDDEN_DIM], then per
// warpgroup two row buffers [L6_KP][L6_LDW], P's halves [N_HORIZONS x L6_KP], the warps'
// partial max and sum [2][4][N_HORIZONS].
extern "C" __global__ void __launch_bounds__(BLOCK, 1) pool_forward(POOL_FORWARD_PARAMS)
{
    pdl_wait();
    extern __shared__ __align__(128) float smem[];
    const L6Place me(smem, L6_FWG);
    float *bufs = me.mine, *qb = me.qb, *qs = me.qs;
    float *pb = bufs + 2 * L6_KP * L6_LDW, *ps = pb + N_HORIZONS * L6_KP;
    float* part = ps + N_HORIZONS * L6_KP;
    const float to_log2 = scale * LOG2E;
    const int stride = me.stride;
    l6_start<false>(me, q_h, ln, B, K);
    int b = me.first;
    for (int i = 0; b < B; b += stride, ++i) {
        const float* buf = bufs + (i & 1) * L6_KP * L6_LDW;
        if (b + stride < B)
            l6_load_row(bufs + ((i + 1) & 1) * L6_KP * L6_LDW, ln, b + stride, K, me.tid);
        else
            copy_commit();
        asm volatile("cp.async.wait_group 1;\n" ::: "memory");
        wg_barrier(me.wg);

        float s[16];
        l6_keys_by_horizons<L6_FCS>(s, buf, qb, qs, me.warp, me.g, me.t);
        float x[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) {  // horizon 8 (i / 2) + 2 t + i % 2, in log2 units
            float& s0 = s[4 * (i / 2) + i % 2];
            float& s1 = s[4 * (i / 2) + 2 + i % 2];
            s0 = me.k0 < K ? s0 * to_log2 : -INFINITY;
            s1 = me.k0 + 8 < K ? s1 * to_log2 : -INFINITY;
            x[i] = fmaxf(s0, s1);
        }
        l6_over_keys<true>(x, part, me.wg, me.warp, me.lane);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            float& s0 = s[4 * (i / 2) + i % 2];
            float& s1 = s[4 * (i / 2) + 2 + i % 2];
            s0 = exp2f(s0 - x[i]);  // 0 past K
            s1 = exp2f(s1 - x[i]);
            x[i] = s0 + s1;
        }
        l6_over_keys<false>(x, part + 4 * N_HORIZONS, me.wg, me.warp, me.lane);
        float* attnb = attn + ATTN_ROW(b);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const float inv = 1.f / x[i];
            const int h = 8 * (i / 2) + 2 * me.t + i % 2;
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                float& p = s[4 * (i / 2) + 2 * r + i % 2];
                p *= inv;
                if (me.k0 + 8 * r < K) attnb[(size_t)h * ATTN_STRIDE + me.k0 + 8 * r] = p;
            }
        }
        l6_stage_by_keys(pb, ps, s, me.warp, me.g, me.t);
        l6_fence_proxy();
        wg_barrier(me.wg);

        float* ctxb = ctx + (size_t)b * N_HORIZONS * HIDDEN_DIM;
#pragma unroll
        for (int mt = 0; mt < HIDDEN_DIM / 64; ++mt) {
            float a[16];
#pragma unroll
            for (int e = 0; e < 16; ++e) a[e] = 0.f;
            l6_columns_by_horizons<L6_FCS>(a, buf, pb, ps, mt, me.warp, me.g, me.t);
            const int dm = 64 * mt + 16 * me.warp + me.g;
#pragma unroll
            for (int e = 0; e < 16; ++e)
                ctxb[(8 * (e / 4) + 2 * me.t + e % 2) * HIDDEN_DIM + dm + 8 * (e / 2 % 2)] = a[e];
        }
        wg_barrier(me.wg);  // the buffer and P are free for the rows after
    }
}

// acc [key x d] += V^T X over the horizons: V (a lane's accumulators of a key-major product)
// as A, X's halves by l6_stage_by_h
__device__ __forceinline__ void l6_keys_by_columns(float (&acc)[64], const float (&v)[16],
                                                   const float* xb, const float* xs)
{
    unsigned big[4][4], small[4][4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {  // keys g, g + 8 at k t, then at k t + 4
        tf32_split(v[4 * j], big[j][0], small[j][0]);
        tf32_split(v[4 * j + 2], big[j][1], small[j][1]);
        tf32_split(v[4 * j + 1], big[j][2], small[j][2]);
        tf32_split(v[4 * j + 3], big[j][3], small[j][3]);
    }
    l6_fence_operands();
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const int off = 2 * j * (HIDDEN_DIM / 8) * 32;
        wgmma_3xtf32(acc, big[j], small[j], xb + off, xs + off, HIDDEN_DIM);
    }
    l6_commit_wait();
}

// Dynamic shared memory (floats, pool_sizes.cuh): q's halves [HIDDEN_DIM x N_HORIZONS], then
// per warpgroup the row buffer [L6_KP][L6_LDW], G's halves (by d for DW, then by h for
// grad_ln), DS's halves [N_HORIZONS x L6_KP], the warps' partials [4][N_HORIZONS].
extern "C" __global__ void __launch_bounds__(BLOCK, 1) pool_backward(POOL_BACKWARD_PARAMS)
{
    pdl_wait();
    extern __shared__ __align__(128) float smem[];
    const L6Place me(smem, L6_BWG);
    l6_start<true>(me, q_h, ln, B, K);
    float *buf = me.mine, *qtb = me.qb, *qts = me.qs;  // q's halves by h here
    float *gb = buf + L6_KP * L6_LDW, *gsm = gb + N_HORIZONS * HIDDEN_DIM;
    float *db = gsm + N_HORIZONS * HIDDEN_DIM, *dsm = db + N_HORIZONS * L6_KP;
    float* part = dsm + N_HORIZONS * L6_KP;
    const int stride = me.stride;
    float gq[2][16];
#pragma unroll
    for (int e = 0; e < 16; ++e) gq[0][e] = gq[1][e] = 0.f;
    for (int b = me.first; b < B; b += stride) {
        const float* gcb = grad_ctx + (size_t)b * N_HORIZONS * HIDDEN_DIM;
        float4 gv[8];  // the row's G, staged twice
        l6_load_share(gv, gcb, me.warp, me.lane);
        float av[16];  // A where the accumulators are
        const float* attnb = attn + ATTN_ROW(b);
        const float* gab = grad_attn ? grad_attn + ATTN_ROW(b) : nullptr;
        auto at = [&](int e) {
            return (size_t)(8 * (e / 4) + 2 * me.t + e % 2) * ATTN_STRIDE + me.k0
                   + 8 * (e / 2 % 2);
        };
#pragma unroll
        for (int e = 0; e < 16; ++e) av[e] = me.k0 + 8 * (e / 2 % 2) < K ? attnb[at(e)] : 0.f;
        l6_stage_by_d(gb, gsm, gv, me.warp, me.lane);
        asm volatile("cp.async.wait_group 0;\n" ::: "memory");
        l6_fence_proxy();
        wg_barrier(me.wg);

        float dw[16];
        l6_keys_by_horizons<L6_BCS>(dw, buf, gb, gsm, me.warp, me.g, me.t);
        // GA (absent: zeros) is read where it is added, twice: 16 registers held from here to
        // DS would spill grad_ln's
        auto ga = [&](int e) { return gab && me.k0 + 8 * (e / 2 % 2) < K ? gab[at(e)] : 0.f; };
        float x[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const int e0 = 4 * (i / 2) + i % 2;
            x[i] = av[e0] * (dw[e0] + ga(e0)) + av[e0 + 2] * (dw[e0 + 2] + ga(e0 + 2));
        }
        l6_over_keys<false>(x, part, me.wg, me.warp, me.lane);  // also: G's halves are read
#pragma unroll
        for (int e = 0; e < 16; ++e) {  // DS in dw from here on
            const int i = 2 * (e / 4) + e % 2;
            dw[e] = scale * av[e] * (dw[e] + ga(e) - x[i]);
        }
        l6_stage_by_keys(db, dsm, dw, me.warp, me.g, me.t);
        l6_stage_by_h(gb, gsm, gv, me.warp, me.lane);
        l6_fence_proxy();
        wg_barrier(me.wg);

#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
            l6_columns_by_horizons<L6_BCS>(gq[mt], buf, db, dsm, mt, me.warp, me.g, me.t);
        wg_barrier(me.wg);  // every warp has read the row: the buffer takes the next one
        if (b + stride < B) {  // the next row's ln; its G and attn into L2
            l6_load_row(buf, ln, b + stride, K, me.tid);
            asm volatile("prefetch.global.L2 [%0];" ::"l"(
                grad_ctx + (size_t)(b + stride) * N_HORIZONS * HIDDEN_DIM + 32 * me.tid));
            if (me.tid < N_HORIZONS * K / 32)
                asm volatile("prefetch.global.L2 [%0];" ::"l"(attn + ATTN_ROW(b + stride)
                                                               + 32 * me.tid));
        }

        float acc[64];
#pragma unroll
        for (int e = 0; e < 64; ++e) acc[e] = 0.f;
        l6_keys_by_columns(acc, av, gb, gsm);
        l6_keys_by_columns(acc, dw, qtb, qts);
        float* glb = grad_ln + (size_t)b * K * HIDDEN_DIM;
#pragma unroll
        for (int j = 0; j < HIDDEN_DIM / 8; ++j)
#pragma unroll
            for (int r = 0; r < 2; ++r)
                if (me.k0 + 8 * r < K)
                    *reinterpret_cast<float2*>(glb + (size_t)(me.k0 + 8 * r) * HIDDEN_DIM + 8 * j
                                               + 2 * me.t) =
                        make_float2(acc[4 * j + 2 * r], acc[4 * j + 2 * r + 1]);
        wg_barrier(me.wg);  // G's and DS's halves and the partials are free for the next row
    }
    // the block's warpgroups in order (BLOCK 256: the second adds the first's partial, passed
    // through the first's row buffer, which no copy still fills), then gq_scratch[block]
    float* first = qts + N_HORIZONS * HIDDEN_DIM;
    auto at = [&](int mt, int e) {
        return (8 * (e / 4) + 2 * me.t + e % 2) * HIDDEN_DIM + 64 * mt + 16 * me.warp + me.g
               + 8 * (e / 2 % 2);
    };
    if (L6_WG == 2) {
        if (me.wg == 0)
#pragma unroll
            for (int mt = 0; mt < 2; ++mt)
#pragma unroll
                for (int e = 0; e < 16; ++e) first[at(mt, e)] = gq[mt][e];
        __syncthreads();
        if (me.wg == 0) return;
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
            for (int e = 0; e < 16; ++e) gq[mt][e] = first[at(mt, e)] + gq[mt][e];
    }
    float* out = gq_scratch + (size_t)blockIdx.x * N_HORIZONS * HIDDEN_DIM;
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int e = 0; e < 16; ++e) out[at(mt, e)] = gq[mt][e];
}
