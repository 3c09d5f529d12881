// BatchNorm backward on the CPU: the per-channel step shared by every path, in F64. It reads the channel's
// statistics and weight (any parameter dtype), writes grad_weight / grad_bias from the channel's sums, and
// gives the terms of grad_input = scale_grad * grad_output + scale_centered * (x - mean) + shift.
#ifndef INFINIOP_SRC_OPS_BATCH_NORM_BACKWARD_CPU_CHANNELS_H
#define INFINIOP_SRC_OPS_BATCH_NORM_BACKWARD_CPU_CHANNELS_H

#include "../batch_norm_backward.h"

namespace op::batch_norm_backward {

// The caller's per-channel vectors; NULL for those absent or not used by the run's phase (never touched).
struct ChannelVectors {
    void *grad_weight, *grad_bias;
    const void *weight, *running_mean, *running_var, *save_mean, *save_invstd;
};

struct ChannelStatistics {
    double mean, invstd, weight;
};

struct GradInputTerms {
    double scale_grad, scale_centered, shift;
};

// Element c of a per-channel vector of `dtype` (F16, BF16, F32 or F64) and `stride`, read as F64 or written from
// it (narrowed through F32 for the 16-bit dtypes, as the kernels store F32 results). The forward's too.
double element(const void *vector, infiniDtype_t dtype, ptrdiff_t stride, size_t c);
void store(void *vector, infiniDtype_t dtype, ptrdiff_t stride, size_t c, double value);

// mean and invstd (from the saved or the running statistics, see the public header) and weight of channel c.
ChannelStatistics channelStatistics(const Info &info, const ChannelVectors &vectors, size_t c);

// What the run's phase does with channel c, given this run's sum(grad_output) and sum(grad_output * (x - mean))
// over the channel (unused in the elementwise phase, which reads the totals of all processes instead): writes
// grad_weight[c] and grad_bias[c] (those set) from them; in the reduce phase also the sums, narrowed to the
// statistics dtype. Returns the channel's grad_input terms, computed from the sums in the statistics dtype (so
// that the whole run and reduce + elementwise agree bit for bit) over phase.count elements.
GradInputTerms finishChannel(const Info &info, const Phase &phase, const ChannelVectors &vectors, size_t c,
                             const ChannelStatistics &statistics, double sum_grad, double sum_grad_centered);

// An empty batch (N * L = 0): grad_weight, grad_bias and the reduce phase's sums (those set) are zero; nothing
// else is read or written.
void finishEmpty(const Info &info, const Phase &phase, const ChannelVectors &vectors);

// Whether the sums pass is needed: training's grad_input needs it, eval's only for grad_weight / grad_bias.
inline bool needsSums(const Info &info) { return info.training || info.has_grad_weight || info.has_grad_bias; }

} // namespace op::batch_norm_backward

#endif
