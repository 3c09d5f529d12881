// The common base of every operator descriptor, and the checks every run entry point shares.
#ifndef INFINIOP_OPERATOR_DESCRIPTOR_IMPL_H
#define INFINIOP_OPERATOR_DESCRIPTOR_IMPL_H

#include "common/footprint.h"
#include "infiniop/operator_descriptor.h"

#include <cstddef>
#include <initializer_list>
#include <utility>

struct InfiniopDescriptor {
    infiniDevice_t device_type;
    int device_id;
    // Bytes each tensor argument touches, in C argument order: set by op::createDescriptor, read by
    // infini::checkNoAliasing at run.
    std::vector<infini::Footprint> footprints;

    InfiniopDescriptor(infiniDevice_t device_type, int device_id) : device_type(device_type), device_id(device_id) {}
    virtual ~InfiniopDescriptor() = default;
    // Whether the workspace this descriptor would ask for passes 2^64 bytes (its sums are infini::CheckedSize):
    // op::createFromInfo then refuses it with BAD_TENSOR_SHAPE.
    virtual bool workspaceOverflows() const { return false; }
};

namespace infini {

// A (pointer, element count) pair: a data pointer may be NULL only for an empty tensor.
using DataArg = std::pair<const void *, size_t>;

inline infiniStatus_t checkRunArgs(const void *workspace, size_t workspace_size, size_t needed,
                                   std::initializer_list<DataArg> data) {
    if (workspace_size < needed) return INFINI_STATUS_INSUFFICIENT_WORKSPACE;
    if (needed > 0 && workspace == nullptr) return INFINI_STATUS_NULL_POINTER;
    for (auto [pointer, count] : data) {
        if (pointer == nullptr && count > 0) return INFINI_STATUS_NULL_POINTER;
    }
    return INFINI_STATUS_SUCCESS;
}

} // namespace infini

#endif
