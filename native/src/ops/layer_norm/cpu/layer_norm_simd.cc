// Compiled once per ISA (CPU_ISA = avx512bf16, avx512, avx2 or generic, with matching flags); see devices/cpu/simd.h.
#include "layer_norm_simd.h"

#include "devices/cpu/simd.h"

#include <cmath>
#include <cstring>
#include <type_traits>

namespace op::layer_norm {
namespace {

using simd::f32v;
using simd::kWidth;

// sum(term(x_j)) over one chunk of m elements, before the sum across lanes: F32 lanes in two accumulators, an F32
// tail.
template <typename T, typename VectorTerm, typename ScalarTerm>
SIMD_INLINE simd::RowLanes chunkLanes(size_t m, const T *x, VectorTerm vector_term, ScalarTerm scalar_term) {
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
    return {even_first + odd_first, even_second + odd_second, tail_first, tail_second};
}

// sum(x - shift) and sum((x - shift)^2) over one chunk of m elements, before the sum across lanes; the squares'
// multiply-adds fused by hand (simd::mulAdd), so that the row and block kernels that inline this sum alike.
template <typename T>
SIMD_INLINE simd::RowLanes centredLanes(size_t m, const T *chunk, float shift) {
    const f32v shift_v = simd::splat(shift);
    return chunkLanes(
        m, chunk,
        [=](f32v xj, f32v &r, f32v &q) SIMD_LAMBDA_INLINE {
            const f32v d = xj - shift_v;
            r += d;
            q = simd::mulAdd(d, d, q);
        },
        [=](float xj, float &r, float &q) {
            const float d = xj - shift;
            r += d;
            q = simd::mulAdd(d, d, q);
        });
}

// A vector's lanes summed: an F32 tree (on short rows the chains of sums across lanes bound a row's time; each lane
// holds a sum of many elements already, so the tree's four roundings add little to theirs), or where its F32 total
// overflows (finite lanes whose sum is not: x of 1e17-1e18 in a chunk of 4096), simd::sum's F64 tree.
SIMD_INLINE double acrossLanes(f32v v) {
    const float total = simd::laneSum(v);
    return std::isfinite(total) ? static_cast<double>(total) : simd::sum(v);
}

// The same summed across lanes, carried into F64 with the tail.
template <typename T>
SIMD_INLINE void centredSums(size_t m, const T *chunk, float shift, double *residual, double *squares) {
    const simd::RowLanes lanes = centredLanes(m, chunk, shift);
    *residual = acrossLanes(lanes.first) + lanes.tail_first;
    *squares = acrossLanes(lanes.second) + lanes.tail_second;
}

#if defined(__AVX512BF16__)
// sum(x) and sum(x^2) of a BF16 chunk about 0 by the dot-product instruction, where that is accurate enough: true
// then. vdpbf16ps multiplies BF16 pairs exactly into F32 and adds them, so both sums cost two instructions per 32
// elements, with no widening and no shift (the shifted pass takes five per 16, and bound the 16-bit short rows).
// Kept only where:
//  - mean^2 < variance: sums about 0 round relative to sum(x^2), not to the centred sum; sum(x^2) is then under
//    twice the centred sum, so the variance's rounding stays within twice the shifted pass's;
//  - sum(x^2) >= m * 2^-102: the instruction flushes subnormal products (each under 2^-126) to zero, which then
//    costs less than F32 rounding (a row of values near 1e-19 lost 4e-5 of its variance);
//  - the sums are finite.
// Elsewhere (also a constant chunk) the chunk goes to the shifted pass, which reads it again from L1.
SIMD_INLINE bool dotSums(size_t m, const cpu::bf16_t *chunk, double *sum, double *squares) {
    const __m512bh ones = (__m512bh)_mm512_set1_epi16(0x3f80);
    __m512 sum_even = _mm512_setzero_ps(), sum_odd = sum_even, squares_even = sum_even, squares_odd = sum_even;
    auto add = [&](__m512bh even, __m512bh odd) SIMD_LAMBDA_INLINE {
        sum_even = _mm512_dpbf16_ps(sum_even, even, ones);
        squares_even = _mm512_dpbf16_ps(squares_even, even, even);
        sum_odd = _mm512_dpbf16_ps(sum_odd, odd, ones);
        squares_odd = _mm512_dpbf16_ps(squares_odd, odd, odd);
    };
    size_t j = 0;
    for (; j + 64 <= m; j += 64) {
        add((__m512bh)_mm512_loadu_si512(chunk + j), (__m512bh)_mm512_loadu_si512(chunk + j + 32));
    }
    if (j < m) { // masked loads: the elements past the chunk read as +0 and are never touched
        const size_t rest = m - j;
        const __mmask32 even = rest >= 32 ? ~__mmask32{0} : (__mmask32{1} << rest) - 1;
        const __mmask32 odd = rest > 32 ? (__mmask32{1} << (rest - 32)) - 1 : 0;
        add((__m512bh)_mm512_maskz_loadu_epi16(even, chunk + j),
            (__m512bh)_mm512_maskz_loadu_epi16(odd, chunk + j + 32));
    }
    *sum = simd::sum((f32v)(sum_even + sum_odd));
    *squares = simd::sum((f32v)(squares_even + squares_odd));
    const double centred = *squares - *sum * (*sum / static_cast<double>(m));
    return std::isfinite(*squares) && *squares >= static_cast<double>(m) * 0x1p-102 && *squares < 2.0 * centred;
}
#endif

// Other types and ISAs: always the shifted pass.
template <typename T>
SIMD_INLINE bool dotSums(size_t, const T *, double *, double *) {
    return false;
}

// Where the sums about `shift` show it more than one spread from the chunk's mean (rarely: for normal data the first
// 16 elements' mean does with probability 6e-5), a second pass from L1 sums about the mean the first gave, so the
// cancellation stays within twice the centred sum's rounding.
template <typename T>
SIMD_INLINE void recentre(size_t m, const T *chunk, float &shift, double &residual, double &squares) {
    if (2.0 * residual * residual > squares * static_cast<double>(m)) { // no division: it is on each row's chain
        shift = static_cast<float>(shift + residual / static_cast<double>(m));
        centredSums(m, chunk, shift, &residual, &squares);
    }
}

// A chunk's sums about `shift` added to the row's total about row_shift: exact differences of two floats in F64.
SIMD_INLINE void addChunk(size_t m, float shift, double residual, double squares, float row_shift,
                          cpu::PairSums &total) {
    const double count = static_cast<double>(m), offset = static_cast<double>(shift) - row_shift;
    total.first += count * offset + residual;
    total.second += squares + 2.0 * offset * residual + count * offset * offset;
}

// The mean of a chunk's first vector, the shift of its sums: an F32 tree (the centred pass waits for it, and it is
// only an estimate of the mean), of the values scaled first so that no partial sum of finite values overflows.
template <typename T>
SIMD_INLINE float firstVectorMean(const T *chunk) {
    return simd::laneSum(simd::load(chunk) * simd::splat(1.0f / kWidth));
}

template <typename T>
cpu::PairSums sums(size_t n, const T *x, float row_shift) {
    cpu::PairSums total;
    for (size_t begin = 0; begin < n; begin += simd::kChunk) {
        const size_t m = n - begin < simd::kChunk ? n - begin : simd::kChunk;
        const T *chunk = x + begin;
        float shift = 0.0f; // where dotSums gave the sums: about 0
        double residual, squares;
        if (!dotSums(m, chunk, &residual, &squares)) {
            // One pass about an estimate of the chunk's mean, its first vector's (or, shorter, its first element):
            // sum((x - shift)^2) exceeds the centred sum by m * (shift - mean)^2, so its rounding grows by that
            // factor over the centred sum's (recentre bounds it).
            shift = m >= kWidth ? firstVectorMean(chunk) : cpu::toFloat(chunk[0]);
            centredSums(m, chunk, shift, &residual, &squares);
            recentre(m, chunk, shift, residual, squares);
        }
        addChunk(m, shift, residual, squares, row_shift, total);
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
        if constexpr (kXhat) simd::put(stream_tag, std::get<kBias ? 1 : 0>(at), standardized);
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
}

template <typename T, typename W>
void apply(size_t n, RowStatistics<float> row, const T *x, const W *w, const W *b, T *y, T *xhat, bool stream) {
    // xhat's stores stream only as aligned as y's, whose alignment the pass finds.
    const uintptr_t apart = reinterpret_cast<uintptr_t>(xhat) - reinterpret_cast<uintptr_t>(y);
    stream = stream && (xhat == nullptr || apart % simd::kStreamAlignment<T> == 0);
    if (b != nullptr) {
        return xhat != nullptr ? applyRow<T, W, true, true>(n, row, x, w, b, y, xhat, stream)
                               : applyRow<T, W, true, false>(n, row, x, w, b, y, xhat, stream);
    }
    return xhat != nullptr ? applyRow<T, W, false, true>(n, row, x, w, b, y, xhat, stream)
                           : applyRow<T, W, false, false>(n, row, x, w, b, y, xhat, stream);
}

// The short-row block kernels: the per-row kernels inlined into one loop (a call per row and pass had cost more
// than the row's work on rows of 16-64).
template <typename T>
__attribute__((flatten)) void blockSums(size_t rows, size_t n, const T *x, ptrdiff_t x_stride, cpu::PairSums *totals) {
    for (size_t r = 0; r < rows; ++r) {
        const T *row = x + static_cast<ptrdiff_t>(r) * x_stride;
        totals[r] = sums(n, row, cpu::toFloat(row[0]));
    }
}

template <typename T, typename W>
__attribute__((flatten)) void blockApply(size_t rows, size_t n, const RowStatistics<float> *statistics, const T *x,
                                         ptrdiff_t x_stride, const W *w, const W *b, T *y, ptrdiff_t y_stride,
                                         T *xhat, ptrdiff_t xhat_stride, bool stream) {
    for (size_t r = 0; r < rows; ++r) {
        const ptrdiff_t row = static_cast<ptrdiff_t>(r);
        apply(n, statistics[r], x + row * x_stride, w, b, y + row * y_stride,
              xhat != nullptr ? xhat + row * xhat_stride : nullptr, stream);
    }
}

// Short rows whole (Kernels::block_rows): the steps of sums(), of the caller's statistics and of apply(), each row
// loaded once (a simd::RowBlock; F32 rows of whole vectors read in place, simd::RowView), the rows' per-row steps side
// by side. Row by row, the block kernels spent most of a row of 16's time in chains of dependent steps (sums across
// lanes, F64 division and square root) and loaded each row twice. Sums across a row's lanes are F32 trees here
// (simd::laneSums), carried into F64 per row: the same F32-then-F64 scheme as sums(), whose F32 lanes each add many
// elements of a longer row. BF16 takes the shifted pass too: dotSums pays off only over many vectors a row.
template <typename T, typename W, bool kBias, bool kXhat, typename Block>
__attribute__((flatten)) void blockRowsWith(size_t rows, size_t n, double epsilon, const T *x, ptrdiff_t x_stride,
                                            const W *w, const W *b, T *y, ptrdiff_t y_stride, T *xhat,
                                            ptrdiff_t xhat_stride, BlockMoments *moments, bool stream, bool cached) {
    const Block block(rows, n, x, x_stride);
    // A constant 1 where the block holds one vector a row: no loop over a row's vectors is left to reach a second.
    const size_t vectors = Block::kVectorsMost == 1 ? 1 : block.vectors, last = block.last;
    float row_shifts[kWidth] = {}; // each row's first element, about which its statistics are formed
    for (size_t r = 0; r < rows; ++r) row_shifts[r] = cpu::toFloat(x[static_cast<ptrdiff_t>(r) * x_stride]);
    // sums()'s shift: an estimate of the mean, the first vector's, or, shorter, the first element.
    float shifts[kWidth];
    if (n >= kWidth) {
        simd::store(shifts, simd::laneSums(rows, [&](size_t r) SIMD_LAMBDA_INLINE { return block.value(r, 0); }) *
                                simd::splat(1.0f / kWidth));
    } else {
        std::memcpy(shifts, row_shifts, sizeof shifts);
    }
    // The centred values' sums in F32 lanes, then across them.
    auto centred = [&](size_t r, size_t j) SIMD_LAMBDA_INLINE {
        const f32v d = block.value(r, j) - simd::splat(shifts[r]);
        return j + 1 < vectors ? d : simd::keepLanes(d, last);
    };
    auto residualLanes = [&](size_t r) SIMD_LAMBDA_INLINE {
        f32v sum = centred(r, 0);
        for (size_t j = 1; j < vectors; ++j) sum += centred(r, j);
        return sum;
    };
    auto squareLanes = [&](size_t r) SIMD_LAMBDA_INLINE {
        f32v d = centred(r, 0), sum = d * d;
        for (size_t j = 1; j < vectors; ++j) {
            d = centred(r, j);
            sum = simd::mulAdd(d, d, sum);
        }
        return sum;
    };
    const f32v residual_lanes = simd::laneSums(rows, residualLanes), square_lanes = simd::laneSums(rows, squareLanes);
    const f32v shift_lanes = simd::load(shifts), row_shift_lanes = simd::load(row_shifts);
    float mean_high[kWidth], rstd[kWidth], low_scaled[kWidth];
    const double count = static_cast<double>(n), inverse_dim = 1.0 / count;
    simd::forEachLaneGroup([&](auto first_tag) SIMD_LAMBDA_INLINE {
        constexpr size_t kFirst = decltype(first_tag)::value;
        using simd::f64l;
        f64l residual = simd::widenLanes<kFirst>(residual_lanes), square = simd::widenLanes<kFirst>(square_lanes),
             shift = simd::widenLanes<kFirst>(shift_lanes);
        // recentre(): rows whose shift lay more than a spread from their mean (rarely), summed again about it. Lane by
        // lane through arrays: indexed in place, the vectors would live on the stack on the common path too.
        unsigned far = simd::lanesAbove(2.0 * residual * residual, square * count);
        if (far != 0) {
            double residual_of[simd::kF64Lanes], square_of[simd::kF64Lanes], shift_of[simd::kF64Lanes];
            std::memcpy(residual_of, &residual, sizeof residual);
            std::memcpy(square_of, &square, sizeof square);
            std::memcpy(shift_of, &shift, sizeof shift);
            for (; far != 0; far &= far - 1) {
                const size_t i = static_cast<size_t>(__builtin_ctz(far)), r = kFirst + i;
                if (r >= rows) break;
                shifts[r] = static_cast<float>(shifts[r] + residual_of[i] / count);
                residual_of[i] = simd::sum(residualLanes(r));
                square_of[i] = simd::sum(squareLanes(r));
                shift_of[i] = shifts[r];
            }
            std::memcpy(&residual, residual_of, sizeof residual);
            std::memcpy(&square, square_of, sizeof square);
            std::memcpy(&shift, shift_of, sizeof shift);
        }
        // addChunk() about the row's first element, then the caller's statistics (CpuDescriptor::run).
        const f64l row_shift = simd::widenLanes<kFirst>(row_shift_lanes), offset = shift - row_shift;
        const f64l first = count * offset + residual;
        const f64l second = square + 2.0 * offset * residual + count * offset * offset;
        const f64l mean_offset = first * inverse_dim, mean_of_squares = second * inverse_dim;
        f64l variance = mean_of_squares - mean_offset * mean_offset; // biasedVariance(): below 0 made 0, NaN kept
        variance = variance < 0.0 ? f64l{} : variance;
        const f64l variance_eps = variance + epsilon, rstd_lanes = 1.0 / simd::sqrtLanes(variance_eps);
        const f64l mean = row_shift + mean_offset;
        std::memcpy(moments->mean + kFirst, &mean, sizeof mean);
        std::memcpy(moments->variance_eps + kFirst, &variance_eps, sizeof variance_eps);
        std::memcpy(moments->rstd + kFirst, &rstd_lanes, sizeof rstd_lanes);
        // RowStatistics<float> as the caller splits them.
        using simd::f32l;
        const f32l high = __builtin_convertvector(mean, f32l), rstd_f32 = __builtin_convertvector(rstd_lanes, f32l);
        const f32l low = __builtin_convertvector(mean - __builtin_convertvector(high, f64l), f32l);
        const f32l scaled = -low * rstd_f32;
        std::memcpy(mean_high + kFirst, &high, sizeof high);
        std::memcpy(rstd + kFirst, &rstd_f32, sizeof rstd_f32);
        std::memcpy(low_scaled + kFirst, &scaled, sizeof scaled);
    });
    // apply(): y = xhat * w + b.
    f32v w_lanes[Block::kVectorsMost], b_lanes[Block::kVectorsMost] = {};
    block.loadVector(w, w_lanes);
    if constexpr (kBias) block.loadVector(b, b_lanes);
    for (size_t r = 0; r < rows; ++r) {
        const f32v high = simd::splat(mean_high[r]), scale = simd::splat(rstd[r]), low = simd::splat(low_scaled[r]);
        auto standardized = [&](size_t j) SIMD_LAMBDA_INLINE {
            return simd::mulAdd(block.value(r, j) - high, scale, low);
        };
        if constexpr (kXhat) block.storeRow(xhat, xhat_stride, r, standardized, stream);
        block.storeRow(y, y_stride, r, [&](size_t j) SIMD_LAMBDA_INLINE {
            return kBias ? simd::mulAdd(standardized(j), w_lanes[j], b_lanes[j]) : standardized(j) * w_lanes[j];
        }, stream);
        block.fetchAhead(stream, cached, x, x_stride, rows, r); // the next group's row r loads meanwhile
    }
}

template <typename T, typename W>
void blockRows(size_t rows, size_t n, double epsilon, const T *x, ptrdiff_t x_stride, const W *w, const W *b, T *y,
               ptrdiff_t y_stride, T *xhat, ptrdiff_t xhat_stride, BlockMoments *moments, bool stream, bool cached) {
    simd::withRowBlock<T>(n, [&](auto block_tag) {
        auto run = [&](auto bias, auto with_xhat) {
            using Block = typename decltype(block_tag)::type;
            blockRowsWith<T, W, decltype(bias)::value, decltype(with_xhat)::value, Block>(
                rows, n, epsilon, x, x_stride, w, b, y, y_stride, xhat, xhat_stride, moments, stream, cached);
        };
        if (b != nullptr) {
            return xhat != nullptr ? run(std::true_type{}, std::true_type{}) : run(std::true_type{}, std::false_type{});
        }
        return xhat != nullptr ? run(std::false_type{}, std::true_type{}) : run(std::false_type{}, std::false_type{});
    });
}

template <typename T, typename W>
const Kernels<T, W> &table() {
    static const Kernels<T, W> table{sums<T>, apply<T, W>, blockSums<T>, blockApply<T, W>, blockRows<T, W>};
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
