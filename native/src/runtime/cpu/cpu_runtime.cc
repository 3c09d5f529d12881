// The host as a device: memory is malloc'd, streams are a token, everything is already synchronous.
#include "runtime/backend.h"

#include <cstdlib>
#include <cstring>

namespace infinirt {
namespace {

// Streams and events on the CPU carry no state (work is done when its call returns); distinct non-null tokens
// keep create/destroy symmetric.
char stream_token, event_token;

infiniStatus_t getDeviceCount(int *count) {
    *count = 1;
    return INFINI_STATUS_SUCCESS;
}

infiniStatus_t setDevice(int device_id) {
    return device_id == 0 ? INFINI_STATUS_SUCCESS : INFINI_STATUS_DEVICE_NOT_FOUND;
}

infiniStatus_t synchronize() { return INFINI_STATUS_SUCCESS; }

infiniStatus_t streamCreate(infinirtStream_t *stream) {
    *stream = &stream_token;
    return INFINI_STATUS_SUCCESS;
}

infiniStatus_t streamNoop(infinirtStream_t) { return INFINI_STATUS_SUCCESS; }

infiniStatus_t streamWaitEvent(infinirtStream_t, infinirtEvent_t) { return INFINI_STATUS_SUCCESS; }

infiniStatus_t eventCreate(infinirtEvent_t *event) {
    *event = &event_token;
    return INFINI_STATUS_SUCCESS;
}

infiniStatus_t eventRecord(infinirtEvent_t, infinirtStream_t) { return INFINI_STATUS_SUCCESS; }

infiniStatus_t eventQuery(infinirtEvent_t, infinirtEventStatus_t *status) {
    *status = INFINIRT_EVENT_COMPLETE;
    return INFINI_STATUS_SUCCESS;
}

infiniStatus_t eventNoop(infinirtEvent_t) { return INFINI_STATUS_SUCCESS; }

infiniStatus_t allocate(void **ptr, size_t size) {
    // 64-byte alignment suits every vector width the kernels use.
    void *memory = std::aligned_alloc(64, (size + 63) / 64 * 64 + (size == 0 ? 64 : 0));
    if (memory == nullptr) return INFINI_STATUS_INTERNAL_ERROR;
    *ptr = memory;
    return INFINI_STATUS_SUCCESS;
}

infiniStatus_t release(void *ptr) {
    std::free(ptr);
    return INFINI_STATUS_SUCCESS;
}

infiniStatus_t copy(void *dst, const void *src, size_t size, infinirtMemcpyKind_t) {
    if (size > 0) std::memmove(dst, src, size);
    return INFINI_STATUS_SUCCESS;
}

infiniStatus_t copyAsync(void *dst, const void *src, size_t size, infinirtMemcpyKind_t kind, infinirtStream_t) {
    return copy(dst, src, size, kind);
}

infiniStatus_t fill(void *ptr, int value, size_t size) {
    if (size > 0) std::memset(ptr, value, size);
    return INFINI_STATUS_SUCCESS;
}

} // namespace

const Backend &cpuBackend() {
    static const Backend backend{getDeviceCount, setDevice,   synchronize, streamCreate, streamNoop, streamNoop,
                                 streamWaitEvent, eventCreate, eventRecord, eventQuery,  eventNoop,  eventNoop,
                                 allocate,       allocate,    release,     release,      copy,       copyAsync,
                                 fill};
    return backend;
}

} // namespace infinirt
