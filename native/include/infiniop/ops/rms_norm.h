#ifndef INFINIOP_OPS_RMS_NORM_H
#define INFINIOP_OPS_RMS_NORM_H

#include "../handle.h"
#include "../operator_descriptor.h"
#include "../tensor_descriptor.h"

typedef struct InfiniopDescriptor *infiniopRMSNormDescriptor_t;

/* RMSNorm forward, as upstream InfiniCore declares it: y = x * w / sqrt(mean(x^2) + epsilon) over the last dim.
 * y, x: (rows, D) or (N1, N2, D), one dtype dT in {F16, BF16, F32, F64}, last dim contiguous; w: (D,) of dT or,
 * for F16/BF16 dT, F32, any stride. epsilon must be finite and >= 0 (BAD_PARAM otherwise). */
__C __export infiniStatus_t infiniopCreateRMSNormDescriptor(infiniopHandle_t handle,
                                                            infiniopRMSNormDescriptor_t *desc_ptr,
                                                            infiniopTensorDescriptor_t y_desc,
                                                            infiniopTensorDescriptor_t x_desc,
                                                            infiniopTensorDescriptor_t w_desc, float epsilon);

__C __export infiniStatus_t infiniopGetRMSNormWorkspaceSize(infiniopRMSNormDescriptor_t desc, size_t *size);

__C __export infiniStatus_t infiniopRMSNorm(infiniopRMSNormDescriptor_t desc, void *workspace, size_t workspace_size,
                                            void *y, const void *x, const void *w, void *stream);

/* Extensions beyond upstream InfiniCore: the forward that saves its statistic for the backward. Outputs first,
 * as in every other create and run of this library: y, rstd, then the inputs x, w. A descriptor made by either
 * create function runs with either run function; the seed run passes rstd = NULL.
 * - y, x: rank 1..8. w's rank k names the normalized trailing dims: w.shape == x.shape[-k:], and those k dims must
 *   be packed (stride 1 innermost, row-major) in y and x; leading dims take any strides; y must not overlap
 *   itself. y may be x (in place) with the same layout.
 * - rstd_desc NULL: rstd is not written; its run pointer is ignored. Otherwise rstd, of shape x.shape[:-k] and
 *   not overlapping itself, gets 1/sqrt(mean(x^2) + epsilon) per row: what
 *   infiniopCreateRMSNormBackwardDescriptorEx takes as its rstd.
 * - dtypes: y, x share dT in {F16, BF16, F32, F64}; w is dT or, for F16/BF16 dT, F32; rstd is F32 (F64 for F64).
 * - epsilon must be finite and >= 0 (BAD_PARAM otherwise). */
__C __export infiniStatus_t infiniopCreateRMSNormDescriptorEx(infiniopHandle_t handle,
                                                              infiniopRMSNormDescriptor_t *desc_ptr,
                                                              infiniopTensorDescriptor_t y_desc,
                                                              infiniopTensorDescriptor_t rstd_desc,
                                                              infiniopTensorDescriptor_t x_desc,
                                                              infiniopTensorDescriptor_t w_desc, double epsilon);

__C __export infiniStatus_t infiniopRMSNormEx(infiniopRMSNormDescriptor_t desc, void *workspace,
                                              size_t workspace_size, void *y, void *rstd, const void *x,
                                              const void *w, void *stream);

__C __export infiniStatus_t infiniopDestroyRMSNormDescriptor(infiniopRMSNormDescriptor_t desc);

#endif /* INFINIOP_OPS_RMS_NORM_H */
