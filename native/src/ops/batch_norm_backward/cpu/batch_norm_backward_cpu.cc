// BatchNorm backward on the CPU, in two passes over fixed tiles: pass 1 sums grad_output and
// grad_output*(x - mean) per channel into each tile group's F64 partials, which are then added in group order;
// pass 2 writes grad_input = scale_grad*grad_output + scale_centered*(x - mean) + shift per channel.
// Tiles depend on the shape only, so results do not depend on the thread count. Channels-first tensors whose
// runs of one channel fill a vector (L >= kMinChannelRun) are tiled as (batch block, length chunk, channel
// block), the channel blocks of one (batch block, length chunk) group summing disjoint channels; the others
// as blocks of periodic rows (N*L rows of C channels, or N rows of C runs of L), whose per-position
// coefficients make whole vectors of any channel pattern. F64 takes a scalar path of its own
// (batch_norm_backward_f64.h).
#include "../batch_norm_backward.h"

#include "batch_norm_backward_channels.h"
#include "batch_norm_backward_f64.h"
#include "batch_norm_backward_simd.h"
#include "devices/cpu/half.h"
#include "devices/cpu/parallel.h"
#include "devices/cpu/row_hints.h"
#include "devices/cpu/workspace.h"

#include <algorithm>
#include <numeric>

namespace op::batch_norm_backward {
namespace {

constexpr size_t kMaxTiles = 64;
constexpr size_t kMinChunk = 4096;        // elements of a row per channels-first tile, so tiles stay worth a task
// Elements of each channel per group of channels-first tiles (a batch block x a length chunk), where N * L
// allows: a tile's sums pass keeps kChannelScratchFloats F32 lanes per channel, which would otherwise outweigh
// its data (3x at N = 64, L = 16, one batch per tile). Channel blocks split the groups into tiles instead.
constexpr size_t kMinChannelElements = 1024;
constexpr size_t kMinRowTile = 16384;     // elements per tile (periodic: and at least kMinTilePeriods periods)
constexpr size_t kMinTilePeriods = 4;     // so a tile's scratch (two periods of floats) stays below its data
constexpr size_t kMaxShortPeriod = 4096;  // longest period kept a multiple of kPeriodAlign (floats per array)
// Channels-first runs of one channel shorter than a vector take the periodic path, whatever C * L: there,
// every run is a padded partial vector. Measured (BF16, 8M elements, 2 threads) 3-6x faster for L = 4..12 and
// C = 64, 1.8x for L = 8, C = 1024, 1.2-1.6x (F32 too) for C * L from 18432 to 524288, whose coefficient
// arrays outgrow L2, with a tenth of the workspace there (48 floats per channel per tile on the other path).
// From L = 16 on, the channels-first path was as fast or faster (2x at L = 49).
constexpr size_t kMinChannelRun = 16;
// Channels per block of the finish: their sums of one tile are 4 KiB, kept on the stack.
constexpr size_t kFinishChannels = 256;

// The period of rows of `row` elements: the row rounded up to a common multiple with kPeriodAlign when that
// stays short, so every period holds whole vectors; else the row itself (a scalar tail per row).
size_t periodOf(size_t row) {
    const size_t common = row / std::gcd(row, kPeriodAlign) * kPeriodAlign;
    return common <= kMaxShortPeriod ? common : row;
}

// Where each piece of a float-path call lives in the workspace.
struct Workspace {
    ChannelStatistics *statistics; // per channel
    double *sums;                  // [group][channel][2], a group's tiles taking disjoint channels
    float *mean, *scale_grad, *scale_centered, *shift; // per position: position p is channel p % C
    float *scratch;                // per slot: the sums pass runs on at most slots_ threads
};

class CpuDescriptor final : public Descriptor {
  public:
    CpuDescriptor(int device_id, const Info &info) : Descriptor(INFINI_DEVICE_CPU, device_id, info) {
        if (periodic()) {
            const size_t rows = periodicRows(), row = info.channels * run();
            if (rows == 0 || row == 0) return; // no tiles
            period_ = periodOf(row);
            const size_t rows_per_period = period_ / row;
            const size_t min_tile = std::max(kMinRowTile, kMinTilePeriods * period_);
            const size_t tiles = std::clamp<size_t>(rows * row / min_tile, 1, kMaxTiles);
            const size_t per_tile = (rows + tiles - 1) / tiles;
            row_blocks_ = cpu::Blocks::ofSize(rows, (per_tile + rows_per_period - 1) / rows_per_period * rows_per_period);
        } else {
            batch_blocks_ = cpu::Blocks::split(
                info.batch, std::clamp<size_t>(info.batch * info.length / kMinChannelElements, 1, kMaxTiles));
            length_chunks_ = cpu::Blocks::split(
                info.length, std::max<size_t>(1, std::min(kMaxTiles / std::max<size_t>(1, batch_blocks_.count),
                                                          (info.length + kMinChunk - 1) / kMinChunk)));
            const size_t groups = std::max<size_t>(1, batch_blocks_.count * length_chunks_.count);
            const size_t group_elements = batch_blocks_.per_block * length_chunks_.per_block * info.channels;
            channel_blocks_ = cpu::Blocks::split(
                info.channels, std::clamp<size_t>(std::min(kMaxTiles / groups, group_elements / kMinRowTile), 1, kMaxTiles));
        }
        // Scratch is per thread, not per tile: sized for the threads of now, and the sums pass never runs on more.
        slots_ = std::max<size_t>(1, std::min(tiles(), cpu::maxThreads()));
        workspace_ = workspaceOf();
    }

