#include "handle_impl.h"

#include "common/status.h"
#include "infinirt.h"

__C infiniStatus_t infiniopCreateHandle(infiniopHandle_t *handle_ptr) {
    return infini::guarded([&] {
        if (handle_ptr == nullptr) return INFINI_STATUS_NULL_POINTER;
        infiniDevice_t device;
        int device_id;
        INFINI_CHECK(infinirtGetDevice(&device, &device_id));
        *handle_ptr = new InfiniopHandle{device, device_id};
        return INFINI_STATUS_SUCCESS;
    });
}

__C infiniStatus_t infiniopDestroyHandle(infiniopHandle_t handle) {
    if (handle == nullptr) return INFINI_STATUS_NULL_POINTER;
    delete handle;
    return INFINI_STATUS_SUCCESS;
}
