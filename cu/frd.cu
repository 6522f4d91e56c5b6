// FRD softmax + cross-entropy gradient over N_ATOMS return atoms per (batch, horizon) row:
//   p = softmax(logits[row, :]), ce[row] = -log(max(p[label], 1e-30)),
//   grad[row, a] = (p[a] - [a == label]) / B; label -1 (return not realised) gives a zero row and
//   zero loss; a label outside [-1, N_ATOMS) gives NaN in its row and loss (the binding rejects
//   such labels before launch; the NaN keeps a skipped check from ever producing plausible numbers).
// Template constants: N_HORIZONS, N_ATOMS and the layout knobs. No atomics: one writer per element.
#include "heads_common.cuh"

__device__ __forceinline__ bool label_bad(int label) { return label < -1 || label >= N_ATOMS; }

__device__ __forceinline__ float atom_grad(float x, float mx, float sum, int a, int label, float inv_b) {
    if (label == -1) return 0.f;
    if (label_bad(label)) return NAN;
    const float p = expf(x - mx) / sum;
    return (p - (a == label ? 1.f : 0.f)) * inv_b;
}

__device__ __forceinline__ float row_ce(float x_label, float mx, float sum, int label) {
    if (label == -1) return 0.f;
    if (label_bad(label)) return NAN;
    return -logf(fmaxf(expf(x_label - mx) / sum, 1e-30f));
}

#if LAYOUT == 0
// The original design: grid (B, N_HORIZONS), block (N_ATOMS), thread 0 does the serial max/sum.
extern "C" __global__ void __launch_bounds__(N_ATOMS)
frd_softmax_ce_grad(const float* __restrict__ logits, const int* __restrict__ labels,
                    float* __restrict__ grad, float* __restrict__ ce, const int rows, const float inv_b)
{
    __shared__ float x[N_ATOMS];
    __shared__ float stat[2];
    const int row = blockIdx.x * N_HORIZONS + blockIdx.y;
    const int a = threadIdx.x;
    const int label = labels[row];
    x[a] = logits[(size_t)row * N_ATOMS + a];
    __syncthreads();
    if (a == 0) {
        float mx = x[0];
        for (int i = 1; i < N_ATOMS; ++i) mx = fmaxf(mx, x[i]);
        float sum = 0.f;
        for (int i = 0; i < N_ATOMS; ++i) sum += expf(x[i] - mx);
        stat[0] = mx;
        stat[1] = sum;
    }
    __syncthreads();
    grad[(size_t)row * N_ATOMS + a] = atom_grad(x[a], stat[0], stat[1], a, label, inv_b);
    if (a == 0) ce[row] = row_ce(label_bad(label) || label < 0 ? 0.f : x[label], stat[0], stat[1], label);
}
#elif LAYOUT == 1
// Groups of TPR lanes per row, BLOCK/TPR rows per block, butterfly shuffles for max and sum; each
// lane keeps its exponentials in registers, so one exp per atom. STAGE=1 first copies the block's
// contiguous logits into shared memory with coalesced (float4 where aligned) loads and writes
// the gradient back the same way.
#define RPB (BLOCK / TPR)
#define APT ((N_ATOMS + TPR - 1) / TPR)
// float4 staging needs the block's first element on a 16-byte boundary: RPB*N_ATOMS % 4 == 0.
#define STAGE_VEC ((RPB * N_ATOMS) % 4 == 0)

__device__ __forceinline__ void copy_floats(float* dst, const float* src, int n) {
    if (STAGE_VEC) {
        for (int i = threadIdx.x; i < n / 4; i += BLOCK)
            reinterpret_cast<float4*>(dst)[i] = reinterpret_cast<const float4*>(src)[i];
        for (int i = n / 4 * 4 + threadIdx.x; i < n; i += BLOCK) dst[i] = src[i];
    } else {
        for (int i = threadIdx.x; i < n; i += BLOCK) dst[i] = src[i];
    }
}

extern "C" __global__ void __launch_bounds__(BLOCK)
frd_softmax_ce_grad(const float* __restrict__ logits, const int* __restrict__ labels,
                    float* __restrict__ grad, float* __restrict__ ce, const int rows, const float inv_b)
{
    const int g = threadIdx.x / TPR;
    const int t = threadIdx.x % TPR;
    const int row0 = blockIdx.x * RPB;
    const int row = row0 + g;
    const bool live = row < rows;  // dead lanes still join the shuffles
    const int label = live ? labels[row] : -1;
#if STAGE
    extern __shared__ __align__(16) float buf[];
    const int n = min(RPB, rows - row0) * N_ATOMS;
    copy_floats(buf, logits + (size_t)row0 * N_ATOMS, n);
    __syncthreads();
    const float* rowx = buf + g * N_ATOMS;
#else
    const float* rowx = logits + (size_t)row * N_ATOMS;
#endif
    float e[APT];
    float mx = -INFINITY;
#pragma unroll
    for (int i = 0; i < APT; ++i) {
        const int a = t + i * TPR;
        e[i] = (live && a < N_ATOMS) ? rowx[a] : -INFINITY;
        mx = fmaxf(mx, e[i]);
    }
    mx = group_max<TPR>(mx);
    float sum = 0.f;
#pragma unroll
    for (int i = 0; i < APT; ++i) {
        e[i] = (t + i * TPR < N_ATOMS) ? __expf(e[i] - mx) : 0.f;
        sum += e[i];
    }
    sum = group_sum<TPR>(sum);
    const float inv_sum = 1.f / sum;
    const bool bad = label_bad(label);
    if (live) {
#if STAGE
        float* dst = buf + g * N_ATOMS;
#else
        float* dst = grad + (size_t)row * N_ATOMS;
#endif
#pragma unroll
        for (int i = 0; i < APT; ++i) {
            const int a = t + i * TPR;
            if (a >= N_ATOMS) continue;
            const float p = e[i] * inv_sum;
            dst[a] = label == -1 ? 0.f : bad ? NAN : (p - (a == label ? 1.f : 0.f)) * inv_b;
            if (a == label) ce[row] = -logf(fmaxf(p, 1e-30f));
        }
        if (t == 0 && (label == -1 || bad)) ce[row] = label == -1 ? 0.f : NAN;
    }
#if STAGE
    __syncthreads();
    copy_floats(grad + (size_t)row0 * N_ATOMS, buf, n);
#endif
}
#else
// Warp-local streaming: each warp owns chunks of 32 rows (32*N_ATOMS contiguous floats) taken
// grid-stride. A chunk is loaded and stored coalesced through a per-warp shared tile, one row
// per lane for the math, and the next chunk's loads are issued before the current one is
// computed. Only warp barriers: warps never wait for each other.
#define WPB (BLOCK / 32)
// Odd row stride: lane l reading atom a of its row hits bank (l * stride + a) % 32, all distinct.
#define TILE_STRIDE (N_ATOMS | 1)