    size_t workspaceSize() const override { return workspace_.value(); }
    bool workspaceOverflows() const override { return workspace_.overflowed(); }

    infiniStatus_t calculate(const Phase &phase, void *workspace, void *grad_input, void *grad_weight,
                             void *grad_bias, const void *input, const void *grad_output, const void *weight,
                             const void *running_mean, const void *running_var, const void *save_mean,
                             const void *save_invstd, void *) const override {
        const ChannelVectors vectors{grad_weight, grad_bias, weight, running_mean, running_var, save_mean, save_invstd};
        if (info.batch * info.length == 0) { // nothing to read (the channels may be a broadcast vector's 2^61)
            finishEmpty(info, phase, vectors);
            return INFINI_STATUS_SUCCESS;
        }
        if (info.dtype == INFINI_DTYPE_F64) {
            runF64(info, phase, vectors, static_cast<double *>(grad_input), static_cast<const double *>(input),
                   static_cast<const double *>(grad_output));
            return INFINI_STATUS_SUCCESS;
        }
        cpu::withNormFloat(info.dtype, [&](auto tag) {
            using T = decltype(tag);
            run(phase, layout(cpu::alignedWorkspace(workspace)), vectors, static_cast<T *>(grad_input),
                static_cast<const T *>(input), static_cast<const T *>(grad_output));
            return 0;
        });
        return INFINI_STATUS_SUCCESS;
    }

  private:
    // An empty batch needs none; F64 runs without any.
    infini::CheckedSize workspaceOf() const {
        if (info.dtype == INFINI_DTYPE_F64 || info.batch * info.length == 0) return 0;
        using infini::CheckedSize;
        const CheckedSize sums = needsSums(info) ? CheckedSize(groups()) * info.channels * 2 : CheckedSize(0);
        const CheckedSize scratch = needsSums(info) ? CheckedSize(slots_) * slotScratchFloats() : CheckedSize(0);
        return cpu::withAlignmentSlack(CheckedSize(info.channels) * sizeof(ChannelStatistics) + sums * sizeof(double) +
                                       (CheckedSize(4) * positions() + scratch) * sizeof(float));
    }

