// How BatchNorm's CPU passes (forward and backward) split (N, C, L) tensors into tiles. Tiles depend on the shape
// only, so results do not depend on the thread count. Channels-first tensors whose runs of one channel fill a
// vector (L >= kMinChannelRun) are tiled as (batch block, length chunk, channel block), the channel blocks of one
// (batch block, length chunk) group summing disjoint channels; the others as blocks of periodic rows (N*L rows
// of C channels, or N rows of C runs of L), whose per-position coefficients make whole vectors of any channel
// pattern.
#ifndef INFINIOP_SRC_OPS_BATCH_NORM_BACKWARD_CPU_TILING_H
#define INFINIOP_SRC_OPS_BATCH_NORM_BACKWARD_CPU_TILING_H

#include "batch_norm_backward_channels.h"
#include "batch_norm_backward_simd.h"
#include "devices/cpu/parallel.h"
#include "ops/batch_norm_layout.h"

#include <algorithm>
#include <numeric>

namespace op::batch_norm_backward {

class Tiling {
  public:
    static constexpr size_t kMaxTiles = 64;
    static constexpr size_t kMinChunk = 4096; // elements of a row per channels-first tile, so tiles stay worth a task
    // Elements of each channel per group of channels-first tiles (a batch block x a length chunk), where N * L
    // allows: a tile's sums pass keeps kChannelScratchFloats F32 lanes per channel, which would otherwise outweigh
    // its data (3x at N = 64, L = 16, one batch per tile). Channel blocks split the groups into tiles instead.
    static constexpr size_t kMinChannelElements = 1024;
    static constexpr size_t kMinRowTile = 16384; // elements per tile (periodic: and at least kMinTilePeriods periods)
    // Periods per periodic tile, so that what a tile's sums cost besides its data (two periods of F32 scratch
    // cleared and flushed, two periods of F64 partials written and read back) stays a small part of it. With 4,
    // rows of 4096 channels made tiles of 4 rows whose partials were as large as their F32 data: BatchNorm1d
    // (256, 4096) took 1.5-2.1x as long, forward and backward (2 threads, 2026-11-30).
    static constexpr size_t kMinTilePeriods = 32;
    static constexpr size_t kMaxShortPeriod = 4096; // longest period kept a multiple of kPeriodAlign (floats per array)
    // Channels-first runs of one channel shorter than a vector take the periodic path, whatever C * L: there,
    // every run is a padded partial vector. Measured (BF16, 8M elements, 2 threads) 3-6x faster for L = 4..12 and
    // C = 64, 1.8x for L = 8, C = 1024, 1.2-1.6x (F32 too) for C * L from 18432 to 524288, whose coefficient
    // arrays outgrow L2, with a tenth of the workspace there (48 floats per channel per tile on the other path).
    // From L = 16 on, the channels-first path was as fast or faster (2x at L = 49).
    static constexpr size_t kMinChannelRun = 16;

    Tiling(size_t batch, size_t channels, size_t length, BatchNormLayout layout)
        : batch_(batch), channels_(channels), length_(length), layout_(layout) {
        if (periodic()) {
            const size_t rows = periodicRows(), row = channels * run();
            if (rows == 0 || row == 0) return; // no tiles
            period_ = periodOf(row);
            const size_t rows_per_period = period_ / row;
            const size_t min_tile = std::max(kMinRowTile, kMinTilePeriods * period_);
            const size_t tiles = std::clamp<size_t>(rows * row / min_tile, 1, kMaxTiles);
            const size_t per_tile = (rows + tiles - 1) / tiles;
            row_blocks_ = cpu::Blocks::ofSize(rows, (per_tile + rows_per_period - 1) / rows_per_period * rows_per_period);
        } else {
            batch_blocks_ = cpu::Blocks::split(batch, std::clamp<size_t>(batch * length / kMinChannelElements, 1, kMaxTiles));
            length_chunks_ = cpu::Blocks::split(
                length, std::max<size_t>(1, std::min(kMaxTiles / std::max<size_t>(1, batch_blocks_.count),
                                                     (length + kMinChunk - 1) / kMinChunk)));
            const size_t groups = std::max<size_t>(1, batch_blocks_.count * length_chunks_.count);
            const size_t group_elements = batch_blocks_.per_block * length_chunks_.per_block * channels;
            channel_blocks_ = cpu::Blocks::split(
                channels, std::clamp<size_t>(std::min(kMaxTiles / groups, group_elements / kMinRowTile), 1, kMaxTiles));
        }
    }

