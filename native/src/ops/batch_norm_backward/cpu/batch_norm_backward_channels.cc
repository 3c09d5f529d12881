#include "batch_norm_backward_channels.h"

#include "devices/cpu/half.h"

#include <algorithm>
#include <cmath>

namespace op::batch_norm_backward {

namespace {

template <typename T>
double widened(T value) {
    return cpu::toFloat(value);
}
double widened(float value) { return value; }
double widened(double value) { return value; }

template <typename T>
T narrowed(double value) {
    return cpu::fromFloat<T>(static_cast<float>(value));
}
template <>
float narrowed<float>(double value) {
    return static_cast<float>(value);
}
template <>
double narrowed<double>(double value) {
    return value;
}

// body(tag) with a value of the C type of `dtype` (F16, BF16, F32 or F64).
template <typename Body>
void withChannelType(infiniDtype_t dtype, Body &&body) {
    switch (dtype) {
    case INFINI_DTYPE_F16: body(cpu::f16_t{}); break;
    case INFINI_DTYPE_BF16: body(cpu::bf16_t{}); break;
    case INFINI_DTYPE_F32: body(float{}); break;
    default: body(double{}); break;
    }
}

} // namespace

void loadChannels(double *out, const void *vector, infiniDtype_t dtype, ptrdiff_t stride, size_t first,
                  size_t count, double absent) {
    if (vector == nullptr) {
        std::fill_n(out, count, absent);
        return;
    }
    withChannelType(dtype, [&](auto tag) {
        const auto *values = static_cast<const decltype(tag) *>(vector) + static_cast<ptrdiff_t>(first) * stride;
        for (size_t i = 0; i < count; ++i) out[i] = widened(values[static_cast<ptrdiff_t>(i) * stride]);
    });
}

void storeChannels(void *vector, infiniDtype_t dtype, ptrdiff_t stride, size_t first, size_t count,
                   const double *values) {
    if (vector == nullptr) return;
    withChannelType(dtype, [&](auto tag) {
        using T = decltype(tag);
        T *out = static_cast<T *>(vector) + static_cast<ptrdiff_t>(first) * stride;
        for (size_t i = 0; i < count; ++i) out[static_cast<ptrdiff_t>(i) * stride] = narrowed<T>(values[i]);
    });
}

void channelStatistics(const Info &info, const ChannelVectors &vectors, size_t first, size_t count,
                       ChannelStatistics *out) {
    double mean[kChannelBlock], spread[kChannelBlock], weight[kChannelBlock];
    for (size_t done = 0; done < count; done += kChannelBlock) {
        const size_t at = first + done, n = std::min(kChannelBlock, count - done);
        loadChannels(weight, vectors.weight, info.parameter_dtype, info.weight_stride, at, n, 1.0);
        if (info.usesRunning()) {
            loadChannels(mean, vectors.running_mean, info.parameter_dtype, info.running_mean_stride, at, n, 0.0);
            loadChannels(spread, vectors.running_var, info.parameter_dtype, info.running_var_stride, at, n, 0.0);
            for (size_t i = 0; i < n; ++i) spread[i] = 1.0 / std::sqrt(spread[i] + info.epsilon);
        } else {
            loadChannels(mean, vectors.save_mean, info.statistic_dtype, info.save_mean_stride, at, n, 0.0);
            loadChannels(spread, vectors.save_invstd, info.statistic_dtype, info.save_invstd_stride, at, n, 0.0);
        }
        for (size_t i = 0; i < n; ++i) out[done + i] = ChannelStatistics{mean[i], spread[i], weight[i]};
    }
}

void finishChannels(const Info &info, const Phase &phase, const ChannelVectors &vectors, size_t first, size_t count,
                    const ChannelStatistics *statistics, const double *totals, GradInputTerms &out) {
    double sum_grad[kChannelBlock], sum_grad_centered[kChannelBlock];
    const infiniDtype_t sum_dtype = info.statistic_dtype;
    if (phase.kind == Phase::elementwise) {
        loadChannels(sum_grad, phase.sum_grad, sum_dtype, 1, first, count, 0.0);
        loadChannels(sum_grad_centered, phase.sum_grad_centered, sum_dtype, 1, first, count, 0.0);
    } else {
        for (size_t i = 0; i < count; ++i) {
            sum_grad[i] = totals[2 * i];
            sum_grad_centered[i] = totals[2 * i + 1];
        }
        storeChannels(vectors.grad_bias, info.parameter_dtype, info.grad_bias_stride, first, count, sum_grad);
        if (vectors.grad_weight != nullptr) {
            // 0 for an empty channel even when invstd is inf (no samples, nothing to scale).
            const bool samples = info.batch * info.length > 0;
            double grad_weight[kChannelBlock];
            for (size_t i = 0; i < count; ++i) {
                grad_weight[i] = samples ? sum_grad_centered[i] * statistics[i].invstd : 0.0;
            }
            storeChannels(vectors.grad_weight, info.parameter_dtype, info.grad_weight_stride, first, count,
                          grad_weight);
        }
        if (phase.kind == Phase::reduce) {
            storeChannels(phase.sum_grad, sum_dtype, 1, first, count, sum_grad);
            storeChannels(phase.sum_grad_centered, sum_dtype, 1, first, count, sum_grad_centered);
            out = GradInputTerms{};
            return;
        }
        if (sum_dtype == INFINI_DTYPE_F32) { // what reduce hands to elementwise
            for (size_t i = 0; i < count; ++i) {
                sum_grad[i] = static_cast<float>(sum_grad[i]);
                sum_grad_centered[i] = static_cast<float>(sum_grad_centered[i]);
            }
        }
    }
    const double elements = phase.count;
    const bool constants = !info.training || elements == 0; // eval: the statistics are constants
    for (size_t i = 0; i < count; ++i) {
        const double invstd = statistics[i].invstd, scale = statistics[i].weight * invstd;
        out.scale_grad[i] = scale;
        out.scale_centered[i] = constants ? 0.0 : -scale * invstd * invstd * sum_grad_centered[i] / elements;
        out.shift[i] = constants ? 0.0 : -scale * sum_grad[i] / elements;
    }
}

void finishEmpty(const Info &info, const Phase &phase, const ChannelVectors &vectors) {
    const bool any = vectors.grad_bias != nullptr || vectors.grad_weight != nullptr || phase.kind == Phase::reduce;
    if (phase.kind == Phase::elementwise || !any) return; // nothing to write: no loop over the channels
    for (size_t c = 0; c < info.channels; ++c) {
        if (vectors.grad_bias != nullptr) store(vectors.grad_bias, info.parameter_dtype, info.grad_bias_stride, c, 0.0);
        if (vectors.grad_weight != nullptr) {
            store(vectors.grad_weight, info.parameter_dtype, info.grad_weight_stride, c, 0.0);
        }
        if (phase.kind == Phase::reduce) {
            store(phase.sum_grad, info.statistic_dtype, 1, c, 0.0);
            store(phase.sum_grad_centered, info.statistic_dtype, 1, c, 0.0);
        }
    }
}

} // namespace op::batch_norm_backward