    bool periodic() const {
        return info.layout == Layout::channels_last || info.length < kMinChannelRun;
    }
    // Periodic rows: N*L rows of C channels (channels-last), or N rows of C runs of L (channels-first).
    size_t periodicRows() const {
        return info.layout == Layout::channels_last ? info.batch * info.length : info.batch;
    }
    // Elements of one channel in a row of the position arrays: L for periodic channels-first rows, else 1
    // (channels-last rows, and the per-channel arrays of channels-first tiles).
    size_t run() const { return periodic() && info.layout != Layout::channels_last ? info.length : 1; }
    // Groups of tiles sharing one row of the sums: periodic tiles each have their own.
    size_t groups() const { return periodic() ? row_blocks_.count : batch_blocks_.count * length_chunks_.count; }
    size_t tiles() const { return periodic() ? row_blocks_.count : groups() * channel_blocks_.count; }
    size_t groupOf(size_t tile) const { return periodic() ? tile : tile / channel_blocks_.count; }
    size_t positions() const { return periodic() ? period_ : info.channels; }
    size_t sumsCount() const { return needsSums(info) ? groups() * info.channels * 2 : 0; }
    size_t slotScratchFloats() const {
        return periodic() ? 2 * period_ : channel_blocks_.per_block * kChannelScratchFloats;
    }
    size_t scratchFloats() const { return needsSums(info) ? slots_ * slotScratchFloats() : 0; }

    Workspace layout(void *workspace) const {
        Workspace w;
        w.statistics = static_cast<ChannelStatistics *>(workspace);
        w.sums = reinterpret_cast<double *>(w.statistics + info.channels);
        w.mean = reinterpret_cast<float *>(w.sums + sumsCount());
        w.scale_grad = w.mean + positions();
        w.scale_centered = w.scale_grad + positions();
        w.shift = w.scale_centered + positions();
        w.scratch = w.shift + positions();
        return w;
    }

    // Tiles of a group are consecutive: its channel blocks, each a stretch of memory per batch.
    Tile tile(size_t index) const {
        const size_t group = groupOf(index), channel_block = index % channel_blocks_.count;
        const size_t batch_block = group / length_chunks_.count, chunk = group % length_chunks_.count;
        return Tile{batch_blocks_.begin(batch_block), batch_blocks_.end(batch_block, info.batch),
                    info.channels,                    info.length,
                    length_chunks_.begin(chunk),      length_chunks_.end(chunk, info.length),
                    channel_blocks_.begin(channel_block), channel_blocks_.end(channel_block, info.channels)};
    }

    RowTile rowTile(size_t index) const {
        return RowTile{row_blocks_.begin(index), row_blocks_.end(index, periodicRows()), info.channels, run(), period_};
    }

    // Sets the positions of channel c in `array` (its runs, every C runs) to value.
    void fillChannel(float *array, size_t c, double value) const {
        const size_t run_length = run();
        for (size_t start = c * run_length; start < positions(); start += info.channels * run_length)
            std::fill_n(array + start, run_length, static_cast<float>(value));
    }

