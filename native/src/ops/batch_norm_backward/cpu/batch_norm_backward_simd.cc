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

// Runs of exactly one vector (L = kWidth, the whole length in one tile) take loops of their own, two channels per
// iteration: through the general loops, a run's setup (its loops, the tails, the tile's fields read again after
// every store) cost more than its data. Measured at (8192, 64, 16), 2 threads, the same bits: BF16 10-30% faster
// (its 32 MiB of inputs stay in this machine's L3 between calls), 2x in L2 at (512, 64, 16); F32, bound by DRAM
// there, between 3% faster and 10% slower, within this shared machine's noise.
bool oneVectorRuns(const Tile &tile) {
    return tile.begin == 0 && tile.end == simd::kWidth && tile.length == simd::kWidth;
}

// Lanes += the terms of one vector of a channel.
template <typename T>
SIMD_INLINE void accumulateVector(const T *grad_output, const T *input, float mean, float *scratch) {
    const f32v go = simd::load(grad_output);
    simd::store(scratch + kGradLanes, simd::load(scratch + kGradLanes) + go);
    simd::store(scratch + kCenteredLanes,
                simd::load(scratch + kCenteredLanes) + go * (simd::load(input) - simd::splat(mean)));
}

// Calls vector(stream, c, at) for the one vector of each run of a oneVectorRuns tile: channel c's, at element
// `at`, two channels per iteration. stream is std::true_type where stream_output, else std::false_type.
template <typename Vector>
SIMD_INLINE void forEachOneVectorRun(const Tile &tile, bool stream_output, Vector &&vector) {
    const size_t channels = tile.channels, channel_begin = tile.channel_begin, channel_end = tile.channel_end;
    const size_t batch_begin = tile.batch_begin, batch_end = tile.batch_end;
    auto runs = [&](auto stream) {
        for (size_t n = batch_begin; n < batch_end; ++n) {
            size_t c = channel_begin, at = (n * channels + channel_begin) * simd::kWidth;
            for (; c + 2 <= channel_end; c += 2, at += 2 * simd::kWidth) {
                vector(stream, c, at);
                vector(stream, c + 1, at + simd::kWidth);
            }
            if (c < channel_end) vector(stream, c, at);
        }
    };
    if (stream_output) {
        runs(std::true_type{});
    } else {
        runs(std::false_type{});
    }
}

template <typename T>
void sums(const Tile &tile, const T *grad_output, const T *input, const float *mean, float *scratch,
          double *sums) {
    // The tile's fields as locals: the stores into scratch may alias anything, and fields read in the loops
    // would be loaded again after every store.
    const size_t channels = tile.channels, length = tile.length, begin = tile.begin, end = tile.end;
    const size_t channel_begin = tile.channel_begin, channel_end = tile.channel_end;
    for (size_t k = 0; k < (channel_end - channel_begin) * kChannelScratchFloats; ++k) scratch[k] = 0.0f;
    size_t pending = 0; // elements per channel in the lanes since the last flush
    auto added = [&](size_t elements) {
        pending += elements;
        if (pending >= simd::kChunk) {
            flush(tile, scratch, sums);
            pending = 0;
        }
    };
    if (oneVectorRuns(tile)) {
        // kChunk / kWidth batches at a time, the flushes of the general loop: the same bits.
        constexpr size_t kFlushBatches = simd::kChunk / simd::kWidth;
        for (size_t first = tile.batch_begin; first < tile.batch_end; first += kFlushBatches) {
            Tile batches = tile;
            batches.batch_begin = first;
            batches.batch_end = tile.batch_end - first < kFlushBatches ? tile.batch_end : first + kFlushBatches;
            forEachOneVectorRun(batches, false, [&](auto, size_t c, size_t at) {
                accumulateVector(grad_output + at, input + at, mean[c],
                                 scratch + (c - channel_begin) * kChannelScratchFloats);
            });
            added((batches.batch_end - first) * simd::kWidth);
        }
    } else {
        for (size_t n = tile.batch_begin; n < tile.batch_end; ++n) {
            for (size_t piece = begin; piece < end; piece += simd::kChunk) {
                const size_t width = end - piece < simd::kChunk ? end - piece : simd::kChunk;
                size_t offset = (n * channels + channel_begin) * length + piece;
                float *channel_scratch = scratch;
                for (size_t c = channel_begin; c < channel_end; ++c) {
                    accumulate(grad_output + offset, input + offset, mean[c], width, channel_scratch);
                    offset += length;
                    channel_scratch += kChannelScratchFloats;
                }
                added(width);
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
    static const Kernels<T> table{sums<T>, apply<T>, scale<T>};
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
