// Ascend NPUs through the ACL runtime, loaded at run time: every entry first makes sure CANN was found.
#include "runtime/backend.h"

#include "common/status.h"
#include "devices/ascend/loader.h"

namespace infinirt {
namespace {

using ascend::Api;

// The entries below but getDeviceCount: make sure CANN was found, then make their ACL calls (body(acl)).
template <typename Body>
infiniStatus_t withAcl(Body &&body) {
    const Api *acl;
    INFINI_CHECK(ascend::api(&acl));
    return body(*acl);
}

infiniStatus_t getDeviceCount(int *count) {
    const Api *acl;
    if (ascend::api(&acl) != INFINI_STATUS_SUCCESS) {
        *count = 0; // no CANN, no devices: enumeration is not an error
        return INFINI_STATUS_SUCCESS;
    }
    uint32_t n = 0;
    ACL_CHECK(acl->aclrtGetDeviceCount(&n));
    *count = static_cast<int>(n);
    return INFINI_STATUS_SUCCESS;
}

infiniStatus_t setDevice(int device_id) {
    return withAcl([&](const Api &acl) {
        uint32_t n = 0;
        ACL_CHECK(acl.aclrtGetDeviceCount(&n));
        if (static_cast<uint32_t>(device_id) >= n) return INFINI_STATUS_DEVICE_NOT_FOUND;
        return ascend::fromAcl(acl.aclrtSetDevice(device_id));
    });
}

infiniStatus_t synchronize() {
    return withAcl([&](const Api &acl) { return ascend::fromAcl(acl.aclrtSynchronizeDevice()); });
}

infiniStatus_t streamCreate(infinirtStream_t *stream) {
    return withAcl([&](const Api &acl) {
        aclrtStream created = nullptr; // the caller's stream is written on success only
        ACL_CHECK(acl.aclrtCreateStream(&created));
        *stream = created;
        return INFINI_STATUS_SUCCESS;
    });
}

// CANN asks for a synchronized stream; infinirt callers, like CUDA's, may destroy one with work still queued.
infiniStatus_t streamDestroy(infinirtStream_t stream) {
    return withAcl([&](const Api &acl) {
        ACL_CHECK(acl.aclrtSynchronizeStream(stream));
        return ascend::fromAcl(acl.aclrtDestroyStream(stream));
    });
}

infiniStatus_t streamSynchronize(infinirtStream_t stream) {
    return withAcl([&](const Api &acl) { return ascend::fromAcl(acl.aclrtSynchronizeStream(stream)); });
}

infiniStatus_t streamWaitEvent(infinirtStream_t stream, infinirtEvent_t event) {
    return withAcl([&](const Api &acl) { return ascend::fromAcl(acl.aclrtStreamWaitEvent(stream, event)); });
}

infiniStatus_t eventCreate(infinirtEvent_t *event) {
    return withAcl([&](const Api &acl) {
        aclrtEvent created = nullptr; // the caller's event is written on success only
        ACL_CHECK(acl.aclrtCreateEvent(&created));
        *event = created;
        return INFINI_STATUS_SUCCESS;
    });
}

infiniStatus_t eventRecord(infinirtEvent_t event, infinirtStream_t stream) {
    return withAcl([&](const Api &acl) { return ascend::fromAcl(acl.aclrtRecordEvent(event, stream)); });
}

infiniStatus_t eventQuery(infinirtEvent_t event, infinirtEventStatus_t *status) {
    return withAcl([&](const Api &acl) {
        aclrtEventRecordedStatus recorded = ACL_EVENT_RECORDED_STATUS_NOT_READY;
        ACL_CHECK(acl.aclrtQueryEventStatus(event, &recorded));
        *status = recorded == ACL_EVENT_RECORDED_STATUS_COMPLETE ? INFINIRT_EVENT_COMPLETE : INFINIRT_EVENT_NOT_READY;
        return INFINI_STATUS_SUCCESS;
    });
}

infiniStatus_t eventSynchronize(infinirtEvent_t event) {
    return withAcl([&](const Api &acl) { return ascend::fromAcl(acl.aclrtSynchronizeEvent(event)); });
}

infiniStatus_t eventDestroy(infinirtEvent_t event) {
    return withAcl([&](const Api &acl) { return ascend::fromAcl(acl.aclrtDestroyEvent(event)); });
}

// aclrtMalloc refuses size 0; a minimal block keeps malloc(0)/free symmetric.
infiniStatus_t allocate(void **ptr, size_t size) {
    return withAcl(
        [&](const Api &acl) { return ascend::fromAcl(acl.aclrtMalloc(ptr, size == 0 ? 32 : size, ACL_MEM_MALLOC_HUGE_FIRST)); });
}

infiniStatus_t allocateHost(void **ptr, size_t size) {
    return withAcl([&](const Api &acl) { return ascend::fromAcl(acl.aclrtMallocHost(ptr, size == 0 ? 32 : size)); });
}

// aclrtFree / aclrtFreeHost give memory back at once, while queued work may still use it. Like cudaFree, and
// like torch_npu before it returns cached memory, wait for the device first.
infiniStatus_t release(void *ptr) {
    return withAcl([&](const Api &acl) {
        ACL_CHECK(acl.aclrtSynchronizeDevice());
        return ascend::fromAcl(acl.aclrtFree(ptr));
    });
}

infiniStatus_t releaseHost(void *ptr) {
    return withAcl([&](const Api &acl) {
        ACL_CHECK(acl.aclrtSynchronizeDevice());
        return ascend::fromAcl(acl.aclrtFreeHost(ptr));
    });
}

// Our copy kinds have ACL's numbering (H2H 0, H2D 1, D2H 2, D2D 3).
aclrtMemcpyKind kindOf(infinirtMemcpyKind_t kind) { return static_cast<aclrtMemcpyKind>(kind); }

infiniStatus_t copy(void *dst, const void *src, size_t size, infinirtMemcpyKind_t kind) {
    if (size == 0) return INFINI_STATUS_SUCCESS;
    return withAcl([&](const Api &acl) { return ascend::fromAcl(acl.aclrtMemcpy(dst, size, src, size, kindOf(kind))); });
}

infiniStatus_t copyAsync(void *dst, const void *src, size_t size, infinirtMemcpyKind_t kind,
                         infinirtStream_t stream) {
    if (size == 0) return INFINI_STATUS_SUCCESS;
    return withAcl(
        [&](const Api &acl) { return ascend::fromAcl(acl.aclrtMemcpyAsync(dst, size, src, size, kindOf(kind), stream)); });
}

infiniStatus_t fill(void *ptr, int value, size_t size) {
    if (size == 0) return INFINI_STATUS_SUCCESS;
    return withAcl([&](const Api &acl) { return ascend::fromAcl(acl.aclrtMemset(ptr, size, value, size)); });
}

} // namespace

const Backend &ascendBackend() {
    static const Backend backend{getDeviceCount,    setDevice,   synchronize, streamCreate,     streamDestroy,
                                 streamSynchronize, streamWaitEvent, eventCreate, eventRecord, eventQuery,
                                 eventSynchronize,  eventDestroy, allocate,   allocateHost,     release,
                                 releaseHost,       copy,        copyAsync,   fill};
    return backend;
}

} // namespace infinirt
