// CUDA runtime errors as infiniStatus_t, and the current-device guard every backend entry uses.
// Host-only; each shared library links its own private copy of the static CUDA runtime.
#ifndef INFINI_DEVICES_NVIDIA_STATUS_H
#define INFINI_DEVICES_NVIDIA_STATUS_H

#include "infinicore.h"

#include <cuda_runtime_api.h>

namespace nvidia {

inline infiniStatus_t toStatus(cudaError_t error) {
    switch (error) {
    case cudaSuccess: return INFINI_STATUS_SUCCESS;
    // No driver, a stub driver, no device, or a bad ordinal: the device is not there.
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorStubLibrary:
    case cudaErrorInvalidDevice:
    case cudaErrorDevicesUnavailable: return INFINI_STATUS_DEVICE_NOT_FOUND;
    case cudaErrorInitializationError: return INFINI_STATUS_DEVICE_NOT_INITIALIZED;
    case cudaErrorNoKernelImageForDevice:
    case cudaErrorUnsupportedPtxVersion: return INFINI_STATUS_DEVICE_ARCHITECTURE_NOT_SUPPORTED;
    case cudaErrorInvalidValue:
    case cudaErrorInvalidDevicePointer:
    case cudaErrorInvalidResourceHandle:
    case cudaErrorInvalidMemcpyDirection: return INFINI_STATUS_BAD_PARAM;
    default: return INFINI_STATUS_INTERNAL_ERROR;
    }
}

// The error, if any, of the kernel launches since the last check (cleared by reading it).
inline infiniStatus_t launchStatus() { return toStatus(cudaGetLastError()); }

// Makes device_id current for this library's CUDA runtime on this thread (its state is private to the library).
inline infiniStatus_t useDevice(int device_id) {
    int current = -1;
    cudaError_t error = cudaGetDevice(&current);
    if (error == cudaSuccess && current == device_id) return INFINI_STATUS_SUCCESS;
    return toStatus(cudaSetDevice(device_id));
}

// Streaming multiprocessors of a device: sizes the persistent grids chosen at descriptor creation.
inline infiniStatus_t multiprocessorCount(int device_id, int *count) {
    return toStatus(cudaDeviceGetAttribute(count, cudaDevAttrMultiProcessorCount, device_id));
}

// How many CTAs of `kernel` (with `threads` threads) one SM holds at once; at least 1.
template <typename Kernel>
infiniStatus_t residentCtas(Kernel kernel, int threads, int *count) {
    infiniStatus_t status = toStatus(cudaOccupancyMaxActiveBlocksPerMultiprocessor(count, kernel, threads, 0));
    if (status == INFINI_STATUS_SUCCESS && *count < 1) *count = 1;
    return status;
}

} // namespace nvidia

#define CHECK_CUDA(expr) INFINI_CHECK(::nvidia::toStatus(expr))

#endif
