#include "batch_norm_backward_channels.h"

#include "devices/cpu/half.h"

#include <cmath>

namespace op::batch_norm_backward {

double element(const void *vector, infiniDtype_t dtype, ptrdiff_t stride, size_t c) {
    const ptrdiff_t i = static_cast<ptrdiff_t>(c) * stride;
    switch (dtype) {
    case INFINI_DTYPE_F16: return cpu::toFloat(static_cast<const cpu::f16_t *>(vector)[i]);
    case INFINI_DTYPE_BF16: return cpu::toFloat(static_cast<const cpu::bf16_t *>(vector)[i]);
    case INFINI_DTYPE_F32: return static_cast<const float *>(vector)[i];
    default: return static_cast<const double *>(vector)[i];
    }
}

void store(void *vector, infiniDtype_t dtype, ptrdiff_t stride, size_t c, double value) {
    const ptrdiff_t i = static_cast<ptrdiff_t>(c) * stride;
    switch (dtype) {
    case INFINI_DTYPE_F16: static_cast<cpu::f16_t *>(vector)[i] = cpu::fromFloat<cpu::f16_t>(static_cast<float>(value)); break;
    case INFINI_DTYPE_BF16: static_cast<cpu::bf16_t *>(vector)[i] = cpu::fromFloat<cpu::bf16_t>(static_cast<float>(value)); break;
    case INFINI_DTYPE_F32: static_cast<float *>(vector)[i] = static_cast<float>(value); break;
    default: static_cast<double *>(vector)[i] = value; break;
    }
}

ChannelStatistics channelStatistics(const Info &info, const ChannelVectors &vectors, size_t c) {
    ChannelStatistics s;
    if (info.usesRunning()) {
        s.mean = element(vectors.running_mean, info.parameter_dtype, info.running_mean_stride, c);
        s.invstd = 1.0 / std::sqrt(element(vectors.running_var, info.parameter_dtype, info.running_var_stride, c) +
                                   info.epsilon);
    } else {
        s.mean = element(vectors.save_mean, info.statistic_dtype, info.save_mean_stride, c);
        s.invstd = element(vectors.save_invstd, info.statistic_dtype, info.save_invstd_stride, c);
    }
    s.weight = vectors.weight != nullptr ? element(vectors.weight, info.parameter_dtype, info.weight_stride, c) : 1.0;
    return s;
}

GradInputTerms finishChannel(const Info &info, const Phase &phase, const ChannelVectors &vectors, size_t c,
                             const ChannelStatistics &statistics, double sum_grad, double sum_grad_centered) {
    const double invstd = statistics.invstd;
    const infiniDtype_t sum_dtype = info.statistic_dtype;
    if (phase.kind == Phase::elementwise) {
        sum_grad = element(phase.sum_grad, sum_dtype, 1, c);
        sum_grad_centered = element(phase.sum_grad_centered, sum_dtype, 1, c);
    } else {
        if (vectors.grad_bias != nullptr) store(vectors.grad_bias, info.parameter_dtype, info.grad_bias_stride, c, sum_grad);
        if (vectors.grad_weight != nullptr) {
            // 0 for an empty channel even when invstd is inf (no samples, nothing to scale).
            store(vectors.grad_weight, info.parameter_dtype, info.grad_weight_stride, c,
                  info.batch * info.length > 0 ? sum_grad_centered * invstd : 0.0);
        }
        if (phase.kind == Phase::reduce) {
            store(phase.sum_grad, sum_dtype, 1, c, sum_grad);
            store(phase.sum_grad_centered, sum_dtype, 1, c, sum_grad_centered);
            return GradInputTerms{};
        }
        if (sum_dtype == INFINI_DTYPE_F32) { // what reduce hands to elementwise
            sum_grad = static_cast<float>(sum_grad);
            sum_grad_centered = static_cast<float>(sum_grad_centered);
        }
    }
    const double count = phase.count;
    const double scale = statistics.weight * invstd;
    if (!info.training || count == 0) return GradInputTerms{scale, 0.0, 0.0}; // eval: statistics are constants
    return GradInputTerms{scale, -scale * invstd * invstd * sum_grad_centered / count, -scale * sum_grad / count};
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
