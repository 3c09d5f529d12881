// The CUDA runtime behind infinirt. The runtime library is linked statically and reaches the driver only when
// called, so a machine without a GPU or driver loads this fine and gets DEVICE_NOT_FOUND from every call.
#include "runtime/backend.h"

#include "devices/nvidia/nvidia_status.h"

namespace infinirt {
namespace {

using nvidia::toStatus;

infiniStatus_t getDeviceCount(int *count) {
    *count = 0;
    int found = 0;
    infiniStatus_t status = toStatus(cudaGetDeviceCount(&found));
    if (status == INFINI_STATUS_SUCCESS) *count = found;
    return status;
}

infiniStatus_t setDevice(int device_id) { return toStatus(cudaSetDevice(device_id)); }

infiniStatus_t synchronize() { return toStatus(cudaDeviceSynchronize()); }

infiniStatus_t streamCreate(infinirtStream_t *stream) {
    cudaStream_t created = nullptr;
    infiniStatus_t status = toStatus(cudaStreamCreate(&created));
    if (status == INFINI_STATUS_SUCCESS) *stream = created;
    return status;
}

infiniStatus_t streamDestroy(infinirtStream_t stream) {
    return toStatus(cudaStreamDestroy(static_cast<cudaStream_t>(stream)));
}

infiniStatus_t streamSynchronize(infinirtStream_t stream) {
    return toStatus(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
}

infiniStatus_t streamWaitEvent(infinirtStream_t stream, infinirtEvent_t event) {
    return toStatus(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), static_cast<cudaEvent_t>(event), 0));
}

// Ordering only: no timing, which makes recording and waiting cheaper.
infiniStatus_t eventCreate(infinirtEvent_t *event) {
    cudaEvent_t created = nullptr;
    infiniStatus_t status = toStatus(cudaEventCreateWithFlags(&created, cudaEventDisableTiming));
    if (status == INFINI_STATUS_SUCCESS) *event = created;
    return status;
}

infiniStatus_t eventRecord(infinirtEvent_t event, infinirtStream_t stream) {
    return toStatus(cudaEventRecord(static_cast<cudaEvent_t>(event), static_cast<cudaStream_t>(stream)));
}

infiniStatus_t eventQuery(infinirtEvent_t event, infinirtEventStatus_t *status) {
    const cudaError_t error = cudaEventQuery(static_cast<cudaEvent_t>(event));
    if (error == cudaErrorNotReady) {
        *status = INFINIRT_EVENT_NOT_READY;
        return INFINI_STATUS_SUCCESS;
    }
    if (error == cudaSuccess) *status = INFINIRT_EVENT_COMPLETE;
    return toStatus(error);
}

infiniStatus_t eventSynchronize(infinirtEvent_t event) {
    return toStatus(cudaEventSynchronize(static_cast<cudaEvent_t>(event)));
}

infiniStatus_t eventDestroy(infinirtEvent_t event) { return toStatus(cudaEventDestroy(static_cast<cudaEvent_t>(event))); }

infiniStatus_t allocate(void **ptr, size_t size) { return toStatus(cudaMalloc(ptr, size)); }

infiniStatus_t allocateHost(void **ptr, size_t size) { return toStatus(cudaMallocHost(ptr, size)); }

infiniStatus_t release(void *ptr) { return toStatus(cudaFree(ptr)); }

infiniStatus_t releaseHost(void *ptr) { return toStatus(cudaFreeHost(ptr)); }

cudaMemcpyKind cudaKind(infinirtMemcpyKind_t kind) {
    switch (kind) {
    case INFINIRT_MEMCPY_H2H: return cudaMemcpyHostToHost;
    case INFINIRT_MEMCPY_H2D: return cudaMemcpyHostToDevice;
    case INFINIRT_MEMCPY_D2H: return cudaMemcpyDeviceToHost;
    default: return cudaMemcpyDeviceToDevice;
    }
}

infiniStatus_t copy(void *dst, const void *src, size_t size, infinirtMemcpyKind_t kind) {
    if (size == 0) return INFINI_STATUS_SUCCESS;
    return toStatus(cudaMemcpy(dst, src, size, cudaKind(kind)));
}

infiniStatus_t copyAsync(void *dst, const void *src, size_t size, infinirtMemcpyKind_t kind,
                         infinirtStream_t stream) {
    if (size == 0) return INFINI_STATUS_SUCCESS;
    return toStatus(cudaMemcpyAsync(dst, src, size, cudaKind(kind), static_cast<cudaStream_t>(stream)));
}

infiniStatus_t fill(void *ptr, int value, size_t size) {
    if (size == 0) return INFINI_STATUS_SUCCESS;
    return toStatus(cudaMemset(ptr, value, size));
}

} // namespace

const Backend &nvidiaBackend() {
    static const Backend backend{getDeviceCount,    setDevice,   synchronize, streamCreate,     streamDestroy,
                                 streamSynchronize, streamWaitEvent, eventCreate, eventRecord, eventQuery,
                                 eventSynchronize,  eventDestroy, allocate,   allocateHost,     release,
                                 releaseHost,       copy,        copyAsync,   fill};
    return backend;
}

} // namespace infinirt
