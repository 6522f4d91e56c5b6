// Multi-tensor Adam: one launch updates every tensor listed in a device table. Row i of the
// table holds tensor i's param, grad, m, v, param_out, m_out, v_out addresses, its length n and
// the first block of the grid that works on it; block x updates elements of the last tensor whose
// first block is <= x, BLOCK * ITEMS of them, exactly as adam_step does for one array. The
// element update is adam_step's own (adam.cuh), so the result is bitwise per-array Adam's.
// The outputs may alias the inputs (in place), so no pointer is __restrict__. No atomics.
// Template constants: BLOCK, ITEMS.
#include "heads_common.cuh"

#include "adam.cuh"
#include "pdl.cuh"

#define TABLE_COLS 9

// beta^t by squaring in double, products rounded one by one (never fused into the 1 - x that
// follows): the host's float(1 - beta ** t) to the bit for the betas in use (a CPU test
// compares the same sequence with Python's over many steps).
__device__ __forceinline__ double power(double beta, int t)
{
    double r = 1.0;
    for (; t; t >>= 1, beta = __dmul_rn(beta, beta))
        if (t & 1) r = __dmul_rn(r, beta);
    return r;
}

// With counters null, lr, bc1 and bc2 are the arguments. Otherwise the step number lives on the
// device (a training step replayed as a graph): counters[blockIdx.x] is this block's count of
// steps taken, which the block alone reads and advances (one writer per counter, no launch of
// its own, all counters in lockstep), the bias corrections follow from it, and lr is lr_dev[0].
extern "C" __global__ void __launch_bounds__(BLOCK)
multiadam_step(const long long* __restrict__ table, const int n_tensors,
               int* __restrict__ counters, const float* __restrict__ lr_dev, const float lr,
               const float beta1, const float beta2, const float one_minus_beta1,
               const float one_minus_beta2, const float eps, const float bc1, const float bc2,
               const double beta1_64, const double beta2_64)
{
    pdl_enter();
    __shared__ float corrections[2];
    if (counters) {
        if (threadIdx.x == 0) {
            const int t = counters[blockIdx.x] + 1;
            corrections[0] = __double2float_rn(__dsub_rn(1.0, power(beta1_64, t)));
            corrections[1] = __double2float_rn(__dsub_rn(1.0, power(beta2_64, t)));
            counters[blockIdx.x] = t;
        }
        __syncthreads();
    }
    int lo = 0, hi = n_tensors - 1;  // binary search over the rows' first blocks
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (table[mid * TABLE_COLS + 8] <= (long long)blockIdx.x) lo = mid; else hi = mid - 1;
    }
    const long long* row = table + lo * TABLE_COLS;
    const float* param = reinterpret_cast<const float*>(row[0]);
    const float* grad = reinterpret_cast<const float*>(row[1]);
    const float* m = reinterpret_cast<const float*>(row[2]);
    const float* v = reinterpret_cast<const float*>(row[3]);
    float* param_out = reinterpret_cast<float*>(row[4]);
    float* m_out = reinterpret_cast<float*>(row[5]);
    float* v_out = reinterpret_cast<float*>(row[6]);
    const int n = (int)row[7];
    const float rate = counters ? lr_dev[0] : lr;
    const float c1 = counters ? corrections[0] : bc1;
    const float c2 = counters ? corrections[1] : bc2;
    adam_elements(param, grad, m, v, param_out, m_out, v_out,
                  ((int)blockIdx.x - (int)row[8]) * BLOCK * ITEMS + threadIdx.x, n, rate, beta1,
                  beta2, one_minus_beta1, one_minus_beta2, eps, c1, c2);
}
