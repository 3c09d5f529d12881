// BatchNorm backward: the descriptor every backend implements.
#ifndef INFINIOP_SRC_OPS_BATCH_NORM_BACKWARD_H
#define INFINIOP_SRC_OPS_BATCH_NORM_BACKWARD_H

#include "info.h"
#include "infiniop/descriptor_impl.h"

namespace op::batch_norm_backward {

// Which part of the backward a run does (the public header's two-phase entry points).
struct Phase {
    enum Kind {
        whole,       // infiniopBatchNormBackwardEx
        reduce,      // sums and grad_weight / grad_bias of this process's data
        elementwise, // grad_input from the sums of all processes
    };
    Kind kind = whole;
    // Per channel, of the statistics dtype: reduce writes them, elementwise reads them (NULL in whole).
    void *sum_grad = nullptr, *sum_grad_centered = nullptr;
    // Elements per channel the sums cover: N * L, or elementwise's total_count.
    double count = 0.0;

    static Phase wholeOf(const Info &info) {
        return Phase{whole, nullptr, nullptr, static_cast<double>(info.batch * info.length)};
    }
};

class Descriptor : public InfiniopDescriptor {
  public:
    Descriptor(infiniDevice_t device, int device_id, const Info &info)
        : InfiniopDescriptor(device, device_id), info(info) {}

    virtual size_t workspaceSize() const = 0;
    // Arguments already checked: workspace is large enough, data pointers are non-null where needed (the
    // optional ones only when info says they are used, and NULL for those the phase does not use: grad_input
    // and weight in reduce, grad_weight and grad_bias in elementwise).
    virtual infiniStatus_t calculate(const Phase &phase, void *workspace, void *grad_input, void *grad_weight,
                                     void *grad_bias, const void *input, const void *grad_output,
                                     const void *weight, const void *running_mean, const void *running_var,
                                     const void *save_mean, const void *save_invstd, void *stream) const = 0;

    const Info info;
};

struct Backends {
    static infiniStatus_t cpu(const Info &info, int device_id, Descriptor **desc);
    static infiniStatus_t nvidia(const Info &info, int device_id, Descriptor **desc);
    static infiniStatus_t ascend(const Info &info, int device_id, Descriptor **desc);
};

struct Op {
    using Info = batch_norm_backward::Info;
    using Descriptor = batch_norm_backward::Descriptor;
    using Backends = batch_norm_backward::Backends;
};

} // namespace op::batch_norm_backward

#endif
