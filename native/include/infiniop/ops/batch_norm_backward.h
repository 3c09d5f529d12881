#ifndef INFINIOP_OPS_BATCH_NORM_BACKWARD_H
#define INFINIOP_OPS_BATCH_NORM_BACKWARD_H

#include "../handle.h"
#include "../operator_descriptor.h"
#include "../tensor_descriptor.h"

typedef struct InfiniopDescriptor *infiniopBatchNormBackwardDescriptor_t;

__C __export infiniStatus_t infiniopCreateBatchNormBackwardDescriptor(
    infiniopHandle_t handle, infiniopBatchNormBackwardDescriptor_t *desc_ptr,
    infiniopTensorDescriptor_t grad_input_desc, infiniopTensorDescriptor_t grad_weight_desc,
    infiniopTensorDescriptor_t grad_bias_desc, infiniopTensorDescriptor_t input_desc,
    infiniopTensorDescriptor_t grad_output_desc, infiniopTensorDescriptor_t weight_desc,
    infiniopTensorDescriptor_t running_mean_desc, infiniopTensorDescriptor_t running_var_desc);

__C __export infiniStatus_t infiniopGetBatchNormBackwardWorkspaceSize(infiniopBatchNormBackwardDescriptor_t desc,
                                                                      size_t *size);

__C __export infiniStatus_t infiniopBatchNormBackward(infiniopBatchNormBackwardDescriptor_t desc, void *workspace,
                                                      size_t workspace_size, void *grad_input, void *grad_weight,
                                                      void *grad_bias, const void *input, const void *grad_output,
                                                      const void *weight, const void *running_mean,
                                                      const void *running_var, void *stream);

/* Extensions beyond the seed (not in upstream InfiniCore). A descriptor made by either create function runs
 * with either run function; the seed run passes save_mean = save_invstd = NULL.
 * - input, grad_output, grad_input: (N, C, *spatial) of rank 2..5, each channels-first packed (row-major) or
 *   channels-last packed (C innermost with stride 1, then the spatial dims, then N: NHWC for rank 4).
 * - Statistics, training != 0: mean and invstd come from save_mean and save_invstd when both are given (as
 *   PyTorch saves them in the forward; running_mean/running_var may then be NULL), otherwise mean =
 *   running_mean and invstd = 1/sqrt(running_var + epsilon) (the batch statistics, as in the seed).
 *   training == 0 (eval): mean = running_mean and invstd = 1/sqrt(running_var + epsilon) are constants:
 *   grad_input = grad_output * weight * invstd; save_mean/save_invstd must be NULL.
 * - grad_weight_desc / grad_bias_desc NULL: that gradient is not computed; its run pointer is ignored.
 * - weight_desc NULL: weight is all ones (BatchNorm without affine); its run pointer is ignored.
 * - dtypes: grad_input, input, grad_output share dT in {F16, BF16, F32, F64}; weight, grad_weight, grad_bias,
 *   running_mean and running_var share dT or, for F16/BF16 dT, F32; save_mean and save_invstd are F32 (F64
 *   for F64 dT). Every per-channel tensor has shape (C,).
 * - epsilon must be finite and >= 0 (BAD_PARAM otherwise). */
__C __export infiniStatus_t infiniopCreateBatchNormBackwardDescriptorEx(
    infiniopHandle_t handle, infiniopBatchNormBackwardDescriptor_t *desc_ptr,
    infiniopTensorDescriptor_t grad_input_desc, infiniopTensorDescriptor_t grad_weight_desc,
    infiniopTensorDescriptor_t grad_bias_desc, infiniopTensorDescriptor_t input_desc,
    infiniopTensorDescriptor_t grad_output_desc, infiniopTensorDescriptor_t weight_desc,
    infiniopTensorDescriptor_t running_mean_desc, infiniopTensorDescriptor_t running_var_desc,
    infiniopTensorDescriptor_t save_mean_desc, infiniopTensorDescriptor_t save_invstd_desc, double epsilon,
    int training);

__C __export infiniStatus_t infiniopBatchNormBackwardEx(infiniopBatchNormBackwardDescriptor_t desc, void *workspace,
                                                        size_t workspace_size, void *grad_input, void *grad_weight,
                                                        void *grad_bias, const void *input, const void *grad_output,
                                                        const void *weight, const void *running_mean,
                                                        const void *running_var, const void *save_mean,
                                                        const void *save_invstd, void *stream);

__C __export infiniStatus_t infiniopDestroyBatchNormBackwardDescriptor(infiniopBatchNormBackwardDescriptor_t desc);

#endif /* INFINIOP_OPS_BATCH_NORM_BACKWARD_H */
