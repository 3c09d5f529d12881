// Entry points of libinfinirt: argument checks, the per-thread current device, dispatch to its backend.
#include "backend.h"

#include "common/enum_value.h"
#include "common/status.h"

namespace {

thread_local infiniDevice_t current_device = INFINI_DEVICE_CPU;
thread_local int current_device_id = 0;

bool isDeviceEnum(const infiniDevice_t &device) { // by reference: copying an invalid enum is a load too
    return infini::rawValue(device) >= INFINI_DEVICE_CPU && infini::rawValue(device) < INFINI_DEVICE_TYPE_COUNT;
}

bool isCopyKind(const infinirtMemcpyKind_t &kind) {
    return infini::rawValue(kind) >= INFINIRT_MEMCPY_H2H && infini::rawValue(kind) <= INFINIRT_MEMCPY_D2D;
}

// The backend of a device, or nullptr when this build has none for it.
const infinirt::Backend *backendOf(infiniDevice_t device) {
    switch (device) {
#ifdef ENABLE_CPU_API
    case INFINI_DEVICE_CPU: return &infinirt::cpuBackend();
#endif
#ifdef ENABLE_NVIDIA_API
    case INFINI_DEVICE_NVIDIA: return &infinirt::nvidiaBackend();
#endif
#ifdef ENABLE_ASCEND_API
    case INFINI_DEVICE_ASCEND: return &infinirt::ascendBackend();
#endif
    default: return nullptr;
    }
}

// Runs `call` on the current device's backend.
template <typename Call>
infiniStatus_t onCurrent(Call &&call) {
    return infini::guarded([&] {
        const infinirt::Backend *backend = backendOf(current_device);
        if (backend == nullptr) return INFINI_STATUS_DEVICE_TYPE_NOT_SUPPORTED;
        return call(*backend);
    });
}

} // namespace

__C infiniStatus_t infinirtInit(void) { return INFINI_STATUS_SUCCESS; }

__C infiniStatus_t infinirtGetDeviceCount(infiniDevice_t device, int *count) {
    return infini::guarded([&] {
        if (count == nullptr) return INFINI_STATUS_NULL_POINTER;
        if (!isDeviceEnum(device)) return INFINI_STATUS_BAD_PARAM;
        const infinirt::Backend *backend = backendOf(device);
        if (backend == nullptr) return INFINI_STATUS_DEVICE_TYPE_NOT_SUPPORTED;
        infiniStatus_t status = backend->getDeviceCount(count);
        // Asking how many is not an error: a backend that finds no device (no driver, no toolkit) counts 0.
        if (status != INFINI_STATUS_DEVICE_NOT_FOUND) return status;
        *count = 0;
        return INFINI_STATUS_SUCCESS;
    });
}

__C infiniStatus_t infinirtSetDevice(infiniDevice_t device, int device_id) {
    return infini::guarded([&] {
        if (!isDeviceEnum(device)) return INFINI_STATUS_BAD_PARAM;
        const infinirt::Backend *backend = backendOf(device);
        if (backend == nullptr) return INFINI_STATUS_DEVICE_TYPE_NOT_SUPPORTED;
        if (device_id < 0) return INFINI_STATUS_DEVICE_NOT_FOUND;
        INFINI_CHECK(backend->setDevice(device_id));
        current_device = device;
        current_device_id = device_id;
        return INFINI_STATUS_SUCCESS;
    });
}

__C infiniStatus_t infinirtGetDevice(infiniDevice_t *device_ptr, int *device_id_ptr) {
    if (device_ptr == nullptr || device_id_ptr == nullptr) return INFINI_STATUS_NULL_POINTER;
    *device_ptr = current_device;
    *device_id_ptr = current_device_id;
    return INFINI_STATUS_SUCCESS;
}

__C infiniStatus_t infinirtDeviceSynchronize(void) {
    return onCurrent([](const infinirt::Backend &b) { return b.deviceSynchronize(); });
}

__C infiniStatus_t infinirtStreamCreate(infinirtStream_t *stream_ptr) {
    if (stream_ptr == nullptr) return INFINI_STATUS_NULL_POINTER;
    return onCurrent([&](const infinirt::Backend &b) { return b.streamCreate(stream_ptr); });
}

__C infiniStatus_t infinirtStreamDestroy(infinirtStream_t stream) {
    return onCurrent([&](const infinirt::Backend &b) { return b.streamDestroy(stream); });
}

