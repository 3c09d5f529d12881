// Our own declarations of the ACL runtime and aclnn entry points this backend calls, written from CANN's
// documented prototypes, so the backend compiles with no CANN headers; the functions are found at run time.
#ifndef INFINI_DEVICES_ASCEND_ACL_H
#define INFINI_DEVICES_ASCEND_ACL_H

#include <cstddef>
#include <cstdint>

extern "C" {

typedef int aclError;       // runtime status, 0 on success
typedef int32_t aclnnStatus; // operator status, 0 on success
typedef void *aclrtStream;
typedef void *aclrtEvent;
struct aclTensor;
struct aclIntArray;
struct aclBoolArray;
struct aclScalar;
struct aclOpExecutor;

typedef enum {
    ACL_FLOAT = 0,
    ACL_FLOAT16 = 1,
    ACL_BF16 = 27,
} aclDataType;

typedef enum {
    ACL_FORMAT_NCHW = 0,
    ACL_FORMAT_ND = 2,
    ACL_FORMAT_NCDHW = 30,
    ACL_FORMAT_NC = 35,
    ACL_FORMAT_NCL = 47,
} aclFormat;

typedef enum {
    ACL_MEMCPY_HOST_TO_HOST = 0,
    ACL_MEMCPY_HOST_TO_DEVICE = 1,
    ACL_MEMCPY_DEVICE_TO_HOST = 2,
    ACL_MEMCPY_DEVICE_TO_DEVICE = 3,
} aclrtMemcpyKind;

typedef enum {
    ACL_MEM_MALLOC_HUGE_FIRST = 0,
} aclrtMemMallocPolicy;

typedef enum {
    ACL_EVENT_RECORDED_STATUS_NOT_READY = 0,
    ACL_EVENT_RECORDED_STATUS_COMPLETE = 1,
} aclrtEventRecordedStatus;

} // extern "C"

namespace ascend {

// Status codes the backend tests for by value.
constexpr aclError kAclSuccess = 0;
constexpr aclError kAclRepeatInitialize = 100002; // ACL_ERROR_REPEAT_INITIALIZE: aclInit already ran

// Resolved entry points, grouped by the library that exports them. The runtime's and libnnopbase's are always
// there; an aclnn operator this CANN install lacks has both its phases NULL (the operators needing it are
// NOT_IMPLEMENTED, see loader.h).
struct Api {
    // libascendcl: the runtime.
    aclError (*aclInit)(const char *config_path);
    aclError (*aclrtGetDeviceCount)(uint32_t *count);
    aclError (*aclrtSetDevice)(int32_t device_id);
    aclError (*aclrtGetDevice)(int32_t *device_id);
    aclError (*aclrtSynchronizeDevice)();
    aclError (*aclrtCreateStream)(aclrtStream *stream);
    aclError (*aclrtDestroyStream)(aclrtStream stream);
    aclError (*aclrtSynchronizeStream)(aclrtStream stream);
    aclError (*aclrtCreateEvent)(aclrtEvent *event);
    aclError (*aclrtDestroyEvent)(aclrtEvent event);
    aclError (*aclrtRecordEvent)(aclrtEvent event, aclrtStream stream);
    aclError (*aclrtSynchronizeEvent)(aclrtEvent event);
    aclError (*aclrtQueryEventStatus)(aclrtEvent event, aclrtEventRecordedStatus *status);
    aclError (*aclrtStreamWaitEvent)(aclrtStream stream, aclrtEvent event);
    aclError (*aclrtMalloc)(void **ptr, size_t size, aclrtMemMallocPolicy policy);
    aclError (*aclrtMallocHost)(void **ptr, size_t size);
    aclError (*aclrtFree)(void *ptr);
    aclError (*aclrtFreeHost)(void *ptr);
    aclError (*aclrtMemcpy)(void *dst, size_t dest_max, const void *src, size_t count, aclrtMemcpyKind kind);
    aclError (*aclrtMemcpyAsync)(void *dst, size_t dest_max, const void *src, size_t count, aclrtMemcpyKind kind,
                                 aclrtStream stream);
    aclError (*aclrtMemset)(void *ptr, size_t max_count, int32_t value, size_t count);
    aclError (*aclrtMemsetAsync)(void *ptr, size_t max_count, int32_t value, size_t count, aclrtStream stream);
    const char *(*aclrtGetSocName)(); // the SoC's name, NULL where it cannot tell; optional: NULL where not exported

    // libnnopbase: tensors, arrays, executors.
    aclTensor *(*aclCreateTensor)(const int64_t *view_dims, uint64_t view_dims_num, aclDataType dtype,
                                  const int64_t *stride, int64_t offset, aclFormat format, const int64_t *storage_dims,
                                  uint64_t storage_dims_num, void *data);
    aclnnStatus (*aclDestroyTensor)(const aclTensor *tensor);
    aclIntArray *(*aclCreateIntArray)(const int64_t *value, uint64_t size);
    aclnnStatus (*aclDestroyIntArray)(const aclIntArray *array);
    aclBoolArray *(*aclCreateBoolArray)(const bool *value, uint64_t size);
    aclnnStatus (*aclDestroyBoolArray)(const aclBoolArray *array);
    aclScalar *(*aclCreateScalar)(void *value, aclDataType dtype);
    aclnnStatus (*aclDestroyScalar)(const aclScalar *scalar);
    aclnnStatus (*aclSetAclOpExecutorRepeatable)(aclOpExecutor *executor);
    aclnnStatus (*aclDestroyAclOpExecutor)(aclOpExecutor *executor);
    aclnnStatus (*aclSetInputTensorAddr)(aclOpExecutor *executor, size_t index, aclTensor *tensor, void *addr);
    aclnnStatus (*aclSetOutputTensorAddr)(aclOpExecutor *executor, size_t index, aclTensor *tensor, void *addr);

