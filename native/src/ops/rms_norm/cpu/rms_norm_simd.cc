// Compiled once per ISA (CPU_ISA = avx512bf16, avx512, avx2 or generic, with matching flags); see devices/cpu/simd.h.
#include "rms_norm_simd.h"

#include "devices/cpu/simd.h"

#include <cstring>

namespace op::rms_norm {
namespace {

using simd::f32v;

// The reduction of one row: the sum of x^2 (the pair's second sum stays zero), its multiply-adds fused by hand
// (simd::mulAdd), so that the row and block kernels that inline it sum alike whatever the compiler would fuse.
template <typename T>
SIMD_INLINE auto rowSums(size_t n, const T *x) {
    return simd::RowSums(
        n,
        [&] {
            return [=](size_t j, f32v &sum_squares, f32v &) SIMD_LAMBDA_INLINE {
                const f32v xj = simd::load(x + j);
                sum_squares = simd::mulAdd(xj, xj, sum_squares);
            };
        },
        [&] {
            return [=](size_t j, float &sum_squares, float &) {
                const float xj = cpu::toFloat(x[j]);
                sum_squares = simd::mulAdd(xj, xj, sum_squares);
            };
        });
}

template <typename T>
cpu::PairSums sums(size_t n, const T *x) {
    return rowSums(n, x).finish();
}

template <typename T, typename W>
cpu::PairSums apply(size_t n, float r, const T *x, const W *w, T *y, const cpu::RowHints<T> &hints) {
    const f32v r_v = simd::splat(r);
    auto step = [=](auto stream, T *out, const T *x_at, const W *w_at) SIMD_LAMBDA_INLINE {
        simd::put(stream, out, simd::load(x_at) * r_v * simd::load(w_at));
    };
    const cpu::PairSums next_sums = simd::passAlongside(
        hints, [&](const T *next_x, const T *) { return rowSums(n, next_x); },
        [&](auto &&side_work) { simd::forEachVector(n, hints.stream_output, step, side_work, y, x, w); });
    return next_sums;
}

// The short-row block kernels: the per-row kernels inlined into one loop (a call per row and pass had cost more
// than the row's work on rows of 16-64).
template <typename T>
__attribute__((flatten)) void blockSums(size_t rows, size_t n, const T *x, ptrdiff_t x_stride, cpu::PairSums *totals) {
    for (size_t r = 0; r < rows; ++r) totals[r] = sums(n, x + static_cast<ptrdiff_t>(r) * x_stride);
}

template <typename T, typename W>
__attribute__((flatten)) void blockApply(size_t rows, size_t n, const float *r, const T *x, ptrdiff_t x_stride,
                                         const W *w, T *y, ptrdiff_t y_stride, bool stream_y) {
    const cpu::RowHints<T> hints{stream_y};
    for (size_t i = 0; i < rows; ++i) {
        const ptrdiff_t row = static_cast<ptrdiff_t>(i);
        apply(n, r[i], x + row * x_stride, w, y + row * y_stride, hints);
    }
}

// Short rows whole (Kernels::block_rows), as LayerNorm's: each row loaded once (simd::RowBlock or RowView), the rows'
// sums of squares side by side in F32 (simd::laneSums), their rstd in F64 8 rows at a time, y from the registers. Row
// by row, the block kernels loaded each row twice and finished each row's sum and square root alone.
template <typename T, typename W, typename Block>
__attribute__((flatten)) void blockRowsWith(size_t rows, size_t n, double epsilon, const T *x, ptrdiff_t x_stride,
                                            const W *w, T *y, ptrdiff_t y_stride, double *rstd, bool stream_y,
                                            bool cached) {
    const Block block(rows, n, x, x_stride); // a RowBlock's zeros past a row's end add nothing to its sum
    const f32v square_lanes = simd::laneSums(rows, [&](size_t r) SIMD_LAMBDA_INLINE {
        f32v sum = block.value(r, 0) * block.value(r, 0);
        for (size_t j = 1; j < block.vectors; ++j) sum = simd::mulAdd(block.value(r, j), block.value(r, j), sum);
        return sum;
    });
    float scales[simd::kWidth];
    simd::forEachLaneGroup([&](auto first_tag) SIMD_LAMBDA_INLINE {
        constexpr size_t kFirst = decltype(first_tag)::value;
        const simd::f64l squares = simd::widenLanes<kFirst>(square_lanes);
        const simd::f64l r = 1.0 / simd::sqrtLanes(squares / static_cast<double>(n) + epsilon);
        const simd::f32l scale = __builtin_convertvector(r, simd::f32l);
        std::memcpy(rstd + kFirst, &r, sizeof r);
        std::memcpy(scales + kFirst, &scale, sizeof scale);
    });
    f32v w_lanes[Block::kVectorsMost];
    block.loadVector(w, w_lanes);
    for (size_t r = 0; r < rows; ++r) {
        const f32v scale = simd::splat(scales[r]);
        block.storeRow(y, y_stride, r,
                       [&](size_t j) SIMD_LAMBDA_INLINE { return block.value(r, j) * scale * w_lanes[j]; },
                       stream_y);
        block.fetchAhead(stream_y, cached, x, x_stride, rows, r); // the next group's row r loads meanwhile
    }
}

template <typename T, typename W>
void blockRows(size_t rows, size_t n, double epsilon, const T *x, ptrdiff_t x_stride, const W *w, T *y,
               ptrdiff_t y_stride, double *rstd, bool stream_y, bool cached) {
    simd::withRowBlock<T>(n, [&](auto block_tag) {
        using Block = typename decltype(block_tag)::type;
        blockRowsWith<T, W, Block>(rows, n, epsilon, x, x_stride, w, y, y_stride, rstd, stream_y, cached);
    });
}

template <typename T, typename W>
const Kernels<T, W> &table() {
    static const Kernels<T, W> table{sums<T>, apply<T, W>, blockSums<T>, blockApply<T, W>, blockRows<T, W>};
    return table;
}

} // namespace
} // namespace op::rms_norm

// This ISA's tables: CPU_ISA names a cpu::Isa value. 16-bit data reads F32 weights or weights of its own type.
// The avx512bf16 build defines only the BF16 tables (SIMD_NON_BF16_TABLES): the others are avx512's code.
namespace cpu {
using op::rms_norm::Kernels;
#if SIMD_NON_BF16_TABLES
template <>
const Kernels<float, float> &isaTable<Isa::CPU_ISA, Kernels<float, float>>() {
    return op::rms_norm::table<float, float>();
}
template <>
const Kernels<f16_t, float> &isaTable<Isa::CPU_ISA, Kernels<f16_t, float>>() {
    return op::rms_norm::table<f16_t, float>();
}
template <>
const Kernels<f16_t, f16_t> &isaTable<Isa::CPU_ISA, Kernels<f16_t, f16_t>>() {
    return op::rms_norm::table<f16_t, f16_t>();
}
#endif
template <>
const Kernels<bf16_t, float> &isaTable<Isa::CPU_ISA, Kernels<bf16_t, float>>() {
    return op::rms_norm::table<bf16_t, float>();
}
template <>
const Kernels<bf16_t, bf16_t> &isaTable<Isa::CPU_ISA, Kernels<bf16_t, bf16_t>>() {
    return op::rms_norm::table<bf16_t, bf16_t>();
}
} // namespace cpu
