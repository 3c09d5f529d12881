// Compiled once per ISA (CPU_ISA = avx512bf16, avx512, avx2 or generic, with matching flags); see devices/cpu/simd.h.
#include "layer_norm_simd.h"

#include "devices/cpu/simd.h"

namespace op::layer_norm {
namespace {

using simd::f32v;
using simd::kWidth;

// sum(term(x_j)) over one chunk of m elements: F32 lanes in two accumulators, an F32 tail, the total in F64.
template <typename T, typename VectorTerm, typename ScalarTerm>
SIMD_INLINE void chunkSums(size_t m, const T *x, VectorTerm vector_term, ScalarTerm scalar_term, double *first,
                           double *second) {
    f32v even_first{}, even_second{}, odd_first{}, odd_second{};
    size_t j = 0;
    for (; j + 2 * kWidth <= m; j += 2 * kWidth) {
        vector_term(simd::load(x + j), even_first, even_second);
        vector_term(simd::load(x + j + kWidth), odd_first, odd_second);
    }
    if (j + kWidth <= m) {
        vector_term(simd::load(x + j), even_first, even_second);
        j += kWidth;
    }
    float tail_first = 0.0f, tail_second = 0.0f;
    for (; j < m; ++j) scalar_term(cpu::toFloat(x[j]), tail_first, tail_second);
    *first = simd::sum(even_first + odd_first) + tail_first;
    *second = simd::sum(even_second + odd_second) + tail_second;
}

// sum(x - shift) and sum((x - shift)^2) over one chunk of m elements.
template <typename T>
SIMD_INLINE void centredSums(size_t m, const T *chunk, float shift, double *residual, double *squares) {
    const f32v shift_v = simd::splat(shift);
    chunkSums(
        m, chunk,
        [=](f32v xj, f32v &r, f32v &q) SIMD_LAMBDA_INLINE {
            const f32v d = xj - shift_v;
            r += d;
            q += d * d;
        },
        [=](float xj, float &r, float &q) {
            const float d = xj - shift;
            r += d;
            q += d * d;
        },
        residual, squares);
}

template <typename T>
cpu::PairSums sums(size_t n, const T *x, float row_shift) {
    cpu::PairSums total;
    for (size_t begin = 0; begin < n; begin += simd::kChunk) {
        const size_t m = n - begin < simd::kChunk ? n - begin : simd::kChunk;
        const T *chunk = x + begin;
        // One pass about an estimate of the chunk's mean, its first vector's (or, shorter, its first element):
        // sum((x - shift)^2) exceeds the centred sum by m * (shift - mean)^2, so its rounding grows by that
        // factor over the centred sum's. Where the shift lies more than one spread from the chunk's mean (rarely:
        // for normal data the first 16 elements' mean does with probability 6e-5), a second pass from L1 sums
        // about the mean the first gave, so the cancellation stays within twice the centred sum's rounding.
        float shift = m >= kWidth ? static_cast<float>(simd::sum(simd::load(chunk)) / kWidth) : cpu::toFloat(chunk[0]);
        double residual, squares;
        centredSums(m, chunk, shift, &residual, &squares);
        const double count = static_cast<double>(m);
        if (2.0 * residual * (residual / count) > squares) {
            shift = static_cast<float>(shift + residual / count);
            centredSums(m, chunk, shift, &residual, &squares);
        }
        // About the row's shift: exact differences of two floats in F64.
        const double offset = static_cast<double>(shift) - row_shift;
        total.first += count * offset + residual;
        total.second += squares + 2.0 * offset * residual + count * offset * offset;
    }
    return total;
}

template <typename T, typename W, bool kBias, bool kXhat>
void applyRow(size_t n, RowStatistics<float> row, const T *x, const W *w, const W *b, T *y, T *xhat, bool stream) {
    // (x - mean_high) * rstd - mean_low * rstd, fused where the ISA has FMA (the pass is bound by its vector
    // operations): mean_low is within half an ulp of the mean, so rounding its product apart adds next to nothing.
    const f32v mean_high = simd::splat(row.mean_high), low_scaled = simd::splat(-row.mean_low * row.rstd),
               rstd = simd::splat(row.rstd);
    // rest: b if kBias, then xhat if kXhat (written in place: forEachVector copies back what a step changes).
    auto step = [=](auto stream_tag, T *out, const T *x_at, const W *w_at, auto *...rest) SIMD_LAMBDA_INLINE {
        const f32v standardized = simd::mulAdd(simd::load(x_at) - mean_high, rstd, low_scaled);
        const auto at = std::make_tuple(rest...);
        f32v result;
        if constexpr (kBias) {
            result = simd::mulAdd(standardized, simd::load(w_at), simd::load(std::get<0>(at)));
        } else {
            result = standardized * simd::load(w_at);
        }
        if constexpr (kXhat) simd::store(std::get<kBias ? 1 : 0>(at), standardized);
        simd::put(stream_tag, out, result);
    };
    if constexpr (kBias && kXhat) {
        simd::forEachVector(n, stream, step, simd::NoSideWork{}, y, x, w, b, xhat);
    } else if constexpr (kBias) {
        simd::forEachVector(n, stream, step, simd::NoSideWork{}, y, x, w, b);
    } else if constexpr (kXhat) {
        simd::forEachVector(n, stream, step, simd::NoSideWork{}, y, x, w, xhat);
    } else {
        simd::forEachVector(n, stream, step, simd::NoSideWork{}, y, x, w);
    }
    if (stream) simd::fenceStreams();
}

template <typename T, typename W>
void apply(size_t n, RowStatistics<float> row, const T *x, const W *w, const W *b, T *y, T *xhat, bool stream) {
    if (b != nullptr) {
        return xhat != nullptr ? applyRow<T, W, true, true>(n, row, x, w, b, y, xhat, stream)
                               : applyRow<T, W, true, false>(n, row, x, w, b, y, xhat, stream);
    }
    return xhat != nullptr ? applyRow<T, W, false, true>(n, row, x, w, b, y, xhat, stream)
                           : applyRow<T, W, false, false>(n, row, x, w, b, y, xhat, stream);
}

template <typename T, typename W>
const Kernels<T, W> &table() {
    static const Kernels<T, W> table{sums<T>, apply<T, W>};
    return table;
}

} // namespace
} // namespace op::layer_norm

// This ISA's tables: CPU_ISA names a cpu::Isa value. 16-bit data reads F32 parameters or parameters of its own type.
// The avx512bf16 build defines only the BF16 tables (SIMD_NON_BF16_TABLES): the others are avx512's code.
namespace cpu {
using op::layer_norm::Kernels;
#if SIMD_NON_BF16_TABLES
template <>
const Kernels<float, float> &isaTable<Isa::CPU_ISA, Kernels<float, float>>() {
    return op::layer_norm::table<float, float>();
}
template <>
const Kernels<f16_t, float> &isaTable<Isa::CPU_ISA, Kernels<f16_t, float>>() {
    return op::layer_norm::table<f16_t, float>();
}
template <>
const Kernels<f16_t, f16_t> &isaTable<Isa::CPU_ISA, Kernels<f16_t, f16_t>>() {
    return op::layer_norm::table<f16_t, f16_t>();
}
#endif
template <>
const Kernels<bf16_t, float> &isaTable<Isa::CPU_ISA, Kernels<bf16_t, float>>() {
    return op::layer_norm::table<bf16_t, float>();
}
template <>
const Kernels<bf16_t, bf16_t> &isaTable<Isa::CPU_ISA, Kernels<bf16_t, bf16_t>>() {
    return op::layer_norm::table<bf16_t, bf16_t>();
}
} // namespace cpu
