#ifndef INFINIOP_OPS_LAYER_NORM_BACKWARD_H
#define INFINIOP_OPS_LAYER_NORM_BACKWARD_H

#include "../handle.h"
#include "../operator_descriptor.h"
#include "../tensor_descriptor.h"

typedef struct InfiniopDescriptor *infiniopLayerNormBackwardDescriptor_t;

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

__C __export infiniStatus_t infiniopDestroyLayerNormBackwardDescriptor(infiniopLayerNormBackwardDescriptor_t desc);

#endif /* INFINIOP_OPS_LAYER_NORM_BACKWARD_H */
