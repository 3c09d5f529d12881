// The LayerNorm backward leaf kernels, for the files that build their tables by data type (layer_norm_backward_
// {f32,f16,bf16}_simd.cc), each compiled once per ISA (CPU_ISA = avx512bf16, avx512, avx2 or generic, with matching
// flags; see devices/cpu/simd.h). One file per data type rather than one for all five tables: those were a build's
// longest jobs (generic about 75 s, AVX2 50 s of GCC 12), one of which often ran alone at the end on two cores.
#ifndef INFINIOP_SRC_OPS_LAYER_NORM_BACKWARD_CPU_SIMD_KERNELS_H
#define INFINIOP_SRC_OPS_LAYER_NORM_BACKWARD_CPU_SIMD_KERNELS_H

#include "layer_norm_backward_simd.h"

#include "devices/cpu/simd.h"

#include <algorithm>
#include <tuple>
#include <type_traits>

namespace op::layer_norm_backward {
namespace {

using simd::f32v;

// grad_input's elements, (g - mean_g - xhat * mean_g_xhat) * rstd with g = grad_output * weight, in the row kernels
// and the block kernels alike: its multiply-adds fused by hand (simd::mulAdd), so that a row's grad_input does not
// depend on which kernels ran it (a single row takes the row kernels) through how the compiler fused each. The
// means come negated.
SIMD_INLINE f32v gradInput(f32v go, f32v weight, f32v xh, f32v minus_mean_g, f32v minus_mean_g_xhat, f32v rstd) {
    return simd::mulAdd(xh, minus_mean_g_xhat, simd::mulAdd(go, weight, minus_mean_g)) * rstd;
}

// The reduction of one row: sums of g and g*xhat with g = grad_output*weight, xhat formed from the row input. Its
// multiply-adds fused by hand (simd::mulAdd), as gradInput's: left to the compiler, a BF16 row of 100 summed
// g*xhat a few F32 roundings apart in the row kernels (a single row) and the block kernels (many), and its grad_input
// came out an ulp apart where rounding to BF16 met a tie.
// Inlined: out of line, when simd::RowSums still copied its closures in, that copy's stall took a third of the time
// of rows of 16 on AVX2. RowSums now builds them in place (its comment says why); GCC inlines this either way now.
template <bool kFromInput, typename T, typename W>
SIMD_INLINE auto rowSums(size_t n, const T *grad_output, const T *row_input, const W *weight,
                         RowStatistics<float> row) {
    return simd::RowSums(
        n,
        [&] {
            const f32v mean_v = simd::splat(row.mean), rstd_v = simd::splat(row.rstd);
            return [=](size_t j, f32v &sum_g, f32v &sum_g_xhat) SIMD_LAMBDA_INLINE {
                f32v g = simd::load(grad_output + j) * simd::load(weight + j);
                sum_g += g;
                sum_g_xhat =
                    simd::mulAdd(g, standardized<kFromInput>(simd::load(row_input + j), mean_v, rstd_v), sum_g_xhat);
            };
        },
        [&] {
            return [=](size_t j, float &sum_g, float &sum_g_xhat) {
                float g = cpu::toFloat(grad_output[j]) * cpu::toFloat(weight[j]);
                sum_g += g;
                sum_g_xhat = simd::mulAdd(g, standardized<kFromInput>(cpu::toFloat(row_input[j]), row.mean, row.rstd),
                                          sum_g_xhat);
            };
        });
}

template <bool kFromInput, typename T, typename W>
cpu::PairSums sums(size_t n, const T *grad_output, const T *row_input, const W *weight, RowStatistics<float> row) {
    return rowSums<kFromInput>(n, grad_output, row_input, weight, row).finish();
}

// The arrays if kWanted, else none: a piece of forEachVector's argument list.
template <bool kWanted, typename... Arrays>
auto arraysIf(Arrays *...arrays) {
    if constexpr (kWanted) {
        return std::make_tuple(arrays...);
    } else {
        return std::tuple<>{};
    }
}

// kWithNext: the partials also take the next row's terms (hints.next_a/next_b, read from the caches where this
// pass reduces that row), so long rows move their partials once per two rows.
// kStarts: the row is its block's first, and writes the partials (F32, or the rounded gradients P) rather than
// adding to them.
template <bool kFromInput, typename T, typename W, typename P, bool kWeight, bool kBias, bool kWithNext, bool kStarts>
cpu::PairSums applyRow(size_t n, RowStatistics<float> row, RowStatistics<float> next, float mean_g, float mean_g_xhat,
                       const T *grad_output, const T *row_input, const W *weight, T *grad_input, P *weight_partial,
                       P *bias_partial, const cpu::RowHints<T> &hints) {
    const f32v inv_std_v = simd::splat(row.rstd), minus_mean_g_v = simd::splat(-mean_g),
               minus_mean_g_xhat_v = simd::splat(-mean_g_xhat);
    const f32v mean_v = simd::splat(row.mean), next_mean_v = simd::splat(next.mean), next_rstd_v = simd::splat(next.rstd);
    // rest: the next row's grad_output and row input if kWithNext, then the wanted partials, weight's first.
    // The coefficients by value: captured by reference, AVX2 code loaded each one's address and then the vector
    // at every use (by value, 0.80-0.93x the time of BF16 and F16 rows in the caches; AVX-512 level).
    auto step = [=](auto stream, T *out, const auto *go_at, const auto *in_at, const W *weight_at,
                    auto *...rest) SIMD_LAMBDA_INLINE {
        // Every load before the first store: weight and the partials often lie a multiple of 4 KiB apart, and a
        // load behind a store to the same offset in its 4 KiB page waits for that store (4K aliasing).
        const f32v go = simd::load(go_at), xh = standardized<kFromInput>(simd::load(in_at), mean_v, inv_std_v),
                   weight_v = simd::load(weight_at);
        const auto at = std::make_tuple(rest...);
        constexpr size_t kFirstPartial = kWithNext ? 2 : 0;
        // A single row's 16-bit bias gradient is grad_output's own bits (+0.0 + go rounded back): on AVX2 the
        // rounding took 16% of this pass.
        constexpr bool kBiasOfGradOutput = kBias && kStarts && !kWithNext && std::is_same_v<P, T> &&
                                           !std::is_same_v<T, float>;
        simd::u16v bias_bits{};
        if constexpr (kBiasOfGradOutput) bias_bits = simd::zeroPlusBits(go_at);
        f32v weight_terms = go * xh, bias_terms = go;
        if constexpr (kWithNext) {
            const f32v next_go = simd::load(std::get<0>(at));
            const f32v next_xh = standardized<kFromInput>(simd::load(std::get<1>(at)), next_mean_v, next_rstd_v);
            weight_terms = weight_terms + next_go * next_xh;
            bias_terms = bias_terms + next_go;
        }
        f32v weight_sum = {}, bias_sum = {};
        if constexpr (kWeight) {
            weight_sum = (kStarts ? f32v{} : simd::load(std::get<kFirstPartial>(at))) + weight_terms;
        }
        if constexpr (kBias && !kBiasOfGradOutput) {
            bias_sum = (kStarts ? f32v{} : simd::load(std::get<kFirstPartial + kWeight>(at))) + bias_terms;
        }
        if constexpr (kWeight) simd::store(std::get<kFirstPartial>(at), weight_sum);
        if constexpr (kBiasOfGradOutput) {
            simd::storeBits(std::get<kFirstPartial + kWeight>(at), bias_bits);
        } else if constexpr (kBias) {
            simd::store(std::get<kFirstPartial + kWeight>(at), bias_sum);
        }
        simd::put(stream, out, gradInput(go, weight_v, xh, minus_mean_g_v, minus_mean_g_xhat_v, inv_std_v));
    };
    auto run = [&](auto &&side_work) {
        const auto rest = std::tuple_cat(arraysIf<kWithNext>(hints.next_a, hints.next_b),
                                         arraysIf<kWeight>(weight_partial), arraysIf<kBias>(bias_partial));
        std::apply(
            [&](auto *...rest_arrays) {
                simd::forEachVector(n, hints.stream_output, step, side_work, grad_input, grad_output, row_input,
                                    weight, rest_arrays...);
            },
            rest);
    };
    const cpu::PairSums next_sums = simd::passAlongside(
        hints, [&](const T *next_grad_output, const T *next_row_input) {
            return rowSums<kFromInput>(n, next_grad_output, next_row_input, weight, next);
        }, run);
    return next_sums;
}

template <bool kFromInput, typename T, typename W>
cpu::PairSums apply(size_t n, RowStatistics<float> row, RowStatistics<float> next, float mean_g, float mean_g_xhat,
                    const T *grad_output, const T *row_input, const W *weight, T *grad_input,
                    cpu::GradientTerms<float, W> weight_terms, cpu::GradientTerms<float, W> bias_terms,
                    bool partials_with_next, bool starts, const cpu::RowHints<T> &hints) {
    // P: where the terms go, F32 partials or the rounded gradients.
    auto run = [&](auto with_next, auto starts_tag, auto *weight_to, auto *bias_to) {
        constexpr bool kWithNext = decltype(with_next)::value, kStarts = decltype(starts_tag)::value;
        using P = std::remove_pointer_t<decltype(weight_to)>;
        auto call = [&](auto kernel) {
            return kernel(n, row, next, mean_g, mean_g_xhat, grad_output, row_input, weight, grad_input, weight_to,
                          bias_to, hints);
        };
        if (weight_to != nullptr && bias_to != nullptr) {
            return call(applyRow<kFromInput, T, W, P, true, true, kWithNext, kStarts>);
        }
        if (weight_to != nullptr) return call(applyRow<kFromInput, T, W, P, true, false, kWithNext, kStarts>);
        if (bias_to != nullptr) return call(applyRow<kFromInput, T, W, P, false, true, kWithNext, kStarts>);
        // No partials: nothing to take from the next row, nothing to start.
        return call(applyRow<kFromInput, T, W, P, false, false, false, false>);
    };
    if (weight_terms.gradient != nullptr || bias_terms.gradient != nullptr) { // a single row: never with_next
        return run(std::false_type{}, std::true_type{}, weight_terms.gradient, bias_terms.gradient);
    }
    float *weight_partial = weight_terms.partial, *bias_partial = bias_terms.partial;
    if (partials_with_next) {
        return starts ? run(std::true_type{}, std::true_type{}, weight_partial, bias_partial)
                      : run(std::true_type{}, std::false_type{}, weight_partial, bias_partial);
    }
    return starts ? run(std::false_type{}, std::true_type{}, weight_partial, bias_partial)
                  : run(std::false_type{}, std::false_type{}, weight_partial, bias_partial);
}

// A block's short rows go by groups that stay in L1: first every row's sums, which are independent and overlap
// in the core (each waited for the last one's when a row's sums and pass went together), then the elementwise
// pass. Rows of up to kColumnsDownTheGroup elements take it a vector column at a time down the group's rows,
// adding their weight-gradient terms in registers and to the partials once per group (on rows of 16, updating
// them per row chained every row to the last one's store). Longer rows go row by row: written a column at a
// time, rows of 256 from DRAM took 1.36x (F32) and 1.68x (BF16) as long as row by row, whose stores the
// prefetchers follow.
constexpr size_t kColumnsDownTheGroup = 64;
template <bool kFromInput, typename T, typename W, bool kWeight, bool kBias>
void blockRowsWith(size_t rows, size_t n, const T *grad_output, ptrdiff_t grad_output_stride, const T *row_input,
                   ptrdiff_t row_input_stride, T *grad_input, ptrdiff_t grad_input_stride, const W *weight,
                   const RowStatistics<float> *statistics, float *weight_partial, float *bias_partial, bool starts,
                   bool stream) {
    constexpr size_t kMostRows = 16, kGroupBytes = 8192; // the group's rows of each input
    static_assert(kMostRows <= simd::kWidth, "finishRows takes at most kWidth rows");
    const size_t group = std::clamp<size_t>(kGroupBytes / (n * sizeof(T)), 1, kMostRows);
    const double inverse_n = 1.0 / static_cast<double>(n);
    for (size_t first = 0; first < rows; first += group) {
        const size_t count = rows - first < group ? rows - first : group;
        const T *go_rows = grad_output + static_cast<ptrdiff_t>(first) * grad_output_stride;
        const T *in_rows = row_input + static_cast<ptrdiff_t>(first) * row_input_stride;
        T *gi_rows = grad_input + static_cast<ptrdiff_t>(first) * grad_input_stride;
        const RowStatistics<float> *row_statistics = statistics + first;
        auto rowSumsOf = [&](size_t r) SIMD_LAMBDA_INLINE {
            const ptrdiff_t row = static_cast<ptrdiff_t>(r);
            return rowSums<kFromInput>(n, go_rows + row * grad_output_stride, in_rows + row * row_input_stride,
                                       weight, row_statistics[r]);
        };
        cpu::PairSums totals[kMostRows];
        if (n <= simd::kWidth) {
            // Rows of one vector: their sums across lanes side by side (simd::finishRows, the same bits), where
            // each row's own was a chain of dependent shuffles (F32 rows of 16: 0.85 of the time back to back, 0.91
            // after a 256 MiB copy; rows of 128 took 1.00-1.04).
            simd::BlockLanes lanes;
            for (size_t r = 0; r < count; ++r) lanes.set(r, rowSumsOf(r).lanes());
            simd::finishRows(lanes, count, totals);
        } else {
            for (size_t r = 0; r < count; ++r) totals[r] = rowSumsOf(r).finish();
        }
        float mean_g[kMostRows], mean_g_xhat[kMostRows];
        for (size_t r = 0; r < count; ++r) {
            mean_g[r] = static_cast<float>(totals[r].first * inverse_n);
            mean_g_xhat[r] = static_cast<float>(totals[r].second * inverse_n);
        }
        // The terms of row r's vector at j: grad_input written, the weight-gradient terms added to the two sums.
        auto step = [&](size_t r, size_t j, size_t lanes, f32v weight_v, f32v &weight_terms,
                        f32v &bias_terms) SIMD_LAMBDA_INLINE {
            const ptrdiff_t row = static_cast<ptrdiff_t>(r);
            const RowStatistics<float> statistics_r = row_statistics[r];
            const f32v rstd_v = simd::splat(statistics_r.rstd);
            const f32v go = simd::loadPart(go_rows + row * grad_output_stride + j, lanes);
            const f32v xh = standardized<kFromInput>(simd::loadPart(in_rows + row * row_input_stride + j, lanes),
                                                     simd::splat(statistics_r.mean), rstd_v);
            weight_terms += go * xh;
            bias_terms += go;
            const f32v gi =
                gradInput(go, weight_v, xh, simd::splat(-mean_g[r]), simd::splat(-mean_g_xhat[r]), rstd_v);
            T *gi_at = gi_rows + row * grad_input_stride + j;
            // Streamed rows are whole vectors, aligned (the caller's RowPlan::streams). A runtime test: as a template
            // parameter (2026-12-07, AVX-512 Xeon, A/B in alternating processes) BF16 16384x128 took 0.91 of the time
            // in the xhat form but 1.06x as long from the input, F32 and AVX2 level.
            if (stream) {
                simd::storeStream(gi_at, gi);
            } else {
                simd::storePart(gi_at, gi, lanes);
            }
        };
        // The terms into the partials of the elements at j (written where `writes`).
        auto addTerms = [&](size_t j, size_t lanes, f32v weight_terms, f32v bias_terms, bool writes) SIMD_LAMBDA_INLINE {
            if constexpr (kWeight) {
                const f32v before = writes ? f32v{} : simd::loadPart(weight_partial + j, lanes);
                simd::storePart(weight_partial + j, before + weight_terms, lanes);
            }
            if constexpr (kBias) {
                const f32v before = writes ? f32v{} : simd::loadPart(bias_partial + j, lanes);
                simd::storePart(bias_partial + j, before + bias_terms, lanes);
            }
        };
        const bool writes_partials = starts && first == 0;
        if (n <= kColumnsDownTheGroup) {
            for (size_t j = 0; j < n; j += simd::kWidth) {
                const size_t lanes = n - j < simd::kWidth ? n - j : simd::kWidth;
                const f32v weight_v = simd::loadPart(weight + j, lanes);
                f32v weight_terms{}, bias_terms{};
                for (size_t r = 0; r < count; ++r) step(r, j, lanes, weight_v, weight_terms, bias_terms);
                addTerms(j, lanes, weight_terms, bias_terms, writes_partials);
            }
        } else {
            for (size_t r = 0; r < count; ++r) {
                for (size_t j = 0; j < n; j += simd::kWidth) {
                    const size_t lanes = n - j < simd::kWidth ? n - j : simd::kWidth;
                    f32v weight_terms{}, bias_terms{};
                    step(r, j, lanes, simd::loadPart(weight + j, lanes), weight_terms, bias_terms);
                    addTerms(j, lanes, weight_terms, bias_terms, writes_partials && r == 0);
                }
            }
        }
    }
}

template <bool kFromInput, typename T, typename W>
void blockRows(size_t rows, size_t n, const T *grad_output, ptrdiff_t grad_output_stride, const T *row_input,
          ptrdiff_t row_input_stride, T *grad_input, ptrdiff_t grad_input_stride, const W *weight,
          const RowStatistics<float> *statistics, float *weight_partial, float *bias_partial, bool starts,
          bool stream) {
    auto run = [&](auto kernel) {
        kernel(rows, n, grad_output, grad_output_stride, row_input, row_input_stride, grad_input, grad_input_stride,
               weight, statistics, weight_partial, bias_partial, starts, stream);
    };
    if (weight_partial != nullptr && bias_partial != nullptr) return run(blockRowsWith<kFromInput, T, W, true, true>);
    if (weight_partial != nullptr) return run(blockRowsWith<kFromInput, T, W, true, false>);
    if (bias_partial != nullptr) return run(blockRowsWith<kFromInput, T, W, false, true>);
    run(blockRowsWith<kFromInput, T, W, false, false>);
}

template <typename T, typename W>
const Kernels<T, W> &table() {
    static const Kernels<T, W> table{{sums<false, T, W>, apply<false, T, W>, blockRows<false, T, W>},
                                     {sums<true, T, W>, apply<true, T, W>, blockRows<true, T, W>}};
    return table;
}

} // namespace
} // namespace op::layer_norm_backward

// LAYER_NORM_BACKWARD_ISA_TABLE(T, W) defines this ISA's table of data T with weights W (16-bit data reads F32
// weights or weights of its own type): CPU_ISA names a cpu::Isa value. Used inside namespace cpu.
#define LAYER_NORM_BACKWARD_ISA_TABLE(T, W)                                                                            \
    template <>                                                                                                        \
    const op::layer_norm_backward::Kernels<T, W> &isaTable<Isa::CPU_ISA, op::layer_norm_backward::Kernels<T, W>>() {   \
        return op::layer_norm_backward::table<T, W>();                                                                 \
    }

#endif
