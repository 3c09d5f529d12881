// LayerNorm forward: the descriptor every backend implements.
#ifndef INFINIOP_SRC_OPS_LAYER_NORM_H
#define INFINIOP_SRC_OPS_LAYER_NORM_H

#include "info.h"
#include "infiniop/descriptor_impl.h"

namespace op::layer_norm {

class Descriptor : public InfiniopDescriptor {
  public:
    Descriptor(infiniDevice_t device, int device_id, const Info &info)
        : InfiniopDescriptor(device, device_id), info(info) {}

    virtual size_t workspaceSize() const = 0;
    // Arguments already checked: workspace is large enough, data pointers are non-null where the descriptor has
    // that tensor. xhat: the xhat form's (else NULL); first_statistic: std or mean; rstd: the statistics form's.
    virtual infiniStatus_t calculate(void *workspace, void *y, void *xhat, void *first_statistic, void *rstd,
                                     const void *x, const void *w, const void *b, void *stream) const = 0;

    const Info info;
};

struct Backends {
    static infiniStatus_t cpu(const Info &info, int device_id, Descriptor **desc);
    static infiniStatus_t nvidia(const Info &info, int device_id, Descriptor **desc);
    static infiniStatus_t ascend(const Info &info, int device_id, Descriptor **desc);
};

struct Op {
    using Info = layer_norm::Info;
    using Descriptor = layer_norm::Descriptor;
    using Backends = layer_norm::Backends;
};

} // namespace op::layer_norm

#endif
