// BatchNorm backward CPU leaf kernels, per ISA, for the two layouts of the big tensors:
// - channels-first (N, C, L): over one Tile (a block of the batch x a chunk of the length x a block of channels);
// - periodic rows: over one RowTile (a block of rows), with the channel pattern repeating every `period`
//   elements. Channels-last tensors are N*L rows of C channels; channels-first ones with a short L are N rows
//   of C runs of L elements of one channel.
// In both, grad_input = scale_grad * grad_output + scale_centered * (x - mean) + shift, per channel.
#ifndef INFINIOP_SRC_OPS_BATCH_NORM_BACKWARD_CPU_SIMD_H
#define INFINIOP_SRC_OPS_BATCH_NORM_BACKWARD_CPU_SIMD_H

#include "devices/cpu/half.h"
#include "devices/cpu/isa.h"

#include <cstddef>

namespace op::batch_norm_backward {

// Elements [begin, end) of the length dim, for batches [batch_begin, batch_end) and channels
// [channel_begin, channel_end) of a tensor of `channels` channels.
struct Tile {
    size_t batch_begin, batch_end, channels, length, begin, end, channel_begin, channel_end;

    size_t channelCount() const { return channel_end - channel_begin; }
};

// Per-channel F32 arrays of the grad_input terms (for rows of channels: per position in the period).
struct Coefficients {
    const float *mean, *scale_grad, *scale_centered, *shift;
};

// Per-channel F32 lane accumulators a channels-first sums pass keeps in the workspace.
constexpr size_t kChannelScratchFloats = 48;

template <typename T>
struct Kernels {
    // sums[2c] += sum of grad_output, sums[2c+1] += sum of grad_output*(x - mean[c]) over the tile, for the
    // tile's channels c, F32 lanes flushed into F64 every 4096 elements of a channel. scratch:
    // kChannelScratchFloats per channel of the tile.
    void (*sums)(const Tile &tile, const T *grad_output, const T *input, const float *mean, float *scratch,
                 double *sums);
    // grad_input over the tile; grad_input may be grad_output. stream_output: write it past the caches
    // (simd::storeStream; the same bits either way).
    void (*apply)(const Tile &tile, const T *grad_output, const T *input, const Coefficients &coefficients,
                  T *grad_input, bool stream_output);
    // grad_input = scale_grad[c] * grad_output over the tile (eval mode: x is not read).
    void (*scale)(const Tile &tile, const T *grad_output, const float *scale_grad, T *grad_input, bool stream_output);
};

// Rows [begin, end) of channels * run elements each: C runs of `run` elements of one channel. The element at
// flat offset i (from row 0) has period position p = i % period and channel p / run % channels, where period
// is a multiple of the row; begin * channels * run is a multiple of period.
struct RowTile {
    size_t begin, end, channels, run, period;

    size_t rowElements() const { return channels * run; }
};

// Periods are multiples of this (a multiple of every ISA's vector width) when they can be kept short.
constexpr size_t kPeriodAlign = 16;

template <typename T>
struct RowKernels {
    // sums[2c] += sum of grad_output, sums[2c+1] += sum of grad_output*(x - mean) over the tile's channel-c
    // elements; `mean` holds period values. F32 accumulators per period position (scratch: 2 * period
    // floats), flushed into F64 at least every 256 rows.
    void (*sums)(const RowTile &tile, const T *grad_output, const T *input, const float *mean, float *scratch,
                 double *sums);
    // grad_input over the tile; the coefficient arrays hold period values; grad_input may be grad_output.
    void (*apply)(const RowTile &tile, const T *grad_output, const T *input, const Coefficients &coefficients,
                  T *grad_input, bool stream_output);
    // grad_input = scale_grad * grad_output over the tile (eval mode: x is not read).
    void (*scale)(const RowTile &tile, const T *grad_output, const float *scale_grad, T *grad_input,
                  bool stream_output);
};

} // namespace op::batch_norm_backward

#endif
