#ifndef INFINIOP_OPS_LAYER_NORM_H
#define INFINIOP_OPS_LAYER_NORM_H

#include "../handle.h"
#include "../operator_descriptor.h"
#include "../tensor_descriptor.h"

typedef struct InfiniopDescriptor *infiniopLayerNormDescriptor_t;

/* LayerNorm forward, as upstream InfiniCore (InfiniTensor/InfiniCore) declares it: over the last dim,
 * xhat = (input - mean) / std with std = sqrt(var + eps) (biased variance), output = xhat * weight + bias.
 * - output, input_standardization (xhat), input: (rows, L) or (N1, N2, L), last dim contiguous;
 *   input_std_deviation (std): input.shape[:-1], any strides; weight, bias: (L,), any stride.
 * - dtypes: output, input_standardization, input share dT in {F16, BF16, F32, F64}; weight, bias and
 *   input_std_deviation share dT or, for F16/BF16 dT, F32: what infiniopCreateLayerNormBackwardDescriptor(Ex)
 *   takes as its input_standardization and input_std_deviation.
 * - bias_desc NULL: no bias. input_standardization_desc / input_std_deviation_desc NULL (beyond upstream, which
 *   always writes them): not written; their run pointers are ignored. weight is required.
 * - output may be input (in place) with the same layout. eps must be finite and >= 0 (BAD_PARAM otherwise). */
__C __export infiniStatus_t infiniopCreateLayerNormDescriptor(infiniopHandle_t handle,
                                                              infiniopLayerNormDescriptor_t *desc_ptr,
                                                              infiniopTensorDescriptor_t output_desc,
                                                              infiniopTensorDescriptor_t input_standardization_desc,
                                                              infiniopTensorDescriptor_t input_std_deviation_desc,
                                                              infiniopTensorDescriptor_t input_desc,
                                                              infiniopTensorDescriptor_t weight_desc,
                                                              infiniopTensorDescriptor_t bias_desc, float eps);

__C __export infiniStatus_t infiniopGetLayerNormWorkspaceSize(infiniopLayerNormDescriptor_t desc, size_t *size);

__C __export infiniStatus_t infiniopLayerNorm(infiniopLayerNormDescriptor_t desc, void *workspace,
                                              size_t workspace_size, void *output, void *input_standardization,
                                              void *input_std_deviation, const void *input, const void *weight,
                                              const void *bias, void *stream);

/* Extension beyond upstream InfiniCore: the forward that saves what PyTorch's native_layer_norm saves, the per-row
 * mean and rstd = 1/sqrt(var + eps), which infiniopCreateLayerNormBackwardFromInputDescriptorEx takes. Outputs
 * first: y, mean, rstd, then the inputs x, w, b. y = (x - mean) * rstd * w + b.
 * - y, x: rank 1..8, the normalized trailing dims packed (stride 1 innermost, row-major), leading dims any
 *   strides; y must not overlap itself; y may be x (in place) with the same layout.
 * - The normalized dims: the last k, where k is the rank of w (or of b where w is NULL); with neither, the rank of
 *   mean (or rstd) names the leading dims; with none of them, the last dim alone. w and b have shape x.shape[-k:],
 *   any strides that step through memory as one vector; NULL: ones (w), zeros (b).
 * - mean_desc / rstd_desc NULL: not written; their run pointers are ignored. Otherwise shape x.shape[:-k], any
 *   strides that do not overlap themselves.
 * - dtypes: y, x share dT in {F16, BF16, F32, F64}; w, b share dT or, for F16/BF16 dT, F32; mean and rstd are F32
 *   (F64 for F64 data).
 * - eps must be finite and >= 0 (BAD_PARAM otherwise).
 * The descriptor is a LayerNorm descriptor (workspace size, destroy), and runs with infiniopLayerNormEx only; that
 * run refuses descriptors of the seed create with BAD_PARAM, and infiniopLayerNorm refuses this create's, writing
 * nothing. */
__C __export infiniStatus_t infiniopCreateLayerNormDescriptorEx(infiniopHandle_t handle,
                                                                infiniopLayerNormDescriptor_t *desc_ptr,
                                                                infiniopTensorDescriptor_t y_desc,
                                                                infiniopTensorDescriptor_t mean_desc,
                                                                infiniopTensorDescriptor_t rstd_desc,
                                                                infiniopTensorDescriptor_t x_desc,
                                                                infiniopTensorDescriptor_t w_desc,
                                                                infiniopTensorDescriptor_t b_desc, double eps);

__C __export infiniStatus_t infiniopLayerNormEx(infiniopLayerNormDescriptor_t desc, void *workspace,
                                                size_t workspace_size, void *y, void *mean, void *rstd,
                                                const void *x, const void *w, const void *b, void *stream);

__C __export infiniStatus_t infiniopDestroyLayerNormDescriptor(infiniopLayerNormDescriptor_t desc);

#endif /* INFINIOP_OPS_LAYER_NORM_H */
