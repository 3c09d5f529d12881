// RMSNorm backward: the descriptor every backend implements.
#ifndef INFINIOP_SRC_OPS_RMS_NORM_BACKWARD_H
#define INFINIOP_SRC_OPS_RMS_NORM_BACKWARD_H

#include "info.h"
#include "infiniop/descriptor_impl.h"

namespace op::rms_norm_backward {

class Descriptor : public InfiniopDescriptor {
  public:
    Descriptor(infiniDevice_t device, int device_id, const Info &info)
        : InfiniopDescriptor(device, device_id), info(info) {}

    virtual size_t workspaceSize() const = 0;
    // Arguments already checked: workspace is large enough, data pointers are non-null where needed
    // (grad_w only when info.has_grad_w, rstd only when info.has_rstd).
    virtual infiniStatus_t calculate(void *workspace, void *grad_x, void *grad_w, const void *grad_y, const void *x,
                                     const void *w, const void *rstd, void *stream) const = 0;

    const Info info;
};

struct Backends {
    static infiniStatus_t cpu(const Info &info, int device_id, Descriptor **desc);
    static infiniStatus_t nvidia(const Info &info, int device_id, Descriptor **desc);
    static infiniStatus_t ascend(const Info &info, int device_id, Descriptor **desc);
};

struct Op {
    using Info = rms_norm_backward::Info;
    using Descriptor = rms_norm_backward::Descriptor;
    using Backends = rms_norm_backward::Backends;
};

} // namespace op::rms_norm_backward

#endif