    // The operators (first phase: check and plan; second phase: launch on a stream), from the operator libraries
    // (libopapi_nn / libopapi_math in current CANN, libopapi before).
    aclnnStatus (*aclnnRmsNormGetWorkspaceSize)(const aclTensor *x, const aclTensor *gamma, double epsilon,
                                                const aclTensor *y_out, const aclTensor *rstd_out,
                                                uint64_t *workspace_size, aclOpExecutor **executor);
    aclnnStatus (*aclnnRmsNorm)(void *workspace, uint64_t workspace_size, aclOpExecutor *executor, aclrtStream stream);
    aclnnStatus (*aclnnLayerNormGetWorkspaceSize)(const aclTensor *input, const aclIntArray *normalized_shape,
                                                  const aclTensor *weight_optional, const aclTensor *bias_optional,
                                                  double eps, aclTensor *out, aclTensor *mean_out_optional,
                                                  aclTensor *rstd_out_optional, uint64_t *workspace_size,
                                                  aclOpExecutor **executor);
    aclnnStatus (*aclnnLayerNorm)(void *workspace, uint64_t workspace_size, aclOpExecutor *executor,
                                  aclrtStream stream);
    aclnnStatus (*aclnnBatchNormGetWorkspaceSize)(const aclTensor *input, const aclTensor *weight,
                                                  const aclTensor *bias, aclTensor *running_mean,
                                                  aclTensor *running_var, bool training, double momentum, double eps,
                                                  aclTensor *output, aclTensor *save_mean, aclTensor *save_invstd,
                                                  uint64_t *workspace_size, aclOpExecutor **executor);
    aclnnStatus (*aclnnBatchNorm)(void *workspace, uint64_t workspace_size, aclOpExecutor *executor,
                                  aclrtStream stream);
    aclnnStatus (*aclnnRmsNormGradGetWorkspaceSize)(const aclTensor *dy, const aclTensor *x, const aclTensor *rstd,
                                                    const aclTensor *gamma, const aclTensor *dx_out,
                                                    const aclTensor *dgamma_out, uint64_t *workspace_size,
                                                    aclOpExecutor **executor);
    aclnnStatus (*aclnnRmsNormGrad)(void *workspace, uint64_t workspace_size, aclOpExecutor *executor,
                                    aclrtStream stream);
    aclnnStatus (*aclnnLayerNormBackwardGetWorkspaceSize)(
        const aclTensor *grad_out, const aclTensor *input, const aclIntArray *normalized_shape, const aclTensor *mean,
        const aclTensor *rstd, const aclTensor *weight_optional, const aclTensor *bias_optional,
        const aclBoolArray *output_mask, aclTensor *grad_input_out, aclTensor *grad_weight_out,
        aclTensor *grad_bias_out, uint64_t *workspace_size, aclOpExecutor **executor);
    aclnnStatus (*aclnnLayerNormBackward)(void *workspace, uint64_t workspace_size, aclOpExecutor *executor,
                                          aclrtStream stream);
    aclnnStatus (*aclnnBatchNormBackwardGetWorkspaceSize)(
        const aclTensor *grad_out, const aclTensor *input, const aclTensor *weight, const aclTensor *running_mean,
        const aclTensor *running_var, const aclTensor *save_mean, const aclTensor *save_invstd, bool training,
        double eps, const aclBoolArray *output_mask, aclTensor *grad_input, aclTensor *grad_weight,
        aclTensor *grad_bias, uint64_t *workspace_size, aclOpExecutor **executor);
    aclnnStatus (*aclnnBatchNormBackward)(void *workspace, uint64_t workspace_size, aclOpExecutor *executor,
                                          aclrtStream stream);
    aclnnStatus (*aclnnCastGetWorkspaceSize)(const aclTensor *self, aclDataType dtype, aclTensor *out,
                                             uint64_t *workspace_size, aclOpExecutor **executor);
    aclnnStatus (*aclnnCast)(void *workspace, uint64_t workspace_size, aclOpExecutor *executor, aclrtStream stream);
    aclnnStatus (*aclnnAddsGetWorkspaceSize)(const aclTensor *self, const aclScalar *other, const aclScalar *alpha,
                                             aclTensor *out, uint64_t *workspace_size, aclOpExecutor **executor);
    aclnnStatus (*aclnnAdds)(void *workspace, uint64_t workspace_size, aclOpExecutor *executor, aclrtStream stream);
    aclnnStatus (*aclnnRsqrtGetWorkspaceSize)(const aclTensor *self, aclTensor *out, uint64_t *workspace_size,
                                              aclOpExecutor **executor);
    aclnnStatus (*aclnnRsqrt)(void *workspace, uint64_t workspace_size, aclOpExecutor *executor, aclrtStream stream);
    aclnnStatus (*aclnnDivGetWorkspaceSize)(const aclTensor *self, const aclTensor *other, aclTensor *out,
                                            uint64_t *workspace_size, aclOpExecutor **executor);
    aclnnStatus (*aclnnDiv)(void *workspace, uint64_t workspace_size, aclOpExecutor *executor, aclrtStream stream);
};

} // namespace ascend

#endif
