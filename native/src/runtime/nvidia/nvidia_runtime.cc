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
    static const Backend backend{getDeviceCount, setDevice,    synchronize, streamCreate, streamDestroy,
                                 streamSynchronize, allocate, allocateHost, release,     releaseHost,
                                 copy,           copyAsync,    fill};
    return backend;
}

} // namespace infinirt
