// BatchNorm forward on the CPU, over the backward's fixed tiles (batch_norm_tiling.h), so results do not depend
// on the thread count. Training: pass 1 takes per channel the shifted sums sum(x - r) and sum((x - r)^2), r the
// channel's first element (so a channel whose mean is large against its spread loses no precision to
// cancellation), into each tile group's F64 partials, added in group order; pass 2 writes
// y = (x - r) * scale + shift. x is read twice, y written once. Eval: pass 2 alone, r = running_mean. F64 takes a
// scalar path, one channel per task.
#include "../batch_norm.h"

#include "batch_norm_simd.h"
#include "common/moments.h"
#include "devices/cpu/half.h"
#include "devices/cpu/parallel.h"
#include "devices/cpu/row_hints.h"
#include "devices/cpu/workspace.h"
#include "ops/batch_norm_backward/cpu/batch_norm_backward_channels.h"
#include "ops/batch_norm_backward/cpu/batch_norm_tiling.h"

#include <algorithm>
#include <cmath>

namespace op::batch_norm {
namespace {

using batch_norm_backward::kChannelBlock;
using batch_norm_backward::loadChannels;
using batch_norm_backward::store;
using batch_norm_backward::storeChannels;
using batch_norm_backward::Tiling;

// The caller's per-channel vectors; NULL where absent (never touched).
struct ChannelVectors {
    void *save_mean, *save_invstd, *running_mean, *running_var;
    const void *weight, *bias;
};

// y = (x - reference) * scale + shift, per channel of a block (batch_norm_backward_channels.h: the per-channel
// steps run on blocks of channels).
struct ChannelTerms {
    double reference[kChannelBlock], scale[kChannelBlock], shift[kChannelBlock];
};

// Channels [first, first + count)'s terms (count <= kChannelBlock). Training: from their shifted sums,
// totals[2 * i] and totals[2 * i + 1] over N * L elements shifted by reference[i], after writing their saved
// statistics and updating their running ones. Eval: from the running statistics (`reference` unused).
void finishChannels(const Info &info, const ChannelVectors &v, size_t first, size_t count, const double *reference,
                    const double *totals, ChannelTerms &terms) {
    double weight[kChannelBlock], bias[kChannelBlock], mean[kChannelBlock], var[kChannelBlock];
    loadChannels(weight, v.weight, info.parameter_dtype, info.weight_stride, first, count, 1.0);
    loadChannels(bias, v.bias, info.parameter_dtype, info.bias_stride, first, count, 0.0);
    if (!info.training) {
        loadChannels(terms.reference, v.running_mean, info.parameter_dtype, info.running_mean_stride, first, count,
                     0.0);
        loadChannels(var, v.running_var, info.parameter_dtype, info.running_var_stride, first, count, 0.0);
        for (size_t i = 0; i < count; ++i) {
            terms.scale[i] = weight[i] / std::sqrt(var[i] + info.epsilon);
            terms.shift[i] = bias[i];
        }
        return;
    }
    const double elements = static_cast<double>(info.batch * info.length);
    double invstd[kChannelBlock];
    for (size_t i = 0; i < count; ++i) {
        const double offset = totals[2 * i] / elements; // mean - reference
        mean[i] = reference[i] + offset;
        var[i] = biasedVariance(totals[2 * i + 1] / elements, offset);
        invstd[i] = 1.0 / std::sqrt(var[i] + info.epsilon);
        const double scale = weight[i] * invstd[i];
        terms.reference[i] = reference[i];
        terms.scale[i] = scale;
        terms.shift[i] = bias[i] - offset * scale;
    }
    storeChannels(v.save_mean, info.statistic_dtype, info.save_mean_stride, first, count, mean);
    storeChannels(v.save_invstd, info.statistic_dtype, info.save_invstd_stride, first, count, invstd);
    if (v.running_mean != nullptr) {
        const double m = info.momentum;
        double old[kChannelBlock];
        loadChannels(old, v.running_mean, info.parameter_dtype, info.running_mean_stride, first, count, 0.0);
        for (size_t i = 0; i < count; ++i) old[i] = (1.0 - m) * old[i] + m * mean[i];
        storeChannels(v.running_mean, info.parameter_dtype, info.running_mean_stride, first, count, old);
        loadChannels(old, v.running_var, info.parameter_dtype, info.running_var_stride, first, count, 0.0);
        for (size_t i = 0; i < count; ++i) old[i] = (1.0 - m) * old[i] + m * var[i] * elements / (elements - 1.0);
        storeChannels(v.running_var, info.parameter_dtype, info.running_var_stride, first, count, old);
    }
}

// An empty batch (N * L = 0) has no statistics: the saved ones get mean 0 and a variance of 0; the running ones
// are left as they are, as PyTorch leaves them.
void finishEmpty(const Info &info, const ChannelVectors &v) {
    if (!info.training || (v.save_mean == nullptr && v.save_invstd == nullptr)) return;
    for (size_t c = 0; c < info.channels; ++c) {
        if (v.save_mean != nullptr) store(v.save_mean, info.statistic_dtype, info.save_mean_stride, c, 0.0);
        if (v.save_invstd != nullptr) {
            store(v.save_invstd, info.statistic_dtype, info.save_invstd_stride, c, 1.0 / std::sqrt(info.epsilon));
        }
    }
}

// Where each piece of a float-path call lives in the workspace.
struct Workspace {
    double *sums;                      // [group][channel][2], a group's tiles taking disjoint channels
    float *reference, *scale, *shift;  // per position
    float *scratch;                    // per slot: the sums pass runs on at most slots_ threads
};

class CpuDescriptor final : public Descriptor {
  public:
    CpuDescriptor(int device_id, const Info &info)
        : Descriptor(INFINI_DEVICE_CPU, device_id, info), tiling_(info.batch, info.channels, info.length, info.layout) {
        // Scratch is per thread, not per tile: sized for the threads of now, and the sums pass never runs on more.
        slots_ = std::max<size_t>(1, std::min(tiling_.tiles(), cpu::maxThreads()));
        workspace_ = workspaceOf();
    }

