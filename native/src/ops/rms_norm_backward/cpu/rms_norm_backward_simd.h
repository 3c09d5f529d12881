// RMSNorm backward CPU leaf kernels over one contiguous row segment: built once per ISA for F16/BF16/F32,
// and once, scalar, for F64 (rms_norm_backward_cpu.cc).
#ifndef INFINIOP_SRC_OPS_RMS_NORM_BACKWARD_CPU_SIMD_H
#define INFINIOP_SRC_OPS_RMS_NORM_BACKWARD_CPU_SIMD_H

#include "devices/cpu/half.h"
#include "devices/cpu/isa.h"
#include "devices/cpu/reduce.h"
#include "devices/cpu/row_driver.h"
#include "devices/cpu/row_hints.h"
#include "devices/cpu/types.h"

#include <cstddef>

namespace op::rms_norm_backward {

// T: the data type; W: the weight as the kernels read it (T's compute type C, or T itself), and the type of a
// gradient they write straight (cpu::GradientTerms).
template <typename T, typename W>
struct Kernels {
    using C = cpu::ComputeOf<T>;
    // {sum of x^2, sum of grad_y*w*x} over [0, n), in fixed 4096-element chunks.
    cpu::PairSums (*sums)(size_t n, const T *grad_y, const T *x, const W *w);
    // grad_x = r*grad_y*w - x_coef*x over [0, n), and grad_y*x*r into grad_w_terms: added to its partial, or with
    // starts written to it unread (+0.0 + grad_y*x*r, the bits of adding to a zeroed partial), or rounded into its
    // gradient (no terms: grad_w not wanted); grad_x may be grad_y. Returns what sums gives for
    // hints.next_a/next_b ({} if NULL), reduced in the same pass.
    cpu::PairSums (*apply)(size_t n, C r, C x_coef, const T *grad_y, const T *x, const W *w, T *grad_x,
                           cpu::GradientTerms<C, W> grad_w_terms, bool starts, const cpu::RowHints<T> &hints);
    // Short rows a few at a time (cpu::RowPlan::short_rows), each array's rows one stride apart: sums of `rows` rows
    // into totals[i], and apply of `rows` rows with r[i] and x_coef[i], grad_w's terms into `partial` (NULL: not
    // wanted), which the first row writes where `starts` (no next row). stream: grad_x past the caches, its rows
    // whole vectors (cpu::RowPlan::streams), for the caller to fence.
    void (*block_sums)(size_t rows, size_t n, const T *grad_y, ptrdiff_t grad_y_stride, const T *x,
                       ptrdiff_t x_stride, const W *w, cpu::PairSums *totals);
    void (*block_apply)(size_t rows, size_t n, const C *r, const C *x_coef, const T *grad_y, ptrdiff_t grad_y_stride,
                        const T *x, ptrdiff_t x_stride, const W *w, T *grad_x, ptrdiff_t grad_x_stride, C *partial,
                        bool starts, bool stream);
};

} // namespace op::rms_norm_backward

#endif
