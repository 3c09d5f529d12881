#include "batch_norm_backward_f64.h"

#include "devices/cpu/parallel.h"

namespace op::batch_norm_backward {

void runF64(const Info &info, const Phase &phase, const ChannelVectors &vectors, double *grad_input,
            const double *input, const double *grad_output) {
    const size_t batch = info.batch, channels = info.channels, length = info.length;
    const bool channels_last = info.layout == Layout::channels_last;
    cpu::parallelFor(channels, [&](size_t c) {
        // Offset of (n, c, l) is base(n) + l * step.
        const size_t step = channels_last ? channels : 1;
        auto base = [&](size_t n) { return channels_last ? n * length * channels + c : (n * channels + c) * length; };
        ChannelStatistics statistics;
        channelStatistics(info, vectors, c, 1, &statistics);
        double sum_grad = 0.0, sum_grad_centered = 0.0;
        if (needsSums(info) && phase.kind != Phase::elementwise) {
            for (size_t n = 0; n < batch; ++n) {
                for (size_t l = 0, i = base(n); l < length; ++l, i += step) {
                    sum_grad += grad_output[i];
                    sum_grad_centered += grad_output[i] * (input[i] - statistics.mean);
                }
            }
        }
        const double totals[2] = {sum_grad, sum_grad_centered};
        GradInputTerms k;
        finishChannels(info, phase, vectors, c, 1, &statistics, totals, k);
        if (phase.kind == Phase::reduce) return;
        for (size_t n = 0; n < batch; ++n) {
            for (size_t l = 0, i = base(n); l < length; ++l, i += step) {
                grad_input[i] = info.training ? k.scale_grad[0] * grad_output[i] +
                                                    k.scale_centered[0] * (input[i] - statistics.mean) + k.shift[0]
                                              : k.scale_grad[0] * grad_output[i];
            }
        }
    }, cpu::threadsFor(batch * channels * length));
}

} // namespace op::batch_norm_backward
