// Bias-corrected Adam, elementwise over n parameters:
//   m' = beta1 m + (1 - beta1) g,  v' = beta2 v + (1 - beta2) g^2,
//   p' = p - lr (m' / bc1) / (sqrt(v' / bc2) + eps),  bc1 = 1 - beta1^t, bc2 = 1 - beta2^t.
// The host passes 1 - beta1, 1 - beta2, bc1 and bc2 computed in double: 1 - 0.999f in float
// would carry a 1e-5 relative error into v. Each element has one thread that reads its
// p, g, m, v and writes p', m', v' (adam.cuh). Deterministic, no atomics. Template constants:
// BLOCK, ITEMS.
#include "heads_common.cuh"

#include "adam.cuh"

extern "C" __global__ void __launch_bounds__(BLOCK)
adam_step(const float* param, const float* grad, const float* m, const float* v,
          float* param_out, float* m_out, float* v_out, const int n, const float lr,
          const float beta1, const float beta2, const float one_minus_beta1,
          const float one_minus_beta2, const float eps, const float bc1, const float bc2)
{
    adam_elements(param, grad, m, v, param_out, m_out, v_out,
                  blockIdx.x * BLOCK * ITEMS + threadIdx.x, n, lr, beta1, beta2, one_minus_beta1,
                  one_minus_beta2, eps, bc1, bc2);
}
