// The periodic-row kernels (see batch_norm_backward_simd.h). Compiled once per ISA. A tile is walked in
// memory order, one period (a whole number of rows whose channel pattern the next period repeats) at a time,
// so the per-position coefficients and accumulators line up with whole vectors even for C = 3.
#include "batch_norm_backward_simd.h"

#include "devices/cpu/simd.h"

namespace op::batch_norm_backward {
namespace {

using simd::f32v;

static_assert(kPeriodAlign % simd::kWidth == 0, "a period must hold whole vectors");

constexpr size_t kFlushRows = 256; // rows whose terms an F32 accumulator takes before it goes into F64

// grad[j] += grad_output[j], centered[j] += grad_output[j] * (input[j] - mean[j]) for j in [0, n).
template <typename T>
void accumulate(const T *grad_output, const T *input, const float *mean, size_t n, float *grad, float *centered) {
    size_t j = 0;
    for (; j + simd::kWidth <= n; j += simd::kWidth) {
        const f32v go = simd::load(grad_output + j);
        simd::store(grad + j, simd::load(grad + j) + go);
        simd::store(centered + j, simd::load(centered + j) + go * (simd::load(input + j) - simd::load(mean + j)));
    }
    for (; j < n; ++j) {
        const float go = cpu::toFloat(grad_output[j]);
        grad[j] += go;
        centered[j] += go * (cpu::toFloat(input[j]) - mean[j]);
    }
}

// Adds each period position's accumulators into its channel's F64 sums, in position order, and clears them.
void flush(const RowTile &tile, float *grad, float *centered, double *sums) {
    for (size_t p = 0; p < tile.period; ++p) {
        const size_t c = p / tile.run % tile.channels;
        sums[2 * c] += grad[p];
        sums[2 * c + 1] += centered[p];
        grad[p] = centered[p] = 0.0f;
    }
}

template <typename T>
void sums(const RowTile &tile, const T *grad_output, const T *input, const float *mean, float *scratch,
          double *sums) {
    const size_t period = tile.period, end = tile.end * tile.rowElements();
    const size_t rows_per_period = period / tile.rowElements();
    const size_t periods_per_flush = rows_per_period >= kFlushRows ? 1 : kFlushRows / rows_per_period;
    float *grad = scratch, *centered = scratch + period;
    for (size_t p = 0; p < 2 * period; ++p) scratch[p] = 0.0f;
    size_t i = tile.begin * tile.rowElements(), pending = 0;
    for (; i + period <= end; i += period) {
        accumulate(grad_output + i, input + i, mean, period, grad, centered);
        if (++pending == periods_per_flush) {
            flush(tile, grad, centered, sums);
            pending = 0;
        }
    }
    accumulate(grad_output + i, input + i, mean, end - i, grad, centered); // a last, partial period
    flush(tile, grad, centered, sums);
}

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
    static const RowKernels<T> table{sums<T>, apply<T>, scale<T>};
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
