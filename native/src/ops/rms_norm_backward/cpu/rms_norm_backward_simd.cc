// Compiled once per ISA (CPU_ISA = avx512bf16, avx512, avx2 or generic, with matching flags); see devices/cpu/simd.h.
#include "rms_norm_backward_simd.h"

#include "devices/cpu/simd.h"

#include <type_traits>

namespace op::rms_norm_backward {
namespace {

using simd::f32v;

// The reduction of one row: sums of x^2 and grad_y*w*x, multiply-adds fused by hand (simd::mulAdd), so that the row
// and block kernels, into which this is inlined, sum alike whatever the compiler would fuse in each.
template <typename T, typename W>
SIMD_INLINE auto rowSums(size_t n, const T *grad_y, const T *x, const W *w) {
    return simd::RowSums(
        n,
        [&] {
            return [=](size_t j, f32v &sum_squares, f32v &sum_gwx) SIMD_LAMBDA_INLINE {
                f32v xj = simd::load(x + j);
                sum_squares = simd::mulAdd(xj, xj, sum_squares);
                sum_gwx = simd::mulAdd(simd::load(grad_y + j) * simd::load(w + j), xj, sum_gwx);
            };
        },
        [&] {
            return [=](size_t j, float &sum_squares, float &sum_gwx) {
                float xj = cpu::toFloat(x[j]);
                sum_squares = simd::mulAdd(xj, xj, sum_squares);
                sum_gwx = simd::mulAdd(cpu::toFloat(grad_y[j]) * cpu::toFloat(w[j]), xj, sum_gwx);
            };
        });
}

template <typename T, typename W>
cpu::PairSums sums(size_t n, const T *grad_y, const T *x, const W *w) {
    return rowSums(n, grad_y, x, w).finish();
}

// The elementwise pass; kStarts: the row is its block's first, and writes the partial (F32, or the rounded
// gradient itself) rather than adding to it.
template <bool kStarts, typename T, typename W, typename P, typename SideWork>
void applyPass(size_t n, float r, float x_coef, const T *grad_y, const T *x, const W *w, T *grad_x, P *partial,
               bool stream_output, SideWork &&side_work) {
    const f32v r_v = simd::splat(r), x_coef_v = simd::splat(x_coef);
    // partial_at: grad_w's partial, if wanted. The coefficients by value, as in LayerNorm's step.
    auto step = [=](auto stream, T *out, const auto *gy_at, const auto *x_at, const W *w_at,
                    auto *...partial_at) SIMD_LAMBDA_INLINE {
        // Every load before the first store: w and the partial often lie a multiple of 4 KiB apart, and a load
        // behind a store to the same offset in its 4 KiB page waits for that store (4K aliasing).
        const f32v gy = simd::load(gy_at), xj = simd::load(x_at), wj = simd::load(w_at);
        ((simd::store(partial_at, (kStarts ? f32v{} : simd::load(partial_at)) + gy * xj * r_v)), ...);
        simd::put(stream, out, r_v * gy * wj - x_coef_v * xj);
    };
    if (partial == nullptr) {
        simd::forEachVector(n, stream_output, step, side_work, grad_x, grad_y, x, w);
    } else {
        simd::forEachVector(n, stream_output, step, side_work, grad_x, grad_y, x, w, partial);
    }
}

template <typename T, typename W>
cpu::PairSums apply(size_t n, float r, float x_coef, const T *grad_y, const T *x, const W *w, T *grad_x,
                    cpu::GradientTerms<float, W> grad_w_terms, bool starts, const cpu::RowHints<T> &hints) {
    auto run = [&](auto &&side_work) {
        if (grad_w_terms.gradient != nullptr) {
            applyPass<true>(n, r, x_coef, grad_y, x, w, grad_x, grad_w_terms.gradient, hints.stream_output,
                            side_work);
        } else if (starts) {
            applyPass<true>(n, r, x_coef, grad_y, x, w, grad_x, grad_w_terms.partial, hints.stream_output, side_work);
        } else {
            applyPass<false>(n, r, x_coef, grad_y, x, w, grad_x, grad_w_terms.partial, hints.stream_output,
                             side_work);
        }
    };
    const cpu::PairSums next_sums = simd::passAlongside(
        hints, [&](const T *next_grad_y, const T *next_x) { return rowSums(n, next_grad_y, next_x, w); }, run);
    return next_sums;
}

// The short-row block kernels: the per-row kernels inlined into one loop (a call per row and pass had cost more
// than the row's work on rows of 16-64).
template <typename T, typename W>
__attribute__((flatten)) void blockSums(size_t rows, size_t n, const T *grad_y, ptrdiff_t grad_y_stride, const T *x,
                                        ptrdiff_t x_stride, const W *w, cpu::PairSums *totals) {
    for (size_t i = 0; i < rows; ++i) {
        const ptrdiff_t row = static_cast<ptrdiff_t>(i);
        totals[i] = sums(n, grad_y + row * grad_y_stride, x + row * x_stride, w);
    }
}

template <typename T, typename W>
__attribute__((flatten)) void blockApply(size_t rows, size_t n, const float *r, const float *x_coef,
                                         const T *grad_y, ptrdiff_t grad_y_stride, const T *x, ptrdiff_t x_stride,
                                         const W *w, T *grad_x, ptrdiff_t grad_x_stride, float *partial,
                                         bool starts, bool stream) {
    for (size_t i = 0; i < rows; ++i) {
        const ptrdiff_t row = static_cast<ptrdiff_t>(i);
        auto pass = [&](auto starts_tag) {
            applyPass<decltype(starts_tag)::value>(n, r[i], x_coef[i], grad_y + row * grad_y_stride,
                                                   x + row * x_stride, w, grad_x + row * grad_x_stride, partial,
                                                   stream, simd::NoSideWork{});
        };
        if (starts && i == 0) {
            pass(std::true_type{});
        } else {
            pass(std::false_type{});
        }
    }
}

template <typename T, typename W>
const Kernels<T, W> &table() {
    static const Kernels<T, W> table{sums<T, W>, apply<T, W>, blockSums<T, W>, blockApply<T, W>};
    return table;
}

} // namespace
} // namespace op::rms_norm_backward

// This ISA's tables: CPU_ISA names a cpu::Isa value. 16-bit data reads F32 weights or weights of its own type.
namespace cpu {
using op::rms_norm_backward::Kernels;
#define RMS_NORM_BACKWARD_ISA_TABLE(T, W)                                                                              \
    template <>                                                                                                        \
    const Kernels<T, W> &isaTable<Isa::CPU_ISA, Kernels<T, W>>() {                                                     \
        return op::rms_norm_backward::table<T, W>();                                                                   \
    }
#if SIMD_NON_BF16_TABLES
RMS_NORM_BACKWARD_ISA_TABLE(float, float)
RMS_NORM_BACKWARD_ISA_TABLE(f16_t, float)
RMS_NORM_BACKWARD_ISA_TABLE(f16_t, f16_t)
#endif
RMS_NORM_BACKWARD_ISA_TABLE(bf16_t, float)
RMS_NORM_BACKWARD_ISA_TABLE(bf16_t, bf16_t)
#undef RMS_NORM_BACKWARD_ISA_TABLE
} // namespace cpu
