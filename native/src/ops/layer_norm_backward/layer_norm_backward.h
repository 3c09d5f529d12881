// LayerNorm backward: the descriptor every backend implements.
#ifndef INFINIOP_SRC_OPS_LAYER_NORM_BACKWARD_H
#define INFINIOP_SRC_OPS_LAYER_NORM_BACKWARD_H

#include "info.h"
#include "infiniop/descriptor_impl.h"

namespace op::layer_norm_backward {

class Descriptor : public InfiniopDescriptor {
  public:
    Descriptor(infiniDevice_t device, int device_id, const Info &info)
        : InfiniopDescriptor(device, device_id), info(info) {}

    virtual size_t workspaceSize() const = 0;
    // Arguments already checked: workspace is large enough, data pointers are non-null where needed.
    // row_input, row_mean, row_scale: xhat, NULL, std in the xhat form; input, mean, rstd in the from-input form.
    virtual infiniStatus_t calculate(void *workspace, void *grad_input, void *grad_weight, void *grad_bias,
                                     const void *grad_output, const void *weight, const void *row_input,
                                     const void *row_mean, const void *row_scale, void *stream) const = 0;

    const Info info;
};

struct Backends {
    static infiniStatus_t cpu(const Info &info, int device_id, Descriptor **desc);
    static infiniStatus_t nvidia(const Info &info, int device_id, Descriptor **desc);
    static infiniStatus_t ascend(const Info &info, int device_id, Descriptor **desc);
};

struct Op {
    using Info = layer_norm_backward::Info;
    using Descriptor = layer_norm_backward::Descriptor;
    using Backends = layer_norm_backward::Backends;
};

} // namespace op::layer_norm_backward

#endif
