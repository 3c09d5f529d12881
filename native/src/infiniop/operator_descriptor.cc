#include "descriptor_impl.h"

__C infiniStatus_t infiniopGetDescriptorDeviceType(infiniopDescriptor_t desc, infiniDevice_t *device_type) {
    if (desc == nullptr || device_type == nullptr) return INFINI_STATUS_NULL_POINTER;
    *device_type = desc->device_type;
    return INFINI_STATUS_SUCCESS;
}

__C infiniStatus_t infiniopGetDescriptorDeviceId(infiniopDescriptor_t desc, int *device_id) {
    if (desc == nullptr || device_id == nullptr) return INFINI_STATUS_NULL_POINTER;
    *device_id = desc->device_id;
    return INFINI_STATUS_SUCCESS;
}
