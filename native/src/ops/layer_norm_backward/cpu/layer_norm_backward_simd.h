// LayerNorm backward CPU leaf kernels over one contiguous row segment: built once per ISA for F16/BF16/F32,
// and once, scalar, for F64 (layer_norm_backward_cpu.cc).
#ifndef INFINIOP_SRC_OPS_LAYER_NORM_BACKWARD_CPU_SIMD_H
#define INFINIOP_SRC_OPS_LAYER_NORM_BACKWARD_CPU_SIMD_H

#include "devices/cpu/half.h"
#include "devices/cpu/isa.h"
#include "devices/cpu/reduce.h"
#include "devices/cpu/row_hints.h"
#include "devices/cpu/types.h"

#include <cstddef>

namespace op::layer_norm_backward {

// A row's statistics as the kernels take them: rstd multiplies grad_input (1/std in the xhat form); in the
// from-input form xhat = (input - mean) * rstd. The xhat form never reads mean.
template <typename C>
struct RowStatistics {
    C mean, rstd;
};

// The row input as xhat: itself (the xhat form), or (input - mean) * rstd, formed where it is used and never stored.
// V: a vector or a scalar, S: its mean/rstd.
template <bool kFromInput, typename V, typename S>
inline V standardized(V row_input, S mean, S rstd) {
    if constexpr (kFromInput) {
        return (row_input - mean) * rstd;
    } else {
        return row_input;
    }
}

// The kernels of one form, whose row input is xhat or the forward's input.
template <typename T>
struct FormKernels {
    using C = cpu::ComputeOf<T>;
    // {sum of g, sum of g*xhat} with g = grad_output*weight over [0, n), in fixed 4096-element chunks.
    cpu::PairSums (*sums)(size_t n, const T *grad_output, const T *row_input, const C *weight, RowStatistics<C> row);
    // grad_input = (g - mean_g - xhat*mean_g_xhat) * row.rstd, weight_partial += grad_output*xhat,
    // bias_partial += grad_output over [0, n) (a NULL partial: that gradient is not wanted); with
    // partials_with_next, the partials take the next row's terms too, added to this row's first (needs
    // hints.next_a/next_b); with starts, the partials are not read: each is +0.0 plus its terms, the bits of
    // adding them to a zeroed partial. grad_input may be grad_output. Returns what sums gives for
    // hints.next_a/next_b and the statistics `next` ({} if NULL), reduced in the same pass.
    cpu::PairSums (*apply)(size_t n, RowStatistics<C> row, RowStatistics<C> next, C mean_g, C mean_g_xhat,
                           const T *grad_output, const T *row_input, const C *weight, T *grad_input, C *weight_partial,
                           C *bias_partial, bool partials_with_next, bool starts, const cpu::RowHints<T> &hints);
};

template <typename T>
struct Kernels {
    FormKernels<T> xhat, from_input;
};

} // namespace op::layer_norm_backward

#endif
