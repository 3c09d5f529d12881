// Compiled once per ISA (CPU_ISA = avx512bf16, avx512, avx2 or generic, with matching flags); see
// devices/cpu/simd.h. The statistics passes are the backward's (batch_norm_sums_simd.h) with the forward's terms.
#include "batch_norm_simd.h"

#include "devices/cpu/simd.h"
#include "ops/batch_norm_backward/cpu/batch_norm_sums_simd.h"

namespace op::batch_norm {
namespace {

using batch_norm_backward::ShiftedTerms;

// x takes grad_output's place too: the shifted terms never read it.
template <typename T>
void sums(const Tile &tile, const T *x, const float *reference, float *scratch, double *sums) {
    batch_norm_backward::sums<ShiftedTerms>(tile, x, x, reference, scratch, sums);
}

template <typename T>
void rowSums(const RowTile &tile, const T *x, const float *reference, float *scratch, double *sums) {
    batch_norm_backward::rowSums<ShiftedTerms>(tile, x, x, reference, scratch, sums);
}

template <typename T>
void apply(const Tile &tile, const T *x, const Coefficients &k, T *y, bool stream_output) {
    // Locals: the vector stores may alias the tile and the coefficients.
    const size_t channels = tile.channels, length = tile.length, width = tile.end - tile.begin;
    const size_t channel_begin = tile.channel_begin, channel_end = tile.channel_end;
    for (size_t n = tile.batch_begin; n < tile.batch_end; ++n) {
        size_t offset = (n * channels + channel_begin) * length + tile.begin;
        for (size_t c = channel_begin; c < channel_end; ++c, offset += length) {
            const simd::f32v reference = simd::splat(k.reference[c]), scale = simd::splat(k.scale[c]),
                             shift = simd::splat(k.shift[c]);
            simd::forEachVector(
                width, stream_output,
                [&](auto stream, T *out, const auto *in) {
                    simd::put(stream, out, (simd::load(in) - reference) * scale + shift);
                },
                simd::NoSideWork{}, y + offset, x + offset);
        }
    }
    if (stream_output) simd::fenceStreams();
}

template <typename T>
void rowApply(const RowTile &tile, const T *x, const Coefficients &k, T *y, bool stream_output) {
    const size_t end = tile.end * tile.rowElements();
    for (size_t i = tile.begin * tile.rowElements(); i < end; i += tile.period) {
        simd::forEachVector(
            end - i < tile.period ? end - i : tile.period, stream_output,
            [&](auto stream, T *out, const auto *in, const float *reference, const float *scale, const float *shift) {
                simd::put(stream, out,
                          (simd::load(in) - simd::load(reference)) * simd::load(scale) + simd::load(shift));
            },
            simd::NoSideWork{}, y + i, x + i, k.reference, k.scale, k.shift);
    }
    if (stream_output) simd::fenceStreams();
}

template <typename T>
const Kernels<T> &table() {
    static const Kernels<T> table{sums<T>, apply<T>};
    return table;
}

template <typename T>
const RowKernels<T> &rowTable() {
    static const RowKernels<T> table{rowSums<T>, rowApply<T>};
    return table;
}

} // namespace
} // namespace op::batch_norm

// This ISA's tables: CPU_ISA names a cpu::Isa value.
namespace cpu {
using op::batch_norm::Kernels;
using op::batch_norm::RowKernels;
#if SIMD_NON_BF16_TABLES
template <>
const Kernels<float> &isaTable<Isa::CPU_ISA, Kernels<float>>() {
    return op::batch_norm::table<float>();
}
template <>
const Kernels<f16_t> &isaTable<Isa::CPU_ISA, Kernels<f16_t>>() {
    return op::batch_norm::table<f16_t>();
}
template <>
const RowKernels<float> &isaTable<Isa::CPU_ISA, RowKernels<float>>() {
    return op::batch_norm::rowTable<float>();
}
template <>
const RowKernels<f16_t> &isaTable<Isa::CPU_ISA, RowKernels<f16_t>>() {
    return op::batch_norm::rowTable<f16_t>();
}
#endif
template <>
const Kernels<bf16_t> &isaTable<Isa::CPU_ISA, Kernels<bf16_t>>() {
    return op::batch_norm::table<bf16_t>();
}
template <>
const RowKernels<bf16_t> &isaTable<Isa::CPU_ISA, RowKernels<bf16_t>>() {
    return op::batch_norm::rowTable<bf16_t>();
}
} // namespace cpu
