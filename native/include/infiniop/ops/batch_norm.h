#ifndef INFINIOP_OPS_BATCH_NORM_H
#define INFINIOP_OPS_BATCH_NORM_H

#include "../handle.h"
#include "../operator_descriptor.h"
#include "../tensor_descriptor.h"

typedef struct InfiniopDescriptor *infiniopBatchNormDescriptor_t;

/* BatchNorm forward in training mode, as the InfiniCore documentation declares it: per channel c (dim 1), mean and
 * biased variance var over every other dim, output = (input - mean) / sqrt(var + eps) * weight + bias, and the
 * running statistics updated in place as PyTorch does: running_mean = (1 - momentum) * running_mean + momentum *
 * mean, running_var = (1 - momentum) * running_var + momentum * var * M / (M - 1) (M = elements per channel;
 * the unbiased variance). output, input: (N, C, L), one dtype dT in {F16, BF16, F32} (F64: the Ex form only),
 * fully contiguous; running_mean, running_var, weight, bias: (C,) of dT too (F32 ones for 16-bit data: the Ex
 * form), any stride.
 * momentum must be finite, eps finite and >= 0 (BAD_PARAM otherwise); M == 1 is BAD_TENSOR_SHAPE (no unbiased
 * variance). */
__C __export infiniStatus_t infiniopCreateBatchNormDescriptor(infiniopHandle_t handle,
                                                              infiniopBatchNormDescriptor_t *desc_ptr,
                                                              infiniopTensorDescriptor_t output_desc,
                                                              infiniopTensorDescriptor_t running_mean_desc,
                                                              infiniopTensorDescriptor_t running_var_desc,
                                                              infiniopTensorDescriptor_t input_desc,
                                                              infiniopTensorDescriptor_t weight_desc,
                                                              infiniopTensorDescriptor_t bias_desc, float momentum,
                                                              float eps);

__C __export infiniStatus_t infiniopGetBatchNormWorkspaceSize(infiniopBatchNormDescriptor_t desc, size_t *size);

__C __export infiniStatus_t infiniopBatchNorm(infiniopBatchNormDescriptor_t desc, void *workspace,
                                              size_t workspace_size, void *output, void *running_mean,
                                              void *running_var, const void *input, const void *weight,
                                              const void *bias, void *stream);

/* Extensions beyond upstream InfiniCore: the forward that saves what PyTorch's saves for the backward, and the
 * eval form. Outputs first, as in every other function here: y, save_mean, save_invstd, then the running
 * statistics (read and written in training, read in eval), then the inputs x, weight, bias. A descriptor made by
 * either create function runs with either run function; the seed run passes save_mean = save_invstd = NULL.
 * - y, x: (N, C, *spatial) of rank 2..5, both channels-first packed (row-major) or both channels-last packed (C
 *   innermost with stride 1, then the spatial dims, then N: NHWC for rank 4), as the backward Ex takes them. y may
 *   be x (in place).
 * - training != 0: normalizes with the batch statistics. save_mean_desc / save_invstd_desc (each may be NULL: not
 *   written) get the batch mean and 1/sqrt(var + eps): what infiniopCreateBatchNormBackwardDescriptorEx takes as
 *   save_mean and save_invstd. running_mean_desc and running_var_desc: both given (updated as above; M == 1 is
 *   BAD_TENSOR_SHAPE) or both NULL (nothing updated).
 * - training == 0 (eval): y = (x - running_mean) / sqrt(running_var + eps) * weight + bias; both running
 *   statistics are required (NULL_POINTER) and only read; save_mean / save_invstd must be NULL (BAD_PARAM).
 * - weight_desc / bias_desc NULL: weight ones / bias zeros; their run pointers are ignored.
 * - dtypes: y, x share dT in {F16, BF16, F32, F64}; weight, bias, running_mean and running_var share dT or, for
 *   F16/BF16 dT, F32; save_mean and save_invstd are F32 (F64 for F64 dT). Every per-channel tensor has shape (C,);
 *   those written must not overlap themselves.
 * - momentum must be finite and eps finite and >= 0 (BAD_PARAM otherwise). */
__C __export infiniStatus_t infiniopCreateBatchNormDescriptorEx(
    infiniopHandle_t handle, infiniopBatchNormDescriptor_t *desc_ptr, infiniopTensorDescriptor_t y_desc,
    infiniopTensorDescriptor_t save_mean_desc, infiniopTensorDescriptor_t save_invstd_desc,
    infiniopTensorDescriptor_t running_mean_desc, infiniopTensorDescriptor_t running_var_desc,
    infiniopTensorDescriptor_t x_desc, infiniopTensorDescriptor_t weight_desc, infiniopTensorDescriptor_t bias_desc,
    int training, double momentum, double eps);

__C __export infiniStatus_t infiniopBatchNormEx(infiniopBatchNormDescriptor_t desc, void *workspace,
                                                size_t workspace_size, void *y, void *save_mean, void *save_invstd,
                                                void *running_mean, void *running_var, const void *x,
                                                const void *weight, const void *bias, void *stream);

__C __export infiniStatus_t infiniopDestroyBatchNormDescriptor(infiniopBatchNormDescriptor_t desc);

#endif /* INFINIOP_OPS_BATCH_NORM_H */
