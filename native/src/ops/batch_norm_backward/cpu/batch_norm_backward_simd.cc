// The channels-first kernels. Compiled once per ISA (CPU_ISA = avx512bf16, avx512, avx2 or generic, with matching flags);
// see devices/cpu/simd.h. Every pass walks a tile in memory order (batch, channel, length) so small-L shapes
// stream too.
#include "batch_norm_backward_simd.h"

#include "batch_norm_sums_simd.h"
#include "devices/cpu/simd.h"

namespace op::batch_norm_backward {
namespace {

// The elementwise pass over one run of `width` elements of a channel (simd::forEachVector's contract). Runs of
// whole vectors, all aligned for streamed stores if those are wanted (whole_vectors), take a plain loop: with
// short runs (L = 16 is one vector), forEachVector's per-run setup for heads and tails costs as much as the run.
// The same step computes every element either way.
template <typename Step, typename T, typename... Arrays>
SIMD_INLINE SIMD_FLATTEN void passOverRun(bool whole_vectors, size_t width, bool stream_output, Step &&step, T *out, Arrays *...arrays) {
    if (!whole_vectors) {
        simd::forEachVector(width, stream_output, step, simd::NoSideWork{}, out, arrays...);
        return;
    }
    auto run = [&](auto stream) {
        for (size_t j = 0; j < width; j += simd::kWidth) step(stream, out + j, (arrays + j)...);
    };
    if (stream_output) {
        run(std::true_type{});
    } else {
        run(std::false_type{});
    }
}

// Whether every run of the tile is whole vectors, and aligned for streamed stores into grad_input if wanted.
template <typename T>
bool wholeVectors(const Tile &tile, const T *grad_input, bool stream_output) {
    constexpr size_t kAlignment = simd::kStreamAlignment<T>;
    const bool runs_aligned = reinterpret_cast<uintptr_t>(grad_input) % kAlignment == 0 &&
                              tile.length * sizeof(T) % kAlignment == 0 && tile.begin * sizeof(T) % kAlignment == 0;
    return (tile.end - tile.begin) % simd::kWidth == 0 && (runs_aligned || !stream_output);
}

template <typename T>
void apply(const Tile &tile, const T *grad_output, const T *input, const Coefficients &coefficients,
           T *grad_input, bool stream_output) {
    const bool whole_vectors = wholeVectors(tile, grad_input, stream_output);
    // Locals, as in sums: the vector stores may alias the tile and the coefficients.
    const size_t channels = tile.channels, length = tile.length, width = tile.end - tile.begin;
    const size_t channel_begin = tile.channel_begin, channel_end = tile.channel_end;
    const float *means = coefficients.mean, *scale_grads = coefficients.scale_grad,
                *scale_centereds = coefficients.scale_centered, *shifts = coefficients.shift;
    // grad_input's vector of channel c at `at`.
    auto vector = [&](auto stream, size_t c, size_t at) {
        simd::put(stream, grad_input + at,
                  simd::splat(scale_grads[c]) * simd::load(grad_output + at) +
                      simd::splat(scale_centereds[c]) * (simd::load(input + at) - simd::splat(means[c])) +
                      simd::splat(shifts[c]));
    };
    if (whole_vectors && oneVectorRuns(tile)) {
        forEachOneVectorRun(tile, stream_output, vector);
    } else {
        for (size_t n = tile.batch_begin; n < tile.batch_end; ++n) {
            size_t offset = (n * channels + channel_begin) * length + tile.begin;
            for (size_t c = channel_begin; c < channel_end; ++c, offset += length) {
                const f32v mean = simd::splat(means[c]), scale_grad = simd::splat(scale_grads[c]),
                           scale_centered = simd::splat(scale_centereds[c]), shift = simd::splat(shifts[c]);
                passOverRun(
                    whole_vectors, width, stream_output,
                    [&](auto stream, T *gi, const auto *go, const auto *x) {
                        simd::put(stream, gi,
                                  scale_grad * simd::load(go) + scale_centered * (simd::load(x) - mean) + shift);
                    },
                    grad_input + offset, grad_output + offset, input + offset);
            }
        }
    }
    if (stream_output) simd::fenceStreams();
}

template <typename T>
void scale(const Tile &tile, const T *grad_output, const float *scale_grad, T *grad_input, bool stream_output) {
    const bool whole_vectors = wholeVectors(tile, grad_input, stream_output);
    if (whole_vectors && oneVectorRuns(tile)) {
        forEachOneVectorRun(tile, stream_output, [&](auto stream, size_t c, size_t at) {
            simd::put(stream, grad_input + at, simd::splat(scale_grad[c]) * simd::load(grad_output + at));
        });
    } else {
        // Locals, as in sums.
        const size_t channels = tile.channels, length = tile.length, width = tile.end - tile.begin;
        const size_t channel_begin = tile.channel_begin, channel_end = tile.channel_end;
        for (size_t n = tile.batch_begin; n < tile.batch_end; ++n) {
            size_t offset = (n * channels + channel_begin) * length + tile.begin;
            for (size_t c = channel_begin; c < channel_end; ++c, offset += length) {
                const f32v factor = simd::splat(scale_grad[c]);
                passOverRun(
                    whole_vectors, width, stream_output,
                    [&](auto stream, T *gi, const auto *go) { simd::put(stream, gi, factor * simd::load(go)); },
                    grad_input + offset, grad_output + offset);
            }
        }
    }
    if (stream_output) simd::fenceStreams();
}

template <typename T>
const Kernels<T> &table() {
    static const Kernels<T> table{sums<GradTerms, T>, apply<T>, scale<T>};
    return table;
}

} // namespace
} // namespace op::batch_norm_backward

// This ISA's tables: CPU_ISA names a cpu::Isa value.
namespace cpu {
using op::batch_norm_backward::Kernels;
#if SIMD_NON_BF16_TABLES
template <>
const Kernels<float> &isaTable<Isa::CPU_ISA, Kernels<float>>() {
    return op::batch_norm_backward::table<float>();
}
template <>
const Kernels<f16_t> &isaTable<Isa::CPU_ISA, Kernels<f16_t>>() {
    return op::batch_norm_backward::table<f16_t>();
}
#endif
template <>
const Kernels<bf16_t> &isaTable<Isa::CPU_ISA, Kernels<bf16_t>>() {
    return op::batch_norm_backward::table<bf16_t>();
}
} // namespace cpu
