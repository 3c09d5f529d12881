// RMSNorm forward CPU leaf kernels over one contiguous row segment: built once per ISA for F16/BF16/F32, and
// once, scalar, for F64 (rms_norm_cpu.cc).
#ifndef INFINIOP_SRC_OPS_RMS_NORM_CPU_SIMD_H
#define INFINIOP_SRC_OPS_RMS_NORM_CPU_SIMD_H

#include "devices/cpu/half.h"
#include "devices/cpu/isa.h"
#include "devices/cpu/reduce.h"
#include "devices/cpu/row_hints.h"
#include "devices/cpu/types.h"

#include <cstddef>

namespace op::rms_norm {

// T: the data type; W: the weight as the kernels read it (T's compute type C, or T itself).
template <typename T, typename W>
struct Kernels {
    using C = cpu::ComputeOf<T>;
    // {sum of x^2, 0} over [0, n), in fixed 4096-element chunks (the row driver's pair; the second is unused).
    cpu::PairSums (*sums)(size_t n, const T *x);
    // y = x * r * w over [0, n); y may be x. Returns what sums gives for hints.next_a ({} if NULL), reduced in
    // the same pass (hints.next_b and fetch_b are x's too, and ignored).
    cpu::PairSums (*apply)(size_t n, C r, const T *x, const W *w, T *y, const cpu::RowHints<T> &hints);
    // Short rows a few at a time (cpu::RowPlan::short_rows), each array's rows one stride apart: sums of `rows` rows
    // into totals[r], and apply of `rows` rows with r[row] (no next row; stream_y: each row's y streamed as apply
    // streams it).
    void (*block_sums)(size_t rows, size_t n, const T *x, ptrdiff_t x_stride, cpu::PairSums *totals);
    void (*block_apply)(size_t rows, size_t n, const C *r, const T *x, ptrdiff_t x_stride, const W *w, T *y,
                        ptrdiff_t y_stride, bool stream_y);
    // Rows of at most cpu::kBlockRowsMaxDim elements, at most cpu::kBlockRows of them, whole: each row loaded once
    // into registers, the group's sums side by side, rstd[r] (1/sqrt(mean(x^2) + eps) in F64, as the caller computes
    // it for longer rows) and y. NULL where the types have none (F64): block_sums and block_apply then. stream_y: y
    // past the caches, its rows whole vectors (cpu::RowPlan::streams), for the caller to fence (cpu::fenceStreams)
    // after its last group. cached: the call's inputs fit the caches (cpu::RowPlan::cached). The next group's x is
    // fetched meanwhile where simd::RowParts::fetchAhead says.
    void (*block_rows)(size_t rows, size_t n, double epsilon, const T *x, ptrdiff_t x_stride, const W *w, T *y,
                       ptrdiff_t y_stride, double *rstd, bool stream_y, bool cached);
};

} // namespace op::rms_norm

#endif
