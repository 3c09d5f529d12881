// BatchNorm's per-channel statistics passes, shared by the backward (sum(grad_output), sum(grad_output * (x -
// mean))) and the forward (shifted sums of x), for both tilings (batch_norm_backward_simd.h). Include only from
// *_simd.cc files: like devices/cpu/simd.h, everything here has internal linkage, each ISA's translation unit
// keeping its own copy.
#ifndef INFINIOP_SRC_OPS_BATCH_NORM_BACKWARD_CPU_SUMS_SIMD_H
#define INFINIOP_SRC_OPS_BATCH_NORM_BACKWARD_CPU_SUMS_SIMD_H

#include "batch_norm_backward_simd.h"

#include "devices/cpu/simd.h"

#include <algorithm>

namespace op::batch_norm_backward {
namespace {

using simd::f32v;

// What a pass adds per element into its two sums, from grad_output g, input x and the channel's reference r
// (vectors, or one element's scalars).
struct GradTerms { // the backward: sum(g), sum(g * (x - r))
    template <typename T>
    static SIMD_INLINE void add(const T *g, const T *x, f32v r, f32v &first, f32v &second) {
        const f32v go = simd::load(g);
        first += go;
        second += go * (simd::load(x) - r);
    }
    template <typename T>
    static SIMD_INLINE void add(const T *g, const T *x, float r, float &first, float &second) {
        const float go = cpu::toFloat(*g);
        first += go;
        second += go * (cpu::toFloat(*x) - r);
    }
};

struct ShiftedTerms { // the forward's shifted sums: sum(x - r), sum((x - r)^2); g is not read
    template <typename T>
    static SIMD_INLINE void add(const T *, const T *x, f32v r, f32v &first, f32v &second) {
        const f32v d = simd::load(x) - r;
        first += d;
        second += d * d;
    }
    template <typename T>
    static SIMD_INLINE void add(const T *, const T *x, float r, float &first, float &second) {
        const float d = cpu::toFloat(*x) - r;
        first += d;
        second += d * d;
    }
};

// Scratch layout per channel: grad lanes, grad*centered lanes, two scalar tails.
constexpr size_t kGradLanes = 0, kCenteredLanes = simd::kWidth, kTails = 2 * simd::kWidth;
static_assert(kTails + 2 <= kChannelScratchFloats, "scratch too small");

template <typename Terms, typename T>
void accumulate(const T *grad_output, const T *input, float mean, size_t n, float *scratch) {
    f32v grad = simd::load(scratch + kGradLanes), centered = simd::load(scratch + kCenteredLanes);
    const f32v mean_v = simd::splat(mean);
    size_t j = 0;
    for (; j + simd::kWidth <= n; j += simd::kWidth) Terms::add(grad_output + j, input + j, mean_v, grad, centered);
    for (; j < n; ++j) Terms::add(grad_output + j, input + j, mean, scratch[kTails], scratch[kTails + 1]);
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
template <typename Terms, typename T>
SIMD_INLINE void accumulateVector(const T *grad_output, const T *input, float mean, float *scratch) {
    f32v grad = simd::load(scratch + kGradLanes), centered = simd::load(scratch + kCenteredLanes);
    Terms::add(grad_output, input, simd::splat(mean), grad, centered);
    simd::store(scratch + kGradLanes, grad);
    simd::store(scratch + kCenteredLanes, centered);
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

template <typename Terms, typename T>
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
                accumulateVector<Terms>(grad_output + at, input + at, mean[c],
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
                    accumulate<Terms>(grad_output + offset, input + offset, mean[c], width, channel_scratch);
                    offset += length;
                    channel_scratch += kChannelScratchFloats;
                }
                added(width);
            }
        }
    }
    flush(tile, scratch, sums);
}

static_assert(kPeriodAlign % simd::kWidth == 0, "a period must hold whole vectors");

constexpr size_t kFlushRows = 256; // rows whose terms an F32 accumulator takes before it goes into F64

// The Terms of position j go into grad[j], centered[j] for j in [0, n).
template <typename Terms, typename T>
void accumulateRow(const T *grad_output, const T *input, const float *mean, size_t n, float *grad, float *centered) {
    size_t j = 0;
    for (; j + simd::kWidth <= n; j += simd::kWidth) {
        f32v first = simd::load(grad + j), second = simd::load(centered + j);
        Terms::add(grad_output + j, input + j, simd::load(mean + j), first, second);
        simd::store(grad + j, first);
        simd::store(centered + j, second);
    }
    for (; j < n; ++j) Terms::add(grad_output + j, input + j, mean[j], grad[j], centered[j]);
}

// Adds each period position's accumulators into its channel's F64 sums, in position order, and clears them. A
// period is whole rows of C runs of `run` positions each; walked so, no position needs a division to find its
// channel (two per position had cost wide rows, C in the thousands, as much as their data pass).
void flushRow(const RowTile &tile, float *grad, float *centered, double *sums) {
    const size_t channels = tile.channels, run = tile.run, period = tile.period;
    for (size_t p = 0; p < period;) {
        for (size_t c = 0; c < channels; ++c) {
            for (const size_t run_end = p + run; p < run_end; ++p) {
                sums[2 * c] += grad[p];
                sums[2 * c + 1] += centered[p];
            }
        }
    }
    std::fill_n(grad, period, 0.0f);
    std::fill_n(centered, period, 0.0f);
}

template <typename Terms, typename T>
void rowSums(const RowTile &tile, const T *grad_output, const T *input, const float *mean, float *scratch,
          double *sums) {
    const size_t period = tile.period, end = tile.end * tile.rowElements();
    const size_t rows_per_period = period / tile.rowElements();
    const size_t periods_per_flush = rows_per_period >= kFlushRows ? 1 : kFlushRows / rows_per_period;
    float *grad = scratch, *centered = scratch + period;
    for (size_t p = 0; p < 2 * period; ++p) scratch[p] = 0.0f;
    size_t i = tile.begin * tile.rowElements(), pending = 0;
    for (; i + period <= end; i += period) {
        accumulateRow<Terms>(grad_output + i, input + i, mean, period, grad, centered);
        if (++pending == periods_per_flush) {
            flushRow(tile, grad, centered, sums);
            pending = 0;
        }
    }
    accumulateRow<Terms>(grad_output + i, input + i, mean, end - i, grad, centered); // a last, partial period
    flushRow(tile, grad, centered, sums);
}

} // namespace
} // namespace op::batch_norm_backward

#endif
