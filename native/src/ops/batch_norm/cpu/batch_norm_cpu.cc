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

using batch_norm_backward::element;
using batch_norm_backward::store;
using batch_norm_backward::Tiling;

// The caller's per-channel vectors; NULL where absent (never touched).
struct ChannelVectors {
    void *save_mean, *save_invstd, *running_mean, *running_var;
    const void *weight, *bias;
};

// y = (x - reference) * scale + shift for channel c.
struct ChannelTerms {
    double reference, scale, shift;
};

// Channel c's terms from its shifted sums (training; count elements, reference r), after writing its saved
// statistics and updating its running ones; or from the running statistics (eval).
ChannelTerms finishChannel(const Info &info, const ChannelVectors &v, size_t c, double reference, double sum,
                           double sum_squares) {
    const double weight = v.weight != nullptr ? element(v.weight, info.parameter_dtype, info.weight_stride, c) : 1.0;
    const double bias = v.bias != nullptr ? element(v.bias, info.parameter_dtype, info.bias_stride, c) : 0.0;
    if (!info.training) {
        const double mean = element(v.running_mean, info.parameter_dtype, info.running_mean_stride, c);
        const double var = element(v.running_var, info.parameter_dtype, info.running_var_stride, c);
        return ChannelTerms{mean, weight / std::sqrt(var + info.epsilon), bias};
    }
    const double count = static_cast<double>(info.batch * info.length);
    const double offset = sum / count; // mean - reference
    const double mean = reference + offset;
    const double var = biasedVariance(sum_squares / count, offset);
    const double invstd = 1.0 / std::sqrt(var + info.epsilon);
    if (v.save_mean != nullptr) store(v.save_mean, info.statistic_dtype, info.save_mean_stride, c, mean);
    if (v.save_invstd != nullptr) store(v.save_invstd, info.statistic_dtype, info.save_invstd_stride, c, invstd);
    if (v.running_mean != nullptr) {
        const double m = info.momentum;
        const double old_mean = element(v.running_mean, info.parameter_dtype, info.running_mean_stride, c);
        const double old_var = element(v.running_var, info.parameter_dtype, info.running_var_stride, c);
        store(v.running_mean, info.parameter_dtype, info.running_mean_stride, c, (1.0 - m) * old_mean + m * mean);
        store(v.running_var, info.parameter_dtype, info.running_var_stride, c,
              (1.0 - m) * old_var + m * var * count / (count - 1.0));
    }
    const double scale = weight * invstd;
    return ChannelTerms{reference, scale, bias - offset * scale};
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

    // Offset of x's element (n = 0, c, l = 0): the channel's reference.
    size_t firstOf(size_t c) const { return info.layout == Layout::channels_last ? c : c * info.length; }

    template <typename T>
    void run(const Workspace &w, const ChannelVectors &vectors, T *y, const T *x) const {
        const size_t channels = info.channels;
        // Tiles are fixed by the layout; how many threads share them, by the amount of work (not a result).
        const size_t threads = cpu::threadsFor(info.elements());
        if (info.training) {
            for (size_t c = 0; c < channels; ++c) tiling_.fillChannel(w.reference, c, cpu::toFloat(x[firstOf(c)]));
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
        const size_t groups = info.training ? tiling_.groups() : 0;
        for (size_t c = 0; c < channels; ++c) {
            double sum = 0.0, sum_squares = 0.0;
            for (size_t g = 0; g < groups; ++g) { // in group order: the same bits for any thread count
                sum += w.sums[(g * channels + c) * 2];
                sum_squares += w.sums[(g * channels + c) * 2 + 1];
            }
            const double reference = info.training ? cpu::toFloat(x[firstOf(c)]) : 0.0;
            const ChannelTerms k = finishChannel(info, vectors, c, reference, sum, sum_squares);
            tiling_.fillChannel(w.reference, c, k.reference);
            tiling_.fillChannel(w.scale, c, k.scale);
            tiling_.fillChannel(w.shift, c, k.shift);
        }
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
            const ChannelTerms k = finishChannel(info, vectors, c, reference, sum, sum_squares);
            for (size_t n = 0; n < batch; ++n) {
                for (size_t l = 0, i = base(n); l < length; ++l, i += step) {
                    y[i] = (x[i] - k.reference) * k.scale + k.shift;
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
