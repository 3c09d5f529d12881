#ifndef INFINIOP_OPS_BATCH_NORM_BACKWARD_H
#define INFINIOP_OPS_BATCH_NORM_BACKWARD_H

#include "../handle.h"
#include "../operator_descriptor.h"
#include "../tensor_descriptor.h"

typedef struct InfiniopDescriptor *infiniopBatchNormBackwardDescriptor_t;

/* grad_bias_desc may be NULL (a layer without bias, as InfiniCore passes it): grad_bias is then not computed, and
 * the run takes a NULL grad_bias pointer. Every other descriptor is required (NULL_POINTER). */
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

/* BatchNorm backward in two phases, for a batch split over processes (SyncBatchNorm): each process runs the
 * reduce phase on its part of the batch, the callers add up the sums of all processes (e.g. an all-reduce), and
 * each runs the elementwise phase with those totals. Both take a training descriptor of
 * infiniopCreateBatchNormBackwardDescriptorEx (training != 0; eval descriptors: BAD_PARAM, eval mode has
 * nothing to add up) and its workspace size; each runs the same statistics rules as infiniopBatchNormBackwardEx.
 * sum_grad_output and sum_grad_centered are C contiguous values of the statistics dtype (F32; F64 for F64
 * data): per channel c, sum(grad_output) and sum(grad_output * (input - mean)) over the elements of channel c.
 * With one process, reduce then elementwise (total_count = N * L) gives the bits of infiniopBatchNormBackwardEx.
 * Deterministic: fixed tiles, a fixed order of additions, no atomics.
 * - Reduce: writes sum_grad_output, sum_grad_centered and the descriptor's grad_weight / grad_bias (those it was
 *   created with) for this process's data; grad_input and weight are not touched.
 * - Elementwise: writes grad_input from the totals over all processes; total_count is the number of elements
 *   per channel over all processes (an int64 >= this process's N * L, else BAD_PARAM); grad_weight and
 *   grad_bias are not touched. grad_input may be grad_output (same layout), as in the single call. */
__C __export infiniStatus_t infiniopBatchNormBackwardReduceEx(infiniopBatchNormBackwardDescriptor_t desc,
                                                              void *workspace, size_t workspace_size,
                                                              void *sum_grad_output, void *sum_grad_centered,
                                                              void *grad_weight, void *grad_bias, const void *input,
                                                              const void *grad_output, const void *running_mean,
                                                              const void *running_var, const void *save_mean,
                                                              const void *save_invstd, void *stream);

__C __export infiniStatus_t infiniopBatchNormBackwardElementwiseEx(
    infiniopBatchNormBackwardDescriptor_t desc, void *workspace, size_t workspace_size, void *grad_input,
    const void *input, const void *grad_output, const void *weight, const void *running_mean,
    const void *running_var, const void *save_mean, const void *save_invstd, const void *sum_grad_output,
    const void *sum_grad_centered, int64_t total_count, void *stream);

__C __export infiniStatus_t infiniopDestroyBatchNormBackwardDescriptor(infiniopBatchNormBackwardDescriptor_t desc);

#endif /* INFINIOP_OPS_BATCH_NORM_BACKWARD_H */
