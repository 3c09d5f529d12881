#ifndef INFINIOP_OPERATOR_DESCRIPTOR_H
#define INFINIOP_OPERATOR_DESCRIPTOR_H

#include "../infinicore.h"

/* Every operator descriptor starts with this header, so its device can be read generically. */
typedef struct InfiniopDescriptor *infiniopDescriptor_t;

__C __export infiniStatus_t infiniopGetDescriptorDeviceType(infiniopDescriptor_t desc, infiniDevice_t *device_type);
__C __export infiniStatus_t infiniopGetDescriptorDeviceId(infiniopDescriptor_t desc, int *device_id);

#endif /* INFINIOP_OPERATOR_DESCRIPTOR_H */
