// The channels-first kernels. Compiled once per ISA (CPU_ISA = avx512bf16, avx512, avx2 or generic, with matching flags);
// see devices/cpu/simd.h. Every pass walks a tile in memory order (batch, channel, length) so small-L shapes
// stream too.
#include "batch_norm_backward_simd.h"

#include "devices/cpu/simd.h"

namespace op::batch_norm_backward {
namespace {

using simd::f32v;

// Scratch layout per channel: grad lanes, grad*centered lanes, two scalar tails.
constexpr size_t kGradLanes = 0, kCenteredLanes = simd::kWidth, kTails = 2 * simd::kWidth;
static_assert(kTails + 2 <= kChannelScratchFloats, "scratch too small");

template <typename T>
void accumulate(const T *grad_output, const T *input, float mean, size_t n, float *scratch) {
    f32v grad = simd::load(scratch + kGradLanes), centered = simd::load(scratch + kCenteredLanes);
    const f32v mean_v = simd::splat(mean);
    size_t j = 0;
    for (; j + simd::kWidth <= n; j += simd::kWidth) {
        f32v go = simd::load(grad_output + j);
        grad += go;
        centered += go * (simd::load(input + j) - mean_v);
    }
    for (; j < n; ++j) {
        float go = cpu::toFloat(grad_output[j]);
        scratch[kTails] += go;
        scratch[kTails + 1] += go * (cpu::toFloat(input[j]) - mean);
    }
    simd::store(scratch + kGradLanes, grad);
    simd::store(scratch + kCenteredLanes, centered);
}

void flush(const Tile &tile, float *scratch, double *sums) {
    for (size_t c = tile.channel_begin; c < tile.channel_end; ++c) {
        float *s = scratch + (c - tile.channel_begin) * kChannelScratchFloats;
        sums[2 * c] += simd::sum(simd::load(s + kGradLanes)) + s[kTails];
        sums[2 * c + 1] += simd::sum(simd::load(s + kCenteredLanes)) + s[kTails + 1];
        for (size_t k = 0; k < kChannelScratchFloats; ++k) s[k] = 0.0f;
    }
}

template <typename T>
void sums(const Tile &tile, const T *grad_output, const T *input, const float *mean, float *scratch,
          double *sums) {
    for (size_t k = 0; k < tile.channelCount() * kChannelScratchFloats; ++k) scratch[k] = 0.0f;
    size_t pending = 0; // elements per channel in the lanes since the last flush
    for (size_t n = tile.batch_begin; n < tile.batch_end; ++n) {
        for (size_t piece = tile.begin; piece < tile.end; piece += simd::kChunk) {
            size_t width = tile.end - piece < simd::kChunk ? tile.end - piece : simd::kChunk;
            for (size_t c = tile.channel_begin; c < tile.channel_end; ++c) {
                size_t offset = (n * tile.channels + c) * tile.length + piece;
                accumulate(grad_output + offset, input + offset, mean[c], width,
                           scratch + (c - tile.channel_begin) * kChannelScratchFloats);
            }
            pending += width;
            if (pending >= simd::kChunk) {
                flush(tile, scratch, sums);
                pending = 0;
            }
        }
    }
    flush(tile, scratch, sums);
}

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
    for (size_t n = tile.batch_begin; n < tile.batch_end; ++n) {
        for (size_t c = tile.channel_begin; c < tile.channel_end; ++c) {
            const f32v mean = simd::splat(coefficients.mean[c]), scale_grad = simd::splat(coefficients.scale_grad[c]),
                       scale_centered = simd::splat(coefficients.scale_centered[c]),
                       shift = simd::splat(coefficients.shift[c]);
            size_t offset = (n * tile.channels + c) * tile.length + tile.begin;
            passOverRun(
                whole_vectors, tile.end - tile.begin, stream_output,
                [&](auto stream, T *gi, const auto *go, const auto *x) {
                    simd::put(stream, gi, scale_grad * simd::load(go) + scale_centered * (simd::load(x) - mean) + shift);
                },
                grad_input + offset, grad_output + offset, input + offset);
        }
    }
    if (stream_output) simd::fenceStreams();
}

template <typename T>
void scale(const Tile &tile, const T *grad_output, const float *scale_grad, T *grad_input, bool stream_output) {
    const bool whole_vectors = wholeVectors(tile, grad_input, stream_output);
    for (size_t n = tile.batch_begin; n < tile.batch_end; ++n) {
        for (size_t c = tile.channel_begin; c < tile.channel_end; ++c) {
            const f32v factor = simd::splat(scale_grad[c]);
            size_t offset = (n * tile.channels + c) * tile.length + tile.begin;
            passOverRun(
                whole_vectors, tile.end - tile.begin, stream_output,
                [&](auto stream, T *gi, const auto *go) { simd::put(stream, gi, factor * simd::load(go)); },
                grad_input + offset, grad_output + offset);
        }
    }
    if (stream_output) simd::fenceStreams();
}

template <typename T>
const Kernels<T> &table() {
    static const Kernels<T> table{sums<T>, apply<T>, scale<T>};
    return table;
}

} // namespace
} // namespace op::batch_norm_backward

// This ISA's tables: CPU_ISA names a cpu::Isa value.
namespace cpu {
using op::batch_norm_backward::Kernels;
template <>
const Kernels<float> &isaTable<Isa::CPU_ISA, Kernels<float>>() {
    return op::batch_norm_backward::table<float>();
}
template <>
const Kernels<f16_t> &isaTable<Isa::CPU_ISA, Kernels<f16_t>>() {
    return op::batch_norm_backward::table<f16_t>();
}
template <>
const Kernels<bf16_t> &isaTable<Isa::CPU_ISA, Kernels<bf16_t>>() {
    return op::batch_norm_backward::table<bf16_t>();
}
} // namespace cpu
