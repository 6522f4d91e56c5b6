// The Adam update of ITEMS elements a thread (BLOCK threads apart from element `base`), shared
// by adam_step and multiadam_step so that the multi-tensor step is per-array Adam to the bit:
//   m' = beta1 m + (1 - beta1) g,  v' = beta2 v + (1 - beta2) g^2,
//   p' = p - lr (m' / bc1) / (sqrt(v' / bc2) + eps).
// The outputs may alias the inputs (an in-place step), so no pointer is __restrict__.
__device__ __forceinline__ void adam_elements(const float* param, const float* grad,
                                              const float* m, const float* v, float* param_out,
                                              float* m_out, float* v_out, const int base,
                                              const int n, const float lr, const float beta1,
                                              const float beta2, const float one_minus_beta1,
                                              const float one_minus_beta2, const float eps,
                                              const float bc1, const float bc2)
{
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
