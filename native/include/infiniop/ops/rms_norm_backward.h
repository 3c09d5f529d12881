#ifndef INFINIOP_OPS_RMS_NORM_BACKWARD_H
#define INFINIOP_OPS_RMS_NORM_BACKWARD_H

#include "../handle.h"
#include "../operator_descriptor.h"
#include "../tensor_descriptor.h"

typedef struct InfiniopDescriptor *infiniopRMSNormBackwardDescriptor_t;

__C __export infiniStatus_t infiniopCreateRMSNormBackwardDescriptor(
    infiniopHandle_t handle, infiniopRMSNormBackwardDescriptor_t *desc_ptr, infiniopTensorDescriptor_t grad_x_desc,
    infiniopTensorDescriptor_t grad_w_desc, infiniopTensorDescriptor_t grad_y_desc, infiniopTensorDescriptor_t x_desc,
    infiniopTensorDescriptor_t w_desc);

__C __export infiniStatus_t infiniopGetRMSNormBackwardWorkspaceSize(infiniopRMSNormBackwardDescriptor_t desc,
                                                                    size_t *size);

__C __export infiniStatus_t infiniopRMSNormBackward(infiniopRMSNormBackwardDescriptor_t desc, void *workspace,
                                                    size_t workspace_size, void *grad_x, void *grad_w,
                                                    const void *grad_y, const void *x, const void *w, void *stream);

/* Extensions beyond the seed (not in upstream InfiniCore). A descriptor made by either create function runs
 * with either run function; the seed run passes rstd = NULL.
 * - x, grad_y, grad_x: rank 1..8. w's rank k names the normalized trailing dims: w.shape == x.shape[-k:],
 *   and those k dims must be packed (stride 1 innermost, row-major) in grad_x, grad_y and x.
 * - grad_w_desc NULL: grad_w is not computed; its run pointer is ignored.
 * - rstd_desc NULL: r = 1/sqrt(mean(x^2) + epsilon) from x. Otherwise r is read from rstd, of shape
 *   x.shape[:-k], and epsilon is unused.
 * - dtypes: grad_x, grad_y, x share dT in {F16, BF16, F32, F64}; w and grad_w share dT or, for F16/BF16
 *   dT, F32; rstd is F32 (F64 for F64 dT).
 * - epsilon must be finite and >= 0 (BAD_PARAM otherwise). */
__C __export infiniStatus_t infiniopCreateRMSNormBackwardDescriptorEx(
    infiniopHandle_t handle, infiniopRMSNormBackwardDescriptor_t *desc_ptr, infiniopTensorDescriptor_t grad_x_desc,
    infiniopTensorDescriptor_t grad_w_desc, infiniopTensorDescriptor_t grad_y_desc, infiniopTensorDescriptor_t x_desc,
    infiniopTensorDescriptor_t w_desc, infiniopTensorDescriptor_t rstd_desc, double epsilon);

__C __export infiniStatus_t infiniopRMSNormBackwardEx(infiniopRMSNormBackwardDescriptor_t desc, void *workspace,
                                                      size_t workspace_size, void *grad_x, void *grad_w,
                                                      const void *grad_y, const void *x, const void *w,
                                                      const void *rstd, void *stream);

__C __export infiniStatus_t infiniopDestroyRMSNormBackwardDescriptor(infiniopRMSNormBackwardDescriptor_t desc);

#endif /* INFINIOP_OPS_RMS_NORM_BACKWARD_H */
