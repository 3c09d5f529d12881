// The C entry points every operator shares, written once: argument checks, the device switch, lifetimes.
// An op provides `Op::Info` (with a static create), `Op::Descriptor` (abstract: workspaceSize, calculate)
// and `Op::Backends` (one static factory per device, defined only by backends that are built).
#ifndef INFINIOP_OPS_DISPATCH_H
#define INFINIOP_OPS_DISPATCH_H

#include "common/status.h"
#include "infiniop/handle_impl.h"
#include "infiniop/descriptor_impl.h"

namespace op {

template <typename Op>
using Factory = infiniStatus_t (*)(const typename Op::Info &, int device_id, typename Op::Descriptor **);

template <typename Op>
Factory<Op> factoryOf(infiniDevice_t device) {
    switch (device) {
#ifdef ENABLE_CPU_API
    case INFINI_DEVICE_CPU: return &Op::Backends::cpu;
#endif
#ifdef ENABLE_NVIDIA_API
    case INFINI_DEVICE_NVIDIA: return &Op::Backends::nvidia;
#endif
#ifdef ENABLE_ASCEND_API
    case INFINI_DEVICE_ASCEND: return &Op::Backends::ascend;
#endif
    default: return nullptr;
    }
}

// make_info(Info *) validates the tensors (the seed or the Ex rules); then the handle's backend builds.
// `tensors`: every tensor argument in C order (NULL for an absent one), for the run's aliasing check.
template <typename Op, typename MakeInfo>
infiniStatus_t createFromInfo(infiniopHandle_t handle, InfiniopDescriptor **desc_ptr,
                              std::initializer_list<infini::Tensor> tensors, MakeInfo &&make_info) {
    return infini::guarded([&] {
        if (handle == nullptr || desc_ptr == nullptr) return INFINI_STATUS_NULL_POINTER;
        typename Op::Info info;
        INFINI_CHECK(make_info(&info));
        Factory<Op> factory = factoryOf<Op>(handle->device);
        if (factory == nullptr) return INFINI_STATUS_DEVICE_TYPE_NOT_SUPPORTED;
        std::vector<infini::Footprint> footprints; // before desc: may throw
        for (infini::Tensor t : tensors) footprints.push_back(infini::footprintOf(t));
        typename Op::Descriptor *desc = nullptr;
        INFINI_CHECK(factory(info, handle->device_id, &desc));
        if (desc->workspaceOverflows()) {
            delete desc;
            return INFINI_STATUS_BAD_TENSOR_SHAPE;
        }
        desc->footprints = std::move(footprints);
        *desc_ptr = desc;
        return INFINI_STATUS_SUCCESS;
    });
}

// The seed create: every tensor descriptor is required but the one at index `optional` (kNoneOptional: none),
// which Info::create then takes as absent.
constexpr size_t kNoneOptional = static_cast<size_t>(-1);

template <typename Op, typename... Tensors>
infiniStatus_t createDescriptor(infiniopHandle_t handle, InfiniopDescriptor **desc_ptr, size_t optional,
                                Tensors... tensors) {
    const infini::Tensor all[] = {tensors...};
    for (size_t i = 0; i < sizeof...(Tensors); ++i) {
        if (all[i] == nullptr && i != optional) return INFINI_STATUS_NULL_POINTER;
    }
    return createFromInfo<Op>(handle, desc_ptr, {tensors...},
                              [&](typename Op::Info *info) { return Op::Info::create(info, tensors...); });
}

// The op descriptor behind a C handle; BAD_PARAM when it belongs to another operator.
template <typename Op>
infiniStatus_t descriptorOf(InfiniopDescriptor *desc, const typename Op::Descriptor **out) {
    if (desc == nullptr) return INFINI_STATUS_NULL_POINTER;
    *out = dynamic_cast<const typename Op::Descriptor *>(desc);
    return *out == nullptr ? INFINI_STATUS_BAD_PARAM : INFINI_STATUS_SUCCESS;
}

template <typename Op>
infiniStatus_t getWorkspaceSize(InfiniopDescriptor *desc, size_t *size) {
    return infini::guarded([&] {
        if (size == nullptr) return INFINI_STATUS_NULL_POINTER;
        const typename Op::Descriptor *op_desc;
        INFINI_CHECK(descriptorOf<Op>(desc, &op_desc));
        *size = op_desc->workspaceSize();
        return INFINI_STATUS_SUCCESS;
    });
}

template <typename Op>
infiniStatus_t destroyDescriptor(InfiniopDescriptor *desc) {
    return infini::guarded([&] {
        const typename Op::Descriptor *op_desc;
        INFINI_CHECK(descriptorOf<Op>(desc, &op_desc));
        delete op_desc;
        return INFINI_STATUS_SUCCESS;
    });
}

} // namespace op

#endif