    size_t workspaceSize() const override { return workspace_.value(); }
    bool workspaceOverflows() const override { return workspace_.overflowed(); }

    infiniStatus_t calculate(void *workspace, void *y, void *save_mean, void *save_invstd, void *running_mean,
                             void *running_var, const void *x, const void *weight, const void *bias,
                             void *) const override {
        const ChannelVectors vectors{save_mean, save_invstd, running_mean, running_var, weight, bias};
        if (info.batch * info.length == 0) { // nothing to read (the channels may be a broadcast vector's 2^61)
            finishEmpty(info, vectors);
            return INFINI_STATUS_SUCCESS;
        }
        if (info.dtype == INFINI_DTYPE_F64) {
            runF64(vectors, static_cast<double *>(y), static_cast<const double *>(x));
            return INFINI_STATUS_SUCCESS;
        }
        cpu::withNormFloat(info.dtype, [&](auto tag) {
            using T = decltype(tag);
            run(layout(cpu::alignedWorkspace(workspace)), vectors, static_cast<T *>(y), static_cast<const T *>(x));
            return 0;
        });
        return INFINI_STATUS_SUCCESS;
    }

  private:
    // An empty batch needs none; F64 runs without any.
    infini::CheckedSize workspaceOf() const {
        if (info.dtype == INFINI_DTYPE_F64 || info.batch * info.length == 0) return 0;
        using infini::CheckedSize;
        return cpu::withAlignmentSlack(CheckedSize(sumsCount()) * sizeof(double) +
                                       (CheckedSize(3) * tiling_.positions() + scratchFloats()) * sizeof(float));
    }

    size_t sumsCount() const { return info.training ? tiling_.groups() * info.channels * 2 : 0; }
    size_t scratchFloats() const { return info.training ? slots_ * tiling_.slotScratchFloats() : 0; }

    Workspace layout(void *workspace) const {
        Workspace w;
        w.sums = static_cast<double *>(workspace);
        w.reference = reinterpret_cast<float *>(w.sums + sumsCount());
        w.scale = w.reference + tiling_.positions();
        w.shift = w.scale + tiling_.positions();
        w.scratch = w.shift + tiling_.positions();
        return w;
    }

    // The shifts of channels [first, first + count): each channel's first element (n = 0, l = 0).
    template <typename T>
    void references(const T *x, size_t first, size_t count, double *out) const {
        const size_t step = info.layout == Layout::channels_last ? 1 : info.length;
        for (size_t i = 0; i < count; ++i) out[i] = cpu::toFloat(x[(first + i) * step]);
    }

