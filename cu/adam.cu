// Bias-corrected Adam, elementwise over n parameters:
//   m' = beta1 m + (1 - beta1) g,  v' = beta2 v + (1 - beta2) g^2,
//   p' = p - lr (m' / bc1) / (sqrt(v' / bc2) + eps),  bc1 = 1 - beta1^t, bc2 = 1 - beta2^t.
// The host passes 1 - beta1, 1 - beta2, bc1 and bc2 computed in double: 1 - 0.999f in float
// would carry a 1e-5 relative error into v. Each element has one thread that reads its
// p, g, m, v and writes p', m', v': the outputs may alias the inputs (an in-place step), so no
// pointer is __restrict__. Deterministic, no atomics. Template constants: BLOCK, ITEMS.
#include "heads_common.cuh"

extern "C" __global__ void __launch_bounds__(BLOCK)
adam_step(const float* param, const float* grad, const float* m, const float* v,
          float* param_out, float* m_out, float* v_out, const int n, const float lr,
          const float beta1, const float beta2, const float one_minus_beta1,
          const float one_minus_beta2, const float eps, const float bc1, const float bc2)
{
    const int base = blockIdx.x * BLOCK * ITEMS + threadIdx.x;
#pragma unroll
    for (int j = 0; j < ITEMS; ++j) {
        const int i = base + j * BLOCK;
        if (i < n) {
            const float g = grad[i];
            const float mi = beta1 * m[i] + one_minus_beta1 * g;
            const float vi = beta2 * v[i] + one_minus_beta2 * g * g;
            const float p = param[i] - lr * (mi / bc1) / (sqrtf(vi / bc2) + eps);
            m_out[i] = mi;
            v_out[i] = vi;
            param_out[i] = p;
        }
    }
}
