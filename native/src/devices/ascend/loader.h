// Finding CANN at run time, and turning its status codes into ours.
#ifndef INFINI_DEVICES_ASCEND_LOADER_H
#define INFINI_DEVICES_ASCEND_LOADER_H

#include "acl.h"

#include "infinicore.h"

namespace ascend {

// The resolved API, loading libascendcl, libnnopbase and libopapi and running aclInit on first use.
// DEVICE_NOT_FOUND when a library or one of its symbols cannot be found (CANN absent or too old).
// Search order per library: $ASCEND_TOOLKIT_HOME/{lib64,lib}, $ASCEND_HOME/{lib64,lib,
// ascend-toolkit/latest/lib64}, then the dynamic loader's own path (LD_LIBRARY_PATH, ld.so.cache).
infiniStatus_t api(const Api **out);

// Every ACL / aclnn code mapped by its documented class: 1xxxxx parameter errors, 2xxxxx resource
// errors, 3xxxxx/5xxxxx runtime and internal errors.
infiniStatus_t fromAcl(int code);

} // namespace ascend

// Evaluates an ACL / aclnn call and returns its mapped status from the enclosing function on failure.
#define ACL_CHECK(expr)                                                                                                \
    do {                                                                                                               \
        int acl_code_ = (expr);                                                                                        \
        if (acl_code_ != 0) return ::ascend::fromAcl(acl_code_);                                                       \
    } while (0)

#endif