__C infiniStatus_t infinirtStreamSynchronize(infinirtStream_t stream) {
    return onCurrent([&](const infinirt::Backend &b) { return b.streamSynchronize(stream); });
}

__C infiniStatus_t infinirtStreamWaitEvent(infinirtStream_t stream, infinirtEvent_t event) {
    if (event == nullptr) return INFINI_STATUS_NULL_POINTER;
    return onCurrent([&](const infinirt::Backend &b) { return b.streamWaitEvent(stream, event); });
}

__C infiniStatus_t infinirtEventCreate(infinirtEvent_t *event_ptr) {
    if (event_ptr == nullptr) return INFINI_STATUS_NULL_POINTER;
    return onCurrent([&](const infinirt::Backend &b) { return b.eventCreate(event_ptr); });
}

__C infiniStatus_t infinirtEventRecord(infinirtEvent_t event, infinirtStream_t stream) {
    if (event == nullptr) return INFINI_STATUS_NULL_POINTER;
    return onCurrent([&](const infinirt::Backend &b) { return b.eventRecord(event, stream); });
}

__C infiniStatus_t infinirtEventQuery(infinirtEvent_t event, infinirtEventStatus_t *status_ptr) {
    if (event == nullptr || status_ptr == nullptr) return INFINI_STATUS_NULL_POINTER;
    return onCurrent([&](const infinirt::Backend &b) { return b.eventQuery(event, status_ptr); });
}

__C infiniStatus_t infinirtEventSynchronize(infinirtEvent_t event) {
    if (event == nullptr) return INFINI_STATUS_NULL_POINTER;
    return onCurrent([&](const infinirt::Backend &b) { return b.eventSynchronize(event); });
}

__C infiniStatus_t infinirtEventDestroy(infinirtEvent_t event) {
    if (event == nullptr) return INFINI_STATUS_NULL_POINTER;
    return onCurrent([&](const infinirt::Backend &b) { return b.eventDestroy(event); });
}

__C infiniStatus_t infinirtMalloc(void **p_ptr, size_t size) {
    if (p_ptr == nullptr) return INFINI_STATUS_NULL_POINTER;
    return onCurrent([&](const infinirt::Backend &b) { return b.malloc(p_ptr, size); });
}

__C infiniStatus_t infinirtMallocHost(void **p_ptr, size_t size) {
    if (p_ptr == nullptr) return INFINI_STATUS_NULL_POINTER;
    return onCurrent([&](const infinirt::Backend &b) { return b.mallocHost(p_ptr, size); });
}

__C infiniStatus_t infinirtFree(void *ptr) {
    if (ptr == nullptr) return INFINI_STATUS_SUCCESS; // like free(NULL)
    return onCurrent([&](const infinirt::Backend &b) { return b.free(ptr); });
}

__C infiniStatus_t infinirtFreeHost(void *ptr) {
    if (ptr == nullptr) return INFINI_STATUS_SUCCESS;
    return onCurrent([&](const infinirt::Backend &b) { return b.freeHost(ptr); });
}

__C infiniStatus_t infinirtMemcpy(void *dst, const void *src, size_t size, infinirtMemcpyKind_t kind) {
    if (size > 0 && (dst == nullptr || src == nullptr)) return INFINI_STATUS_NULL_POINTER;
    if (!isCopyKind(kind)) return INFINI_STATUS_BAD_PARAM;
    return onCurrent([&](const infinirt::Backend &b) { return b.memcpy(dst, src, size, kind); });
}

__C infiniStatus_t infinirtMemcpyAsync(void *dst, const void *src, size_t size, infinirtMemcpyKind_t kind,
                                       infinirtStream_t stream) {
    if (size > 0 && (dst == nullptr || src == nullptr)) return INFINI_STATUS_NULL_POINTER;
    if (!isCopyKind(kind)) return INFINI_STATUS_BAD_PARAM;
    return onCurrent([&](const infinirt::Backend &b) { return b.memcpyAsync(dst, src, size, kind, stream); });
}

__C infiniStatus_t infinirtMemset(void *ptr, int value, size_t size) {
    if (size > 0 && ptr == nullptr) return INFINI_STATUS_NULL_POINTER;
    return onCurrent([&](const infinirt::Backend &b) { return b.memset(ptr, value, size); });
}