__device__ __forceinline__ int tile_at(int e) { return (e / N_ATOMS) * TILE_STRIDE + e % N_ATOMS; }

__device__ __forceinline__ void load_chunk(const float* __restrict__ logits, int chunk, int rows,
                                           int lane, float* buf) {
    const int n = min(32, rows - chunk * 32) * N_ATOMS;
    const float* src = logits + (size_t)chunk * 32 * N_ATOMS;
#pragma unroll
    for (int j = 0; j < N_ATOMS; ++j) {
        const int e = lane + 32 * j;
        buf[j] = e < n ? __ldcs(src + e) : 0.f;  // streamed once: do not keep in cache
    }
}

extern "C" __global__ void __launch_bounds__(BLOCK)
frd_softmax_ce_grad(const float* __restrict__ logits, const int* __restrict__ labels,
                    float* __restrict__ grad, float* __restrict__ ce, const int rows, const float inv_b)
{
    __shared__ float tiles[WPB][32 * TILE_STRIDE];
    const int lane = threadIdx.x & 31;
    float* tile = tiles[threadIdx.x >> 5];
    const int chunks = (rows + 31) / 32;
    const int step = gridDim.x * WPB;
    int chunk = blockIdx.x * WPB + (threadIdx.x >> 5);
    float buf[N_ATOMS];
    if (chunk < chunks) load_chunk(logits, chunk, rows, lane, buf);
    for (; chunk < chunks; chunk += step) {
        const int n = min(32, rows - chunk * 32) * N_ATOMS;
#pragma unroll
        for (int j = 0; j < N_ATOMS; ++j) tile[tile_at(lane + 32 * j)] = buf[j];
        if (chunk + step < chunks) load_chunk(logits, chunk + step, rows, lane, buf);
        __syncwarp();
        const int row = chunk * 32 + lane;
        const int label = row < rows ? labels[row] : -1;
        const bool bad = label_bad(label);
        float* x = tile + lane * TILE_STRIDE;
        float e[N_ATOMS];
        float mx = -INFINITY;
#pragma unroll
        for (int a = 0; a < N_ATOMS; ++a) mx = fmaxf(mx, x[a]);
        float sum = 0.f;
#pragma unroll
        for (int a = 0; a < N_ATOMS; ++a) {
            e[a] = __expf(x[a] - mx);
            sum += e[a];
        }
        const float inv_sum = 1.f / sum;
        float row_loss = label == -1 ? 0.f : NAN;
#pragma unroll
        for (int a = 0; a < N_ATOMS; ++a) {
            const float p = e[a] * inv_sum;
            x[a] = label == -1 ? 0.f : bad ? NAN : (p - (a == label ? 1.f : 0.f)) * inv_b;
            if (a == label) row_loss = -logf(fmaxf(p, 1e-30f));
        }
        if (row < rows) ce[row] = row_loss;
        __syncwarp();
        float* dst = grad + (size_t)chunk * 32 * N_ATOMS;
#pragma unroll
        for (int j = 0; j < N_ATOMS; ++j) {
            const int at = lane + 32 * j;
            if (at < n) __stcs(dst + at, tile[tile_at(at)]);
        }
        __syncwarp();  // the tile is refilled next iteration
    }
}
#endif

// Label check on the device, so device labels need no copy to the host and no synchronisation:
// block g writes, to slot g of a host-mapped buffer, the first flat position in its range whose
// label is outside [-1, N_ATOMS) and that label (position -1 when none). One writer per slot;
// the host takes the first slot holding a position.
#define CHECK_BLOCK 256
#define NO_BAD 0x7fffffff
extern "C" __global__ void __launch_bounds__(CHECK_BLOCK)
frd_check_labels(const int* __restrict__ labels, int* __restrict__ first_bad, int n, int per_block) {
    __shared__ int pos[CHECK_BLOCK];
    const int begin = blockIdx.x * per_block;
    const int end = min(begin + per_block, n);
    int mine = NO_BAD;
    for (int i = begin + threadIdx.x; i < end && mine == NO_BAD; i += CHECK_BLOCK)
        if (label_bad(labels[i])) mine = i;
    pos[threadIdx.x] = mine;
    __syncthreads();
    for (int s = CHECK_BLOCK / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) pos[threadIdx.x] = min(pos[threadIdx.x], pos[threadIdx.x + s]);
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        const int at = pos[0];
        first_bad[2 * blockIdx.x] = at == NO_BAD ? -1 : at;
        first_bad[2 * blockIdx.x + 1] = at == NO_BAD ? 0 : labels[at];
    }
}
