// BatchNorm backward on the CPU, in two passes over fixed tiles: pass 1 sums grad_output and
// grad_output*(x - mean) per channel into each tile group's F64 partials, which are then added in group order;
// pass 2 writes grad_input = scale_grad*grad_output + scale_centered*(x - mean) + shift per channel.
// Tiles (batch_norm_tiling.h) depend on the shape only, so results do not depend on the thread count. F64 takes
// a scalar path of its own (batch_norm_backward_f64.h).
#include "../batch_norm_backward.h"

#include "batch_norm_backward_channels.h"
#include "batch_norm_backward_f64.h"
#include "batch_norm_backward_simd.h"
#include "batch_norm_tiling.h"
#include "devices/cpu/half.h"
#include "devices/cpu/parallel.h"
#include "devices/cpu/row_hints.h"
#include "devices/cpu/workspace.h"

#include <algorithm>
#include <numeric>

namespace op::batch_norm_backward {
namespace {

// Where each piece of a float-path call lives in the workspace.
struct Workspace {
    ChannelStatistics *statistics; // per channel
    double *sums;                  // [group][channel][2], a group's tiles taking disjoint channels
    float *mean, *scale_grad, *scale_centered, *shift; // per position: position p is channel p % C
    float *scratch;                // per slot: the sums pass runs on at most slots_ threads
};

class CpuDescriptor final : public Descriptor {
  public:
    CpuDescriptor(int device_id, const Info &info)
        : Descriptor(INFINI_DEVICE_CPU, device_id, info),
          tiling_(info.batch, info.channels, info.length, info.layout) {
        // Scratch is per thread, not per tile: sized for the threads of now, and the sums pass never runs on more.
        slots_ = std::max<size_t>(1, std::min(tiling_.tiles(), cpu::maxThreads()));
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
        const CheckedSize sums = needsSums(info) ? CheckedSize(tiling_.groups()) * info.channels * 2 : CheckedSize(0);
        const CheckedSize scratch = needsSums(info) ? CheckedSize(slots_) * tiling_.slotScratchFloats() : CheckedSize(0);
        return cpu::withAlignmentSlack(CheckedSize(info.channels) * sizeof(ChannelStatistics) + sums * sizeof(double) +
                                       (CheckedSize(4) * tiling_.positions() + scratch) * sizeof(float));
    }

    size_t sumsCount() const { return needsSums(info) ? tiling_.groups() * info.channels * 2 : 0; }
    size_t scratchFloats() const { return needsSums(info) ? slots_ * tiling_.slotScratchFloats() : 0; }

    Workspace layout(void *workspace) const {
        Workspace w;
        w.statistics = static_cast<ChannelStatistics *>(workspace);
        w.sums = reinterpret_cast<double *>(w.statistics + info.channels);
        w.mean = reinterpret_cast<float *>(w.sums + sumsCount());
        w.scale_grad = w.mean + tiling_.positions();
        w.scale_centered = w.scale_grad + tiling_.positions();
        w.shift = w.scale_centered + tiling_.positions();
        w.scratch = w.shift + tiling_.positions();
        return w;
    }

    template <typename T>
    void run(const Phase &phase, const Workspace &w, const ChannelVectors &vectors, T *grad_input, const T *input,
             const T *grad_output) const {
        const size_t channels = info.channels;
        // Tiles are fixed by the layout; how many threads share them, by the amount of work (not a result).
        const size_t threads = cpu::threadsFor(info.batch * channels * info.length);
        channelStatistics(info, vectors, 0, channels, w.statistics);
        for (size_t first = 0; first < channels; first += kChannelBlock) {
            const size_t count = std::min(kChannelBlock, channels - first);
            double mean[kChannelBlock];
            for (size_t i = 0; i < count; ++i) mean[i] = w.statistics[first + i].mean;
            tiling_.fillChannels(w.mean, first, count, mean);
        }
        const bool take_sums = needsSums(info) && phase.kind != Phase::elementwise;
        if (take_sums) {
            cpu::parallelForSlots(tiling_.tiles(), std::min(slots_, threads), [&](size_t t, size_t slot) {
                double *group_sums = w.sums + tiling_.groupOf(t) * channels * 2;
                float *scratch = w.scratch + slot * tiling_.slotScratchFloats();
                if (tiling_.periodic()) {
                    std::fill(group_sums, group_sums + channels * 2, 0.0);
                    cpu::selectedTable<RowKernels<T>>().sums(tiling_.rowTile(t), grad_output, input, w.mean, scratch,
                                                             group_sums);
                } else {
                    const Tile this_tile = tiling_.tile(t);
                    std::fill(group_sums + 2 * this_tile.channel_begin, group_sums + 2 * this_tile.channel_end, 0.0);
                    cpu::selectedTable<Kernels<T>>().sums(this_tile, grad_output, input, w.mean, scratch, group_sums);
                }
            });
        }
        tiling_.finishChannels(w.sums, take_sums ? tiling_.groups() : 0, [&](size_t first, size_t count,
                                                                             const double *totals) {
            GradInputTerms terms;
            finishChannels(info, phase, vectors, first, count, w.statistics + first, totals, terms);
            tiling_.fillChannels(w.scale_grad, first, count, terms.scale_grad);
            tiling_.fillChannels(w.scale_centered, first, count, terms.scale_centered);
            tiling_.fillChannels(w.shift, first, count, terms.shift);
        });
        if (phase.kind == Phase::reduce) return;
        const Coefficients coefficients{w.mean, w.scale_grad, w.scale_centered, w.shift};
        const size_t run_elements = tiling_.runElements(); // contiguous runs of grad_input
        const bool stream = cpu::streamOutput(grad_input, info.batch * info.channels * info.length * sizeof(T),
                                              run_elements * sizeof(T), sizeof(T));
        cpu::parallelFor(tiling_.tiles(), [&](size_t t) {
            if (tiling_.periodic()) {
                const RowKernels<T> &kernels = cpu::selectedTable<RowKernels<T>>();
                info.training ? kernels.apply(tiling_.rowTile(t), grad_output, input, coefficients, grad_input, stream)
                              : kernels.scale(tiling_.rowTile(t), grad_output, w.scale_grad, grad_input, stream);
            } else {
                const Kernels<T> &kernels = cpu::selectedTable<Kernels<T>>();
                info.training ? kernels.apply(tiling_.tile(t), grad_output, input, coefficients, grad_input, stream)
                              : kernels.scale(tiling_.tile(t), grad_output, w.scale_grad, grad_input, stream);
            }
        }, threads);
    }

    Tiling tiling_;
    size_t slots_ = 1; // threads the sums pass may use, each with its own scratch
    infini::CheckedSize workspace_;
};

} // namespace

infiniStatus_t Backends::cpu(const Info &info, int device_id, Descriptor **desc) {
    *desc = new CpuDescriptor(device_id, info);
    return INFINI_STATUS_SUCCESS;
}

} // namespace op::batch_norm_backward