    template <typename T>
    void run(const Phase &phase, const Workspace &w, const ChannelVectors &vectors, T *grad_input, const T *input,
             const T *grad_output) const {
        const size_t channels = info.channels;
        // Tiles are fixed by the layout; how many threads share them, by the amount of work (not a result).
        const size_t threads = cpu::threadsFor(info.batch * channels * info.length);
        for (size_t c = 0; c < channels; ++c) {
            w.statistics[c] = channelStatistics(info, vectors, c);
            fillChannel(w.mean, c, w.statistics[c].mean);
        }
        const bool take_sums = needsSums(info) && phase.kind != Phase::elementwise;
        if (take_sums) {
            cpu::parallelForSlots(tiles(), std::min(slots_, threads), [&](size_t t, size_t slot) {
                double *group_sums = w.sums + groupOf(t) * channels * 2;
                float *scratch = w.scratch + slot * slotScratchFloats();
                if (periodic()) {
                    std::fill(group_sums, group_sums + channels * 2, 0.0);
                    cpu::selectedTable<RowKernels<T>>().sums(rowTile(t), grad_output, input, w.mean, scratch,
                                                             group_sums);
                } else {
                    const Tile this_tile = tile(t);
                    std::fill(group_sums + 2 * this_tile.channel_begin, group_sums + 2 * this_tile.channel_end, 0.0);
                    cpu::selectedTable<Kernels<T>>().sums(this_tile, grad_output, input, w.mean, scratch, group_sums);
                }
            });
        }
        // Channels finish by blocks: a block reads each group's sums of its channels as one stretch, where one
        // channel at a time strode through every group's sums (3-7% of the op at 64 tiles x 512 channels). Each
        // channel still adds its groups in order. Finishing the blocks in parallel gained no more here, and
        // its fork cost small shapes a few microseconds.
        const size_t summed_groups = take_sums ? groups() : 0;
        const cpu::Blocks channel_blocks = cpu::Blocks::ofSize(channels, kFinishChannels);
        for (size_t block = 0; block < channel_blocks.count; ++block) {
            const size_t first = channel_blocks.begin(block), count = channel_blocks.end(block, channels) - first;
            double totals[2 * kFinishChannels] = {}; // per channel: sum of grad, sum of grad * centered
            for (size_t g = 0; g < summed_groups; ++g) {
                const double *group_sums = w.sums + (g * channels + first) * 2;
                for (size_t i = 0; i < 2 * count; ++i) totals[i] += group_sums[i];
            }
            for (size_t i = 0; i < count; ++i) {
                const size_t c = first + i;
                const GradInputTerms k = finishChannel(info, phase, vectors, c, w.statistics[c], totals[2 * i],
                                                       totals[2 * i + 1]);
                fillChannel(w.scale_grad, c, k.scale_grad);
                fillChannel(w.scale_centered, c, k.scale_centered);
                fillChannel(w.shift, c, k.shift);
            }
        }
        if (phase.kind == Phase::reduce) return;
        const Coefficients coefficients{w.mean, w.scale_grad, w.scale_centered, w.shift};
        // Contiguous runs of grad_input: periods of periodic rows, or stretches of one channel's length that
        // start at multiples of the length chunk within rows of info.length.
        const size_t run_elements = periodic() ? period_ : std::gcd(info.length, length_chunks_.per_block);
        const bool stream = cpu::streamOutput(grad_input, info.batch * info.channels * info.length * sizeof(T),
                                              run_elements * sizeof(T), sizeof(T));
        cpu::parallelFor(tiles(), [&](size_t t) {
            if (periodic()) {
                const RowKernels<T> &kernels = cpu::selectedTable<RowKernels<T>>();
                info.training ? kernels.apply(rowTile(t), grad_output, input, coefficients, grad_input, stream)
                              : kernels.scale(rowTile(t), grad_output, w.scale_grad, grad_input, stream);
            } else {
                const Kernels<T> &kernels = cpu::selectedTable<Kernels<T>>();
                info.training ? kernels.apply(tile(t), grad_output, input, coefficients, grad_input, stream)
                              : kernels.scale(tile(t), grad_output, w.scale_grad, grad_input, stream);
            }
        }, threads);
    }

    // Channels-first tiles.
    cpu::Blocks batch_blocks_{1, 0}, length_chunks_{1, 0}, channel_blocks_{1, 0};
    // Periodic tiles.
    cpu::Blocks row_blocks_{1, 0};
    size_t period_ = 0;
    size_t slots_ = 1; // threads the sums pass may use, each with its own scratch
    infini::CheckedSize workspace_;
};

} // namespace

infiniStatus_t Backends::cpu(const Info &info, int device_id, Descriptor **desc) {
    *desc = new CpuDescriptor(device_id, info);
    return INFINI_STATUS_SUCCESS;
}

} // namespace op::batch_norm_backward
