// LayerNorm forward CPU leaf kernels over one contiguous row segment: built once per ISA for F16/BF16/F32, and
// once, scalar, for F64 (layer_norm_cpu.cc).
#ifndef INFINIOP_SRC_OPS_LAYER_NORM_CPU_SIMD_H
#define INFINIOP_SRC_OPS_LAYER_NORM_CPU_SIMD_H

#include "devices/cpu/half.h"
#include "devices/cpu/isa.h"
#include "devices/cpu/reduce.h"
#include "devices/cpu/types.h"

#include <cstddef>

namespace op::layer_norm {

// A row's statistics as the kernels apply them: xhat = (x - mean_high) * rstd - mean_low * rstd. The mean is split in
// two of the compute type so that rows whose mean is large against their spread lose no bits of x - mean (the
// F64 kernels keep mean_low 0).
template <typename C>
struct RowStatistics {
    C mean_high, mean_low, rstd;
};

// What block_rows gives the caller per row, for the statistics outputs: mean, var + eps and 1/sqrt(var + eps), in F64
// as the caller computes them for longer rows (the same steps).
struct BlockMoments {
    double mean[cpu::kBlockRows], variance_eps[cpu::kBlockRows], rstd[cpu::kBlockRows];
};

// T: the data type; W: the parameters as the kernels read them (T's compute type C, or T itself).
template <typename T, typename W>
struct Kernels {
    using C = cpu::ComputeOf<T>;
    // {sum of (x - shift), sum of (x - shift)^2} over [0, n) in F64, built chunk by chunk (fixed 4096-element
    // chunks from the segment's start): each chunk summed in one pass about its first vector's mean (a second
    // pass, from L1, about the chunk's mean where that lies far from it), in F32 lanes, carried into F64 about
    // the shift. The caller's shift is an element of the row (its first), so the variance it forms,
    // sum((x - shift)^2)/L - (sum(x - shift)/L)^2, cancels no more than (shift - mean)^2/var times F64 rounding,
    // however large the mean is against the spread.
    cpu::PairSums (*sums)(size_t n, const T *x, C shift);
    // y = xhat * w + b over [0, n), and xhat itself where `xhat` is non-NULL; b NULL: no bias. y may be x.
    // stream: write y and xhat past the caches, unfenced (cpu::RowHints::stream_output); where xhat's alignment
    // differs from y's, neither streams (the pass aligns to y's).
    void (*apply)(size_t n, RowStatistics<C> row, const T *x, const W *w, const W *b, T *y, T *xhat, bool stream);
    // Short rows a few at a time (cpu::RowPlan::short_rows), each array's rows one stride apart: sums of `rows` rows
    // into totals[r], each about its first element, and apply of `rows` rows with statistics[r], each row streamed
    // as apply streams it.
    void (*block_sums)(size_t rows, size_t n, const T *x, ptrdiff_t x_stride, cpu::PairSums *totals);
    void (*block_apply)(size_t rows, size_t n, const RowStatistics<C> *statistics, const T *x, ptrdiff_t x_stride,
                        const W *w, const W *b, T *y, ptrdiff_t y_stride, T *xhat, ptrdiff_t xhat_stride,
                        bool stream);
    // Rows of at most cpu::kBlockRowsMaxDim elements, at most cpu::kBlockRows of them, whole: each row loaded
    // once into registers, the group's sums, moments (into `moments`) and outputs computed side by side. NULL where
    // the types have none (F64): block_sums and block_apply then. stream: y and xhat past the caches, their rows whole
    // vectors (cpu::RowPlan::streams), for the caller to fence (cpu::fenceStreams) after its last group. cached: the
    // call's inputs fit the caches (cpu::RowPlan::cached). The next group's x is fetched meanwhile where
    // simd::RowParts::fetchAhead says.
    void (*block_rows)(size_t rows, size_t n, double epsilon, const T *x, ptrdiff_t x_stride, const W *w, const W *b,
                       T *y, ptrdiff_t y_stride, T *xhat, ptrdiff_t xhat_stride, BlockMoments *moments,
                       bool stream, bool cached);
};

} // namespace op::layer_norm

#endif
