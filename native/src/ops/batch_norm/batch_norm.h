// BatchNorm forward: the descriptor every backend implements.
#ifndef INFINIOP_SRC_OPS_BATCH_NORM_H
#define INFINIOP_SRC_OPS_BATCH_NORM_H

#include "info.h"
#include "infiniop/descriptor_impl.h"

namespace op::batch_norm {

class Descriptor : public InfiniopDescriptor {
  public:
    Descriptor(infiniDevice_t device, int device_id, const Info &info)
        : InfiniopDescriptor(device, device_id), info(info) {}

    virtual size_t workspaceSize() const = 0;
    // Arguments already checked: workspace is large enough, data pointers are non-null where needed and NULL
    // where info says the tensor is absent.
    virtual infiniStatus_t calculate(void *workspace, void *y, void *save_mean, void *save_invstd,
                                     void *running_mean, void *running_var, const void *x, const void *weight,
                                     const void *bias, void *stream) const = 0;

    const Info info;
};

struct Backends {
    static infiniStatus_t cpu(const Info &info, int device_id, Descriptor **desc);
    static infiniStatus_t nvidia(const Info &info, int device_id, Descriptor **desc);
    static infiniStatus_t ascend(const Info &info, int device_id, Descriptor **desc);
};

struct Op {
    using Info = batch_norm::Info;
    using Descriptor = batch_norm::Descriptor;
    using Backends = batch_norm::Backends;
};

} // namespace op::batch_norm

#endif
