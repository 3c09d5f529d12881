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

// The per-channel steps run on blocks of up to kChannelBlock channels, over arrays: one channel at a time, each
// channel's square root and divisions waited for the last one's (10-25 ns a channel, most of a call with thousands
// of channels and a short batch); over arrays those of many channels overlap.
constexpr size_t kChannelBlock = 256;

// A block's terms of grad_input = scale_grad * grad_output + scale_centered * (x - mean) + shift, per channel.
struct GradInputTerms {
    double scale_grad[kChannelBlock], scale_centered[kChannelBlock], shift[kChannelBlock];
};

// Channels [first, first + count) of a per-channel vector of `dtype` (F16, BF16, F32 or F64) and `stride`, read as
// F64 into out[0, count) (`absent` for each where vector is NULL), or written from values[0, count) (narrowed
// through F32 for the 16-bit dtypes, as the kernels store F32 results; nothing where vector is NULL). The
// forward's too.
void loadChannels(double *out, const void *vector, infiniDtype_t dtype, ptrdiff_t stride, size_t first,
                  size_t count, double absent);
void storeChannels(void *vector, infiniDtype_t dtype, ptrdiff_t stride, size_t first, size_t count,
                   const double *values);

// Channel c's element alone.
inline void store(void *vector, infiniDtype_t dtype, ptrdiff_t stride, size_t c, double value) {
    storeChannels(vector, dtype, stride, c, 1, &value);
}

// mean and invstd (from the saved or the running statistics, see the public header) and weight of channels
// [first, first + count) into out[0, count).
void channelStatistics(const Info &info, const ChannelVectors &vectors, size_t first, size_t count,
                       ChannelStatistics *out);

// What the run's phase does with channels [first, first + count) (count <= kChannelBlock), given this run's
// sum(grad_output) and sum(grad_output * (x - mean)) of channel first + i in totals[2 * i] and totals[2 * i + 1]
// (unused in the elementwise phase, which reads the totals of all processes instead): writes their grad_weight and
// grad_bias (those set) from them; in the reduce phase also the sums, narrowed to the statistics dtype. Gives in
// out[0, count) their grad_input terms (zeros in the reduce phase), computed from the sums in the statistics dtype
// (so that the whole run and reduce + elementwise agree bit for bit) over phase.count elements.
void finishChannels(const Info &info, const Phase &phase, const ChannelVectors &vectors, size_t first, size_t count,
                    const ChannelStatistics *statistics, const double *totals, GradInputTerms &out);

// An empty batch (N * L = 0): grad_weight, grad_bias and the reduce phase's sums (those set) are zero; nothing
// else is read or written.
void finishEmpty(const Info &info, const Phase &phase, const ChannelVectors &vectors);

// Whether the sums pass is needed: training's grad_input needs it, eval's only for grad_weight / grad_bias.
inline bool needsSums(const Info &info) { return info.training || info.has_grad_weight || info.has_grad_bias; }

} // namespace op::batch_norm_backward

#endif
