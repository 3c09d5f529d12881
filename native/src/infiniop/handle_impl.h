// The handle behind infiniopHandle_t: which device the operators created from it run on.
#ifndef INFINIOP_HANDLE_IMPL_H
#define INFINIOP_HANDLE_IMPL_H

#include "infiniop/handle.h"

struct InfiniopHandle {
    infiniDevice_t device;
    int device_id;
};

#endif
