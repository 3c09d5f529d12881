// One table of functions per device runtime; infinirt.cc picks the table of the current device.
#ifndef INFINIRT_BACKEND_H
#define INFINIRT_BACKEND_H

#include "infinirt.h"

namespace infinirt {

struct Backend {
    infiniStatus_t (*getDeviceCount)(int *count);
    infiniStatus_t (*setDevice)(int device_id);
    infiniStatus_t (*deviceSynchronize)();
    infiniStatus_t (*streamCreate)(infinirtStream_t *stream);
    infiniStatus_t (*streamDestroy)(infinirtStream_t stream);
    infiniStatus_t (*streamSynchronize)(infinirtStream_t stream);
    infiniStatus_t (*streamWaitEvent)(infinirtStream_t stream, infinirtEvent_t event);
    infiniStatus_t (*eventCreate)(infinirtEvent_t *event);
    infiniStatus_t (*eventRecord)(infinirtEvent_t event, infinirtStream_t stream);
    infiniStatus_t (*eventQuery)(infinirtEvent_t event, infinirtEventStatus_t *status);
    infiniStatus_t (*eventSynchronize)(infinirtEvent_t event);
    infiniStatus_t (*eventDestroy)(infinirtEvent_t event);
    infiniStatus_t (*malloc)(void **ptr, size_t size);
    infiniStatus_t (*mallocHost)(void **ptr, size_t size);
    infiniStatus_t (*free)(void *ptr);
    infiniStatus_t (*freeHost)(void *ptr);
    infiniStatus_t (*memcpy)(void *dst, const void *src, size_t size, infinirtMemcpyKind_t kind);
    infiniStatus_t (*memcpyAsync)(void *dst, const void *src, size_t size, infinirtMemcpyKind_t kind,
                                  infinirtStream_t stream);
    infiniStatus_t (*memset)(void *ptr, int value, size_t size);
};

#ifdef ENABLE_CPU_API
const Backend &cpuBackend();
#endif
#ifdef ENABLE_NVIDIA_API
const Backend &nvidiaBackend();
#endif
#ifdef ENABLE_ASCEND_API
const Backend &ascendBackend();
#endif

} // namespace infinirt

#endif
