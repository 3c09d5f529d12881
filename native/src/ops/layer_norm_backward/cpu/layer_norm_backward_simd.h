// LayerNorm backward CPU leaf kernels over one contiguous row segment: built once per ISA for F16/BF16/F32,
// and once, scalar, for F64 (layer_norm_backward_cpu.cc).
#ifndef INFINIOP_SRC_OPS_LAYER_NORM_BACKWARD_CPU_SIMD_H
#define INFINIOP_SRC_OPS_LAYER_NORM_BACKWARD_CPU_SIMD_H

#include "devices/cpu/half.h"
#include "devices/cpu/isa.h"
#include "devices/cpu/reduce.h"
#include "devices/cpu/row_driver.h"
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

// The kernels of one form, whose row input is xhat or the forward's input. T: the data type; W: the weight as the
// kernels read it (T's compute type C, or T itself), and the type of the gradients they write straight
// (cpu::GradientTerms).
template <typename T, typename W>
struct FormKernels {
    using C = cpu::ComputeOf<T>;
    // {sum of g, sum of g*xhat} with g = grad_output*weight over [0, n), in fixed 4096-element chunks.
    cpu::PairSums (*sums)(size_t n, const T *grad_output, const T *row_input, const W *weight, RowStatistics<C> row);
    // grad_input = (g - mean_g - xhat*mean_g_xhat) * row.rstd over [0, n), grad_output*xhat into weight_terms and
    // grad_output into bias_terms (no terms: that gradient is not wanted; both go to partials or both to rounded
    // gradients). A partial adds them; with partials_with_next it takes the next row's terms too, added to this
    // row's first (needs hints.next_a/next_b); with starts it is not read: +0.0 plus the terms, the bits of adding
    // them to a zeroed partial. grad_input may be grad_output. Returns what sums gives for hints.next_a/next_b and
    // the statistics `next` ({} if NULL), reduced in the same pass.
    cpu::PairSums (*apply)(size_t n, RowStatistics<C> row, RowStatistics<C> next, C mean_g, C mean_g_xhat,
                           const T *grad_output, const T *row_input, const W *weight, T *grad_input,
                           cpu::GradientTerms<C, W> weight_terms, cpu::GradientTerms<C, W> bias_terms,
                           bool partials_with_next, bool starts, const cpu::RowHints<T> &hints);
    // sums, then apply, of `rows` rows of n elements, row r's data at r times each stride and its statistics in
    // statistics[r]; both gradients' terms go to partials (NULL: not wanted), which the first row writes where
    // `starts`. The same arithmetic as calling the two per row (RowPlan::short_rows). stream: grad_input past the
    // caches, its rows whole vectors (cpu::RowPlan::streams), for the caller to fence.
    void (*rows)(size_t rows, size_t n, const T *grad_output, ptrdiff_t grad_output_stride, const T *row_input,
                 ptrdiff_t row_input_stride, T *grad_input, ptrdiff_t grad_input_stride, const W *weight,
                 const RowStatistics<C> *statistics, C *weight_partial, C *bias_partial, bool starts, bool stream);
};

template <typename T, typename W>
struct Kernels {
    FormKernels<T, W> xhat, from_input;
};

} // namespace op::layer_norm_backward

#endif
