// The LayerNorm backward leaf kernels, for the files that build their tables by data type (layer_norm_backward_
// {f32,f16,bf16}_simd.cc), each compiled once per ISA (CPU_ISA = avx512bf16, avx512, avx2 or generic, with matching
// flags; see devices/cpu/simd.h). One file per data type rather than one for all five tables: those were a build's
// longest jobs (generic about 75 s, AVX2 50 s of GCC 12), one of which often ran alone at the end on two cores.
#ifndef INFINIOP_SRC_OPS_LAYER_NORM_BACKWARD_CPU_SIMD_KERNELS_H
#define INFINIOP_SRC_OPS_LAYER_NORM_BACKWARD_CPU_SIMD_KERNELS_H

#include "layer_norm_backward_simd.h"

#include "devices/cpu/simd.h"

#include <tuple>
#include <type_traits>

namespace op::layer_norm_backward {
namespace {

using simd::f32v;

// The reduction of one row: sums of g and g*xhat with g = grad_output*weight, xhat formed from the row input.
template <bool kFromInput, typename T, typename W>
auto rowSums(size_t n, const T *grad_output, const T *row_input, const W *weight, RowStatistics<float> row) {
    const f32v mean_v = simd::splat(row.mean), rstd_v = simd::splat(row.rstd);
    return simd::RowSums(
        n,
        [=](size_t j, f32v &sum_g, f32v &sum_g_xhat) SIMD_LAMBDA_INLINE {
            f32v g = simd::load(grad_output + j) * simd::load(weight + j);
            sum_g += g;
            sum_g_xhat += g * standardized<kFromInput>(simd::load(row_input + j), mean_v, rstd_v);
        },
        [=](size_t j, float &sum_g, float &sum_g_xhat) {
            float g = cpu::toFloat(grad_output[j]) * cpu::toFloat(weight[j]);
            sum_g += g;
            sum_g_xhat += g * standardized<kFromInput>(cpu::toFloat(row_input[j]), row.mean, row.rstd);
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
    const f32v inv_std_v = simd::splat(row.rstd), mean_g_v = simd::splat(mean_g),
               mean_g_xhat_v = simd::splat(mean_g_xhat);
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
        simd::put(stream, out, (go * weight_v - mean_g_v - xh * mean_g_xhat_v) * inv_std_v);
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
    if (hints.stream_output) simd::fenceStreams();
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

template <typename T, typename W>
const Kernels<T, W> &table() {
    static const Kernels<T, W> table{{sums<false, T, W>, apply<false, T, W>}, {sums<true, T, W>, apply<true, T, W>}};
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
