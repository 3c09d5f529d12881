#include "layer_norm_backward.h"

#include "infiniop/ops/layer_norm_backward.h"
#include "ops/dispatch.h"

using op::layer_norm_backward::Op;

__C infiniStatus_t infiniopCreateLayerNormBackwardDescriptor(
    infiniopHandle_t handle, infiniopLayerNormBackwardDescriptor_t *desc_ptr,
    infiniopTensorDescriptor_t grad_input_desc, infiniopTensorDescriptor_t grad_weight_desc,
    infiniopTensorDescriptor_t grad_bias_desc, infiniopTensorDescriptor_t grad_output_desc,
    infiniopTensorDescriptor_t weight_desc, infiniopTensorDescriptor_t input_standardization_desc,
    infiniopTensorDescriptor_t input_std_deviation_desc) {
    // grad_bias_desc (argument 2) may be NULL: a layer without bias, as InfiniCore passes it; not computed then.
    return op::createDescriptor<Op>(handle, desc_ptr, 2, grad_input_desc, grad_weight_desc, grad_bias_desc,
                                    grad_output_desc, weight_desc, input_standardization_desc,
                                    input_std_deviation_desc);
}

__C infiniStatus_t infiniopCreateLayerNormBackwardDescriptorEx(
    infiniopHandle_t handle, infiniopLayerNormBackwardDescriptor_t *desc_ptr,
    infiniopTensorDescriptor_t grad_input_desc, infiniopTensorDescriptor_t grad_weight_desc,
    infiniopTensorDescriptor_t grad_bias_desc, infiniopTensorDescriptor_t grad_output_desc,
    infiniopTensorDescriptor_t weight_desc, infiniopTensorDescriptor_t input_standardization_desc,
    infiniopTensorDescriptor_t input_std_deviation_desc) {
    return op::createFromInfo<Op>(handle, desc_ptr,
                                  {grad_input_desc, grad_weight_desc, grad_bias_desc, grad_output_desc, weight_desc,
                                   input_standardization_desc, input_std_deviation_desc},
                                  [&](Op::Info *info) {
        return Op::Info::createEx(info, grad_input_desc, grad_weight_desc, grad_bias_desc, grad_output_desc,
                                  weight_desc, input_standardization_desc, input_std_deviation_desc);
    });
}

__C infiniStatus_t infiniopGetLayerNormBackwardWorkspaceSize(infiniopLayerNormBackwardDescriptor_t desc,
                                                             size_t *size) {
    return op::getWorkspaceSize<Op>(desc, size);
}

namespace {

// Both run functions: the descriptor must be of their form (BAD_PARAM, nothing written, otherwise). `data`: the
// run's data pointers in C order, the outputs first; row_mean is absent (NULL) in the xhat form.
infiniStatus_t runForm(infiniopLayerNormBackwardDescriptor_t desc, Op::Info::Form form, void *workspace,
                       size_t workspace_size, void *grad_input, void *grad_weight, void *grad_bias,
                       const void *grad_output, const void *weight, const void *row_input, const void *row_mean,
                       const void *row_scale, void *stream) {
    return infini::guarded([&] {
        const Op::Descriptor *op_desc;
        INFINI_CHECK(op::descriptorOf<Op>(desc, &op_desc));
        const auto &info = op_desc->info;
        if (info.form != form) return INFINI_STATUS_BAD_PARAM;
        const bool from_input = form == Op::Info::Form::from_input;
        size_t elements = info.rows * info.dim;
        // An absent tensor (NULL in the Ex create) counts as empty: its pointer is never read.
        INFINI_CHECK(infini::checkRunArgs(workspace, workspace_size, op_desc->workspaceSize(),
                                          {{grad_input, elements},
                                           {grad_weight, info.has_grad_weight ? info.dim : 0},
                                           {grad_bias, info.has_grad_bias ? info.dim : 0},
                                           {grad_output, elements},
                                           {weight, info.has_weight ? info.dim : 0},
                                           {row_input, elements},
                                           {row_mean, from_input ? info.rows : 0},
                                           {row_scale, info.rows}}));
        const std::initializer_list<const void *> xhat_data = {grad_input, grad_weight, grad_bias, grad_output,
                                                               weight, row_input, row_scale};
        const std::initializer_list<const void *> from_input_data = {grad_input, grad_weight, grad_bias, grad_output,
                                                                     weight, row_input, row_mean, row_scale};
        INFINI_CHECK(infini::checkNoAliasing(op_desc->footprints, workspace, op_desc->workspaceSize(),
                                             from_input ? from_input_data : xhat_data, 3,
                                             {{0, 3}})); // grad_input is grad_output
        return op_desc->calculate(workspace, grad_input, grad_weight, grad_bias, grad_output, weight, row_input,
                                  row_mean, row_scale, stream);
    });
}

} // namespace

__C infiniStatus_t infiniopLayerNormBackward(infiniopLayerNormBackwardDescriptor_t desc, void *workspace,
                                             size_t workspace_size, void *grad_input, void *grad_weight,
                                             void *grad_bias, const void *grad_output, const void *weight,
                                             const void *input_standardization, const void *input_std_deviation,
                                             void *stream) {
    return runForm(desc, Op::Info::Form::xhat, workspace, workspace_size, grad_input, grad_weight, grad_bias,
                   grad_output, weight, input_standardization, nullptr, input_std_deviation, stream);
}

__C infiniStatus_t infiniopCreateLayerNormBackwardFromInputDescriptorEx(
    infiniopHandle_t handle, infiniopLayerNormBackwardDescriptor_t *desc_ptr,
    infiniopTensorDescriptor_t grad_input_desc, infiniopTensorDescriptor_t grad_weight_desc,
    infiniopTensorDescriptor_t grad_bias_desc, infiniopTensorDescriptor_t grad_output_desc,
    infiniopTensorDescriptor_t weight_desc, infiniopTensorDescriptor_t input_desc,
    infiniopTensorDescriptor_t mean_desc, infiniopTensorDescriptor_t rstd_desc) {
    return op::createFromInfo<Op>(handle, desc_ptr,
                                  {grad_input_desc, grad_weight_desc, grad_bias_desc, grad_output_desc, weight_desc,
                                   input_desc, mean_desc, rstd_desc},
                                  [&](Op::Info *info) {
        return Op::Info::createFromInput(info, grad_input_desc, grad_weight_desc, grad_bias_desc, grad_output_desc,
                                         weight_desc, input_desc, mean_desc, rstd_desc);
    });
}

__C infiniStatus_t infiniopLayerNormBackwardFromInputEx(infiniopLayerNormBackwardDescriptor_t desc, void *workspace,
                                                        size_t workspace_size, void *grad_input, void *grad_weight,
                                                        void *grad_bias, const void *grad_output, const void *weight,
                                                        const void *input, const void *mean, const void *rstd,
                                                        void *stream) {
    return runForm(desc, Op::Info::Form::from_input, workspace, workspace_size, grad_input, grad_weight, grad_bias,
                   grad_output, weight, input, mean, rstd, stream);
}

__C infiniStatus_t infiniopDestroyLayerNormBackwardDescriptor(infiniopLayerNormBackwardDescriptor_t desc) {
    return op::destroyDescriptor<Op>(desc);
}
