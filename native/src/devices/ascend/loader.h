// Finding CANN at run time, and turning its status codes into ours.
#ifndef INFINI_DEVICES_ASCEND_LOADER_H
#define INFINI_DEVICES_ASCEND_LOADER_H

#include "acl.h"

#include "infinicore.h"

namespace ascend {

// The resolved API, loading CANN and running aclInit on first use.
// libascendcl and libnnopbase are required: DEVICE_NOT_FOUND when either or one of its symbols cannot be found
// (CANN absent or too old). Each is looked for in $ASCEND_TOOLKIT_HOME/{lib64,lib}, $ASCEND_HOME_PATH/{lib64,lib},
// $ASCEND_HOME/{lib64,lib,ascend-toolkit/latest/lib64}, then the dynamic loader's own path.
// Each aclnn operator comes from the first operator library that has it, in torch_npu's order: the
// libopapi_*.so in those directories and LD_LIBRARY_PATH's (current CANN, by name), libopapi.so (deprecated),
// then libaclnn_ops_train.so and libaclnn_math.so (older CANN). An operator none has is left NULL, and only
// the descriptors that need it are refused (NOT_IMPLEMENTED); infiniop_py._ascend names what is missing.
infiniStatus_t api(const Api **out);

// Every ACL / aclnn code mapped by its documented class: 1xxxxx parameter errors, 2xxxxx resource
// errors, 3xxxxx/5xxxxx runtime and internal errors, but for the shape errors the operators' kernels report
// (561001 shape inference, 561002 tiling): BAD_TENSOR_SHAPE.
infiniStatus_t fromAcl(int code);

} // namespace ascend

// Evaluates an ACL / aclnn call and returns its mapped status from the enclosing function on failure.
#define ACL_CHECK(expr)                                                                                                \
    do {                                                                                                               \
        int acl_code_ = (expr);                                                                                        \
        if (acl_code_ != 0) return ::ascend::fromAcl(acl_code_);                                                       \
    } while (0)

#endif
