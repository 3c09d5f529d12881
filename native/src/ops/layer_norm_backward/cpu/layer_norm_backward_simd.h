// LayerNorm backward CPU leaf kernels over one contiguous row segment, built once per ISA.
#ifndef INFINIOP_SRC_OPS_LAYER_NORM_BACKWARD_CPU_SIMD_H
#define INFINIOP_SRC_OPS_LAYER_NORM_BACKWARD_CPU_SIMD_H

#include "devices/cpu/half.h"
#include "devices/cpu/isa.h"
#include "devices/cpu/reduce.h"

#include <cstddef>

namespace op::layer_norm_backward {

template <typename T>
struct Kernels {
    // {sum of g, sum of g*xhat} with g = grad_output*weight over [0, n), in fixed 4096-element chunks.
    cpu::PairSums (*sums)(size_t n, const T *grad_output, const T *xhat, const float *weight);
    // grad_input = (g - mean_g - xhat*mean_g_xhat) * inv_std, weight_partial += grad_output*xhat,
    // bias_partial += grad_output over [0, n); grad_input may be grad_output.
    void (*apply)(size_t n, float inv_std, float mean_g, float mean_g_xhat, const T *grad_output, const T *xhat,
                  const float *weight, T *grad_input, float *weight_partial, float *bias_partial);
};

} // namespace op::layer_norm_backward

#endif
