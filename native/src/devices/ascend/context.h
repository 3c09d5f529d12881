// Running a piece of work in a device's context on the calling thread, whatever was current there before.
// CANN's state is per thread: the first phase of an aclnn call, aclrtMalloc and launches all use the current
// device, which a caller's thread may not have set (a new thread) or may have set to another device.
#ifndef INFINI_DEVICES_ASCEND_CONTEXT_H
#define INFINI_DEVICES_ASCEND_CONTEXT_H

#include "loader.h"

namespace ascend {

// Runs body() with `device` current, then makes the thread's previous device current again, as torch_npu's
// device guard does: libascendcl is shared with libinfinirt, whose calls must keep finding the device the
// caller selected. A thread with no device keeps `device` (CANN has no "none" to go back to).
template <typename Body>
infiniStatus_t onDevice(const Api &acl, int device, Body &&body) {
    int32_t previous = -1;
    const bool had_device = acl.aclrtGetDevice(&previous) == kAclSuccess;
    const bool switched = !had_device || previous != device;
    if (switched) ACL_CHECK(acl.aclrtSetDevice(device));
    infiniStatus_t status = body();
    if (switched && had_device) {
        infiniStatus_t restored = fromAcl(acl.aclrtSetDevice(previous));
        if (status == INFINI_STATUS_SUCCESS) status = restored;
    }
    return status;
}

} // namespace ascend

#endif
