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

// Makes device_id current for one library call and the caller's device current again after it, as torch's
// CUDAGuard does: the thread's current device is shared by every CUDA runtime in the process (ours, torch's) through
// the driver's current context, so a switch left behind would move the caller's, and leave infinirt's record of the
// current device (its malloc, its streams) wrong. Where device_id is current already, nothing is switched.
class DeviceScope {
  public:
    explicit DeviceScope(int device_id) {
        const bool known = cudaGetDevice(&previous_) == cudaSuccess;
        if (known && previous_ == device_id) return;
        status_ = toStatus(cudaSetDevice(device_id));
        restore_ = known && status_ == INFINI_STATUS_SUCCESS;
    }
    ~DeviceScope() {
        if (restore_) cudaSetDevice(previous_);
    }
    DeviceScope(const DeviceScope &) = delete;
    DeviceScope &operator=(const DeviceScope &) = delete;

    infiniStatus_t status() const { return status_; }

  private:
    int previous_ = -1;
    bool restore_ = false;
    infiniStatus_t status_ = INFINI_STATUS_SUCCESS;
};

// Streaming multiprocessors of a device: sizes the persistent grids chosen at descriptor creation.
inline infiniStatus_t multiprocessorCount(int device_id, int *count) {
    return toStatus(cudaDeviceGetAttribute(count, cudaDevAttrMultiProcessorCount, device_id));
}

// Whether a CTA of the device may be given `bytes` of dynamic shared memory beside `static_bytes` of its own (an
// H100/H200: 227 KiB; an A100: 163; an RTX 30xx/40xx: 99): plans that want more take other kernels there.
inline infiniStatus_t sharedFits(int device_id, size_t bytes, size_t static_bytes, bool *fits) {
    int optin = 0;
    const infiniStatus_t status =
        toStatus(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device_id));
    *fits = status == INFINI_STATUS_SUCCESS && bytes + static_bytes <= static_cast<size_t>(optin);
    return status;
}

// How many CTAs of `kernel` (with `threads` threads and `shared_bytes` of dynamic shared memory) one SM holds at
// once; at least 1.
template <typename Kernel>
infiniStatus_t residentCtas(Kernel kernel, int threads, int *count, size_t shared_bytes = 0) {
    infiniStatus_t status =
        toStatus(cudaOccupancyMaxActiveBlocksPerMultiprocessor(count, kernel, threads, shared_bytes));
    if (status == INFINI_STATUS_SUCCESS && *count < 1) *count = 1;
    return status;
}

} // namespace nvidia

#define CHECK_CUDA(expr) INFINI_CHECK(::nvidia::toStatus(expr))

#endif
