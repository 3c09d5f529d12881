#ifndef INFINIOP_OPS_LAYER_NORM_BACKWARD_H
#define INFINIOP_OPS_LAYER_NORM_BACKWARD_H

#include "../handle.h"
#include "../operator_descriptor.h"
#include "../tensor_descriptor.h"

typedef struct InfiniopDescriptor *infiniopLayerNormBackwardDescriptor_t;

/* grad_bias_desc may be NULL (a layer without bias, as InfiniCore passes it): grad_bias is then not computed, and
 * the run takes a NULL grad_bias pointer. Every other descriptor is required (NULL_POINTER). */
__C __export infiniStatus_t infiniopCreateLayerNormBackwardDescriptor(
    infiniopHandle_t handle, infiniopLayerNormBackwardDescriptor_t *desc_ptr,
    infiniopTensorDescriptor_t grad_input_desc, infiniopTensorDescriptor_t grad_weight_desc,
    infiniopTensorDescriptor_t grad_bias_desc, infiniopTensorDescriptor_t grad_output_desc,
    infiniopTensorDescriptor_t weight_desc, infiniopTensorDescriptor_t input_standardization_desc,
    infiniopTensorDescriptor_t input_std_deviation_desc);

__C __export infiniStatus_t infiniopGetLayerNormBackwardWorkspaceSize(infiniopLayerNormBackwardDescriptor_t desc,
                                                                      size_t *size);

__C __export infiniStatus_t infiniopLayerNormBackward(infiniopLayerNormBackwardDescriptor_t desc, void *workspace,
                                                      size_t workspace_size, void *grad_input, void *grad_weight,
                                                      void *grad_bias, const void *grad_output, const void *weight,
                                                      const void *input_standardization,
                                                      const void *input_std_deviation, void *stream);

/* Extension beyond the seed (not in upstream InfiniCore); the descriptor runs with infiniopLayerNormBackward.
 * - grad_input, grad_output, input_standardization: rank 1..8. input_std_deviation's rank s names the leading
 *   dims (its shape == grad_input.shape[:s]); the other k = rank - s >= 1 trailing dims are normalized and must
 *   be packed (stride 1 innermost, row-major) in grad_input, grad_output and input_standardization.
 *   weight, grad_weight, grad_bias have shape grad_input.shape[s:].
 * - grad_weight_desc / grad_bias_desc NULL: that gradient is not computed; its run pointer is ignored.
 * - weight_desc NULL: weight is all ones (LayerNorm without affine); its run pointer is ignored.
 * - dtypes: grad_input, grad_output, input_standardization share dT in {F16, BF16, F32, F64}; weight,
 *   grad_weight, grad_bias and input_std_deviation share dT or, for F16/BF16 dT, F32. */
__C __export infiniStatus_t infiniopCreateLayerNormBackwardDescriptorEx(
    infiniopHandle_t handle, infiniopLayerNormBackwardDescriptor_t *desc_ptr,
    infiniopTensorDescriptor_t grad_input_desc, infiniopTensorDescriptor_t grad_weight_desc,
    infiniopTensorDescriptor_t grad_bias_desc, infiniopTensorDescriptor_t grad_output_desc,
    infiniopTensorDescriptor_t weight_desc, infiniopTensorDescriptor_t input_standardization_desc,
    infiniopTensorDescriptor_t input_std_deviation_desc);

/* Extension beyond the seed: the form PyTorch (native_layer_norm_backward) and CANN (aclnnLayerNormBackward) take,
 * with the forward's input and per-row statistics in place of xhat and std. xhat = (input - mean) * rstd is formed
 * per element and never stored; then grad_input = (g - mean(g) - xhat * mean(g * xhat)) * rstd with
 * g = grad_output * weight, grad_weight = sum over rows of grad_output * xhat, grad_bias = sum of grad_output.
 * - input takes input_standardization's place in every rule of the Ex create above (shape, packed trailing dims).
 * - mean and rstd: one value per row, shape == grad_input.shape[:s] (their rank s names the leading dims), any
 *   strides; dtype F32 for F16/BF16/F32 data, F64 for F64 data.
 * - weight, grad_weight, grad_bias: as in the Ex create (NULL allowed; dT or, for F16/BF16 dT, F32).
 * The descriptor is a LayerNormBackward descriptor: infiniopGetLayerNormBackwardWorkspaceSize and
 * infiniopDestroyLayerNormBackwardDescriptor serve it. It runs with infiniopLayerNormBackwardFromInputEx only, and
 * that run refuses descriptors of the xhat form with BAD_PARAM (and the xhat runs refuse this form's), writing
 * nothing. */
__C __export infiniStatus_t infiniopCreateLayerNormBackwardFromInputDescriptorEx(
    infiniopHandle_t handle, infiniopLayerNormBackwardDescriptor_t *desc_ptr,
    infiniopTensorDescriptor_t grad_input_desc, infiniopTensorDescriptor_t grad_weight_desc,
    infiniopTensorDescriptor_t grad_bias_desc, infiniopTensorDescriptor_t grad_output_desc,
    infiniopTensorDescriptor_t weight_desc, infiniopTensorDescriptor_t input_desc,
    infiniopTensorDescriptor_t mean_desc, infiniopTensorDescriptor_t rstd_desc);

__C __export infiniStatus_t infiniopLayerNormBackwardFromInputEx(infiniopLayerNormBackwardDescriptor_t desc,
                                                                 void *workspace, size_t workspace_size,
                                                                 void *grad_input, void *grad_weight, void *grad_bias,
                                                                 const void *grad_output, const void *weight,
                                                                 const void *input, const void *mean,
                                                                 const void *rstd, void *stream);

__C __export infiniStatus_t infiniopDestroyLayerNormBackwardDescriptor(infiniopLayerNormBackwardDescriptor_t desc);

#endif /* INFINIOP_OPS_LAYER_NORM_BACKWARD_H */
