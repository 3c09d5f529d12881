#include "batch_norm_backward.h"

#include "infiniop/ops/batch_norm_backward.h"
#include "ops/dispatch.h"

using op::batch_norm_backward::Op;

__C infiniStatus_t infiniopCreateBatchNormBackwardDescriptor(
    infiniopHandle_t handle, infiniopBatchNormBackwardDescriptor_t *desc_ptr,
    infiniopTensorDescriptor_t grad_input_desc, infiniopTensorDescriptor_t grad_weight_desc,
    infiniopTensorDescriptor_t grad_bias_desc, infiniopTensorDescriptor_t input_desc,
    infiniopTensorDescriptor_t grad_output_desc, infiniopTensorDescriptor_t weight_desc,
    infiniopTensorDescriptor_t running_mean_desc, infiniopTensorDescriptor_t running_var_desc) {
    return op::createDescriptor<Op>(handle, desc_ptr, grad_input_desc, grad_weight_desc, grad_bias_desc, input_desc,
                                    grad_output_desc, weight_desc, running_mean_desc, running_var_desc);
}

__C infiniStatus_t infiniopCreateBatchNormBackwardDescriptorEx(
    infiniopHandle_t handle, infiniopBatchNormBackwardDescriptor_t *desc_ptr,
    infiniopTensorDescriptor_t grad_input_desc, infiniopTensorDescriptor_t grad_weight_desc,
    infiniopTensorDescriptor_t grad_bias_desc, infiniopTensorDescriptor_t input_desc,
    infiniopTensorDescriptor_t grad_output_desc, infiniopTensorDescriptor_t weight_desc,
    infiniopTensorDescriptor_t running_mean_desc, infiniopTensorDescriptor_t running_var_desc,
    infiniopTensorDescriptor_t save_mean_desc, infiniopTensorDescriptor_t save_invstd_desc, double epsilon,
    int training) {
    return op::createFromInfo<Op>(handle, desc_ptr,
                                  {grad_input_desc, grad_weight_desc, grad_bias_desc, input_desc, grad_output_desc,
                                   weight_desc, running_mean_desc, running_var_desc, save_mean_desc, save_invstd_desc},
                                  [&](Op::Info *info) {
        return Op::Info::createEx(info, grad_input_desc, grad_weight_desc, grad_bias_desc, input_desc,
                                  grad_output_desc, weight_desc, running_mean_desc, running_var_desc, save_mean_desc,
                                  save_invstd_desc, epsilon, training);
    });
}

__C infiniStatus_t infiniopGetBatchNormBackwardWorkspaceSize(infiniopBatchNormBackwardDescriptor_t desc,
                                                             size_t *size) {
    return op::getWorkspaceSize<Op>(desc, size);
}

__C infiniStatus_t infiniopBatchNormBackwardEx(infiniopBatchNormBackwardDescriptor_t desc, void *workspace,
                                               size_t workspace_size, void *grad_input, void *grad_weight,
                                               void *grad_bias, const void *input, const void *grad_output,
                                               const void *weight, const void *running_mean,
                                               const void *running_var, const void *save_mean,
                                               const void *save_invstd, void *stream) {
    return infini::guarded([&] {
        const Op::Descriptor *op_desc;
        INFINI_CHECK(op::descriptorOf<Op>(desc, &op_desc));
        const auto &info = op_desc->info;
        const size_t elements = info.elements();
        auto channelsIf = [&](bool used) { return used ? info.channels : 0; };
        // An absent or unused tensor counts as empty: its pointer is never read.
        INFINI_CHECK(infini::checkRunArgs(workspace, workspace_size, op_desc->workspaceSize(),
                                          {{grad_input, elements},
                                           {grad_weight, channelsIf(info.has_grad_weight)},
                                           {grad_bias, channelsIf(info.has_grad_bias)},
                                           {input, elements},
                                           {grad_output, elements},
                                           {weight, channelsIf(info.has_weight)},
                                           {running_mean, channelsIf(info.usesRunning())},
                                           {running_var, channelsIf(info.usesRunning())},
                                           {save_mean, channelsIf(info.has_save)},
                                           {save_invstd, channelsIf(info.has_save)}}));
        INFINI_CHECK(infini::checkNoAliasing(op_desc->footprints, workspace, op_desc->workspaceSize(),
                                             {grad_input, grad_weight, grad_bias, input, grad_output, weight,
                                              running_mean, running_var, save_mean, save_invstd},
                                             3, {{0, 4}})); // grad_input is grad_output
        return op_desc->calculate(workspace, grad_input, grad_weight, grad_bias, input, grad_output, weight,
                                  running_mean, running_var, save_mean, save_invstd, stream);
    });
}

__C infiniStatus_t infiniopBatchNormBackward(infiniopBatchNormBackwardDescriptor_t desc, void *workspace,
                                             size_t workspace_size, void *grad_input, void *grad_weight,
                                             void *grad_bias, const void *input, const void *grad_output,
                                             const void *weight, const void *running_mean, const void *running_var,
                                             void *stream) {
    return infiniopBatchNormBackwardEx(desc, workspace, workspace_size, grad_input, grad_weight, grad_bias, input,
                                       grad_output, weight, running_mean, running_var, nullptr, nullptr, stream);
}

__C infiniStatus_t infiniopDestroyBatchNormBackwardDescriptor(infiniopBatchNormBackwardDescriptor_t desc) {
    return op::destroyDescriptor<Op>(desc);
}
