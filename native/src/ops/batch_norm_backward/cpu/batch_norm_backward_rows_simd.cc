// The periodic-row kernels (see batch_norm_backward_simd.h). Compiled once per ISA. A tile is walked in
// memory order, one period (a whole number of rows whose channel pattern the next period repeats) at a time,
// so the per-position coefficients and accumulators line up with whole vectors even for C = 3.
#include "batch_norm_backward_simd.h"

#include "batch_norm_sums_simd.h"
#include "devices/cpu/simd.h"

namespace op::batch_norm_backward {
namespace {

template <typename T>
void apply(const RowTile &tile, const T *grad_output, const T *input, const Coefficients &k, T *grad_input,
           bool stream_output) {
    const size_t end = tile.end * tile.rowElements();
    for (size_t i = tile.begin * tile.rowElements(); i < end; i += tile.period) {
        simd::forEachVector(
            end - i < tile.period ? end - i : tile.period, stream_output,
            [&](auto stream, T *gi, const auto *go, const auto *x, const float *mean, const float *scale_grad,
                const float *scale_centered, const float *shift) {
                simd::put(stream, gi, simd::load(scale_grad) * simd::load(go) +
                                          simd::load(scale_centered) * (simd::load(x) - simd::load(mean)) +
                                          simd::load(shift));
            },
            simd::NoSideWork{}, grad_input + i, grad_output + i, input + i, k.mean, k.scale_grad, k.scale_centered,
            k.shift);
    }
    if (stream_output) simd::fenceStreams();
}

template <typename T>
void scale(const RowTile &tile, const T *grad_output, const float *scale_grad, T *grad_input, bool stream_output) {
    const size_t end = tile.end * tile.rowElements();
    for (size_t i = tile.begin * tile.rowElements(); i < end; i += tile.period) {
        simd::forEachVector(
            end - i < tile.period ? end - i : tile.period, stream_output,
            [&](auto stream, T *gi, const auto *go, const float *factor) {
                simd::put(stream, gi, simd::load(factor) * simd::load(go));
            },
            simd::NoSideWork{}, grad_input + i, grad_output + i, scale_grad);
    }
    if (stream_output) simd::fenceStreams();
}

template <typename T>
const RowKernels<T> &table() {
    static const RowKernels<T> table{rowSums<GradTerms, T>, apply<T>, scale<T>};
    return table;
}

} // namespace
} // namespace op::batch_norm_backward

// This ISA's tables: CPU_ISA names a cpu::Isa value.
namespace cpu {
using op::batch_norm_backward::RowKernels;
#if SIMD_NON_BF16_TABLES
template <>
const RowKernels<float> &isaTable<Isa::CPU_ISA, RowKernels<float>>() {
    return op::batch_norm_backward::table<float>();
}
template <>
const RowKernels<f16_t> &isaTable<Isa::CPU_ISA, RowKernels<f16_t>>() {
    return op::batch_norm_backward::table<f16_t>();
}
#endif
template <>
const RowKernels<bf16_t> &isaTable<Isa::CPU_ISA, RowKernels<bf16_t>>() {
    return op::batch_norm_backward::table<bf16_t>();
}
} // namespace cpu