    template <typename T>
    void run(const Workspace &w, const ChannelVectors &vectors, T *y, const T *x) const {
        const size_t channels = info.channels;
        // Tiles are fixed by the layout; how many threads share them, by the amount of work (not a result).
        const size_t threads = cpu::threadsFor(info.elements());
        if (info.training) {
            for (size_t first = 0; first < channels; first += kChannelBlock) {
                double reference[kChannelBlock];
                const size_t count = std::min(kChannelBlock, channels - first);
                references(x, first, count, reference);
                tiling_.fillChannels(w.reference, first, count, reference);
            }
            cpu::parallelForSlots(tiling_.tiles(), std::min(slots_, threads), [&](size_t t, size_t slot) {
                double *group_sums = w.sums + tiling_.groupOf(t) * channels * 2;
                float *scratch = w.scratch + slot * tiling_.slotScratchFloats();
                if (tiling_.periodic()) {
                    std::fill(group_sums, group_sums + channels * 2, 0.0);
                    cpu::selectedTable<RowKernels<T>>().sums(tiling_.rowTile(t), x, w.reference, scratch, group_sums);
                } else {
                    const Tile tile = tiling_.tile(t);
                    std::fill(group_sums + 2 * tile.channel_begin, group_sums + 2 * tile.channel_end, 0.0);
                    cpu::selectedTable<Kernels<T>>().sums(tile, x, w.reference, scratch, group_sums);
                }
            });
        }
        tiling_.finishChannels(w.sums, info.training ? tiling_.groups() : 0, [&](size_t first, size_t count,
                                                                                 const double *totals) {
            double reference[kChannelBlock];
            if (info.training) references(x, first, count, reference);
            ChannelTerms terms;
            finishChannels(info, vectors, first, count, reference, totals, terms);
            tiling_.fillChannels(w.reference, first, count, terms.reference);
            tiling_.fillChannels(w.scale, first, count, terms.scale);
            tiling_.fillChannels(w.shift, first, count, terms.shift);
        });
        const Coefficients coefficients{w.reference, w.scale, w.shift};
        const bool stream = cpu::streamOutput(y, info.elements() * sizeof(T), tiling_.runElements() * sizeof(T),
                                              sizeof(T));
        cpu::parallelFor(tiling_.tiles(), [&](size_t t) {
            if (tiling_.periodic()) {
                cpu::selectedTable<RowKernels<T>>().apply(tiling_.rowTile(t), x, coefficients, y, stream);
            } else {
                cpu::selectedTable<Kernels<T>>().apply(tiling_.tile(t), x, coefficients, y, stream);
            }
        }, threads);
    }

    // F64 throughout, for reference-grade use: one channel per task, its sums taken in (n, l) order.
    void runF64(const ChannelVectors &vectors, double *y, const double *x) const {
        const size_t batch = info.batch, channels = info.channels, length = info.length;
        const bool channels_last = info.layout == Layout::channels_last;
        cpu::parallelFor(channels, [&](size_t c) {
            // Offset of (n, c, l) is base(n) + l * step.
            const size_t step = channels_last ? channels : 1;
            auto base = [&](size_t n) { return channels_last ? n * length * channels + c : (n * channels + c) * length; };
            const double reference = info.training ? x[base(0)] : 0.0;
            double sum = 0.0, sum_squares = 0.0;
            if (info.training) {
                for (size_t n = 0; n < batch; ++n) {
                    for (size_t l = 0, i = base(n); l < length; ++l, i += step) {
                        const double d = x[i] - reference;
                        sum += d;
                        sum_squares += d * d;
                    }
                }
            }
            const double totals[2] = {sum, sum_squares};
            ChannelTerms k;
            finishChannels(info, vectors, c, 1, &reference, totals, k);
            for (size_t n = 0; n < batch; ++n) {
                for (size_t l = 0, i = base(n); l < length; ++l, i += step) {
                    y[i] = (x[i] - k.reference[0]) * k.scale[0] + k.shift[0];
                }
            }
        }, cpu::threadsFor(batch * channels * length));
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

} // namespace op::batch_norm