    bool periodic() const { return layout_ == BatchNormLayout::channels_last || length_ < kMinChannelRun; }
    // Periodic rows: N*L rows of C channels (channels-last), or N rows of C runs of L (channels-first).
    size_t periodicRows() const { return layout_ == BatchNormLayout::channels_last ? batch_ * length_ : batch_; }
    // Elements of one channel in a row of the position arrays: L for periodic channels-first rows, else 1
    // (channels-last rows, and the per-channel arrays of channels-first tiles).
    size_t run() const { return periodic() && layout_ != BatchNormLayout::channels_last ? length_ : 1; }
    // Groups of tiles sharing one row of the sums: periodic tiles each have their own.
    size_t groups() const { return periodic() ? row_blocks_.count : batch_blocks_.count * length_chunks_.count; }
    size_t tiles() const { return periodic() ? row_blocks_.count : groups() * channel_blocks_.count; }
    size_t groupOf(size_t tile) const { return periodic() ? tile : tile / channel_blocks_.count; }
    // Entries of each per-position coefficient array: a period, or one per channel.
    size_t positions() const { return periodic() ? period_ : channels_; }
    size_t period() const { return period_; }
    // Floats of the sums pass's scratch per thread.
    size_t slotScratchFloats() const {
        return periodic() ? 2 * period_ : channel_blocks_.per_block * kChannelScratchFloats;
    }
    // Contiguous runs of the elementwise pass: periods of periodic rows, or stretches of one channel's length that
    // start at multiples of the length chunk within rows of L.
    size_t runElements() const { return periodic() ? period_ : std::gcd(length_, length_chunks_.per_block); }

    // Tiles of a group are consecutive: its channel blocks, each a stretch of memory per batch.
    Tile tile(size_t index) const {
        const size_t group = groupOf(index), channel_block = index % channel_blocks_.count;
        const size_t batch_block = group / length_chunks_.count, chunk = group % length_chunks_.count;
        return Tile{batch_blocks_.begin(batch_block),       batch_blocks_.end(batch_block, batch_),
                    channels_,                               length_,
                    length_chunks_.begin(chunk),             length_chunks_.end(chunk, length_),
                    channel_blocks_.begin(channel_block),    channel_blocks_.end(channel_block, channels_)};
    }

    RowTile rowTile(size_t index) const {
        return RowTile{row_blocks_.begin(index), row_blocks_.end(index, periodicRows()), channels_, run(), period_};
    }

    // finish(first, count, totals) for each block of kChannelBlock channels [first, first + count) (the last may
    // be shorter), totals[2 * i] and totals[2 * i + 1] channel first + i's two sums over the `groups` groups'
    // partials in `sums` ([group][channel][2]), added in group order whatever the thread count (none for 0
    // groups). A block reads each group's sums of its channels as one stretch: one channel at a time strode
    // through every group's sums (3-7% of a backward at 64 tiles x 512 channels). The blocks share one thread per
    // kParallelFinishChannels channels (at most maxThreads; the same bits for any count): (8, 8192) took 0.7x as
    // long forward and 0.85x backward on 2 threads, and at (64, 1024) one thread was as fast.
    static constexpr size_t kParallelFinishChannels = 1024;
    template <typename Finish>
    void finishChannels(const double *sums, size_t groups, Finish &&finish) const {
        const cpu::Blocks blocks = cpu::Blocks::ofSize(channels_, kChannelBlock);
        cpu::parallelFor(blocks.count, [&](size_t block) {
            const size_t first = blocks.begin(block), count = blocks.end(block, channels_) - first;
            double totals[2 * kChannelBlock] = {};
            for (size_t g = 0; g < groups; ++g) {
                const double *group_sums = sums + (g * channels_ + first) * 2;
                for (size_t i = 0; i < 2 * count; ++i) totals[i] += group_sums[i];
            }
            finish(first, count, static_cast<const double *>(totals));
        }, std::max<size_t>(1, channels_ / kParallelFinishChannels));
    }

    // Sets the positions of channels [first, first + count) in `array` (each channel's runs, every C runs) to
    // values[0, count). Every period holds whole rows of C runs.
    void fillChannels(float *array, size_t first, size_t count, const double *values) const {
        const size_t run_length = run();
        for (size_t start = first * run_length; start < positions(); start += channels_ * run_length) {
            if (run_length == 1) { // one position per channel (channels-last, or L = 1): a loop that vectorizes
                for (size_t i = 0; i < count; ++i) array[start + i] = static_cast<float>(values[i]);
                continue;
            }
            for (size_t i = 0; i < count; ++i)
                std::fill_n(array + start + i * run_length, run_length, static_cast<float>(values[i]));
        }
    }

  private:
    // The period of rows of `row` elements: the row rounded up to a common multiple with kPeriodAlign when that
    // stays short, so every period holds whole vectors; else the row itself (a scalar tail per row).
    static size_t periodOf(size_t row) {
        const size_t common = row / std::gcd(row, kPeriodAlign) * kPeriodAlign;
        return common <= kMaxShortPeriod ? common : row;
    }

    size_t batch_, channels_, length_;
    BatchNormLayout layout_;
    // Channels-first tiles.
    cpu::Blocks batch_blocks_{1, 0}, length_chunks_{1, 0}, channel_blocks_{1, 0};
    // Periodic tiles.
    cpu::Blocks row_blocks_{1, 0};
    size_t period_ = 0;
};

} // namespace op::batch_norm_backward

#endif
