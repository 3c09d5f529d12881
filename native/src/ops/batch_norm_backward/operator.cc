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

__C infiniStatus_t infiniopGetBatchNormBackwardWorkspaceSize(infiniopBatchNormBackwardDescriptor_t desc,
                                                             size_t *size) {
    return op::getWorkspaceSize<Op>(desc, size);
}

__C infiniStatus_t infiniopBatchNormBackward(infiniopBatchNormBackwardDescriptor_t desc, void *workspace,
                                             size_t workspace_size, void *grad_input, void *grad_weight,
                                             void *grad_bias, const void *input, const void *grad_output,
                                             const void *weight, const void *running_mean, const void *running_var,
                                             void *stream) {
    return infini::guarded([&] {
        const Op::Descriptor *op_desc;
        INFINI_CHECK(op::descriptorOf<Op>(desc, &op_desc));
        const auto &info = op_desc->info;
        size_t elements = info.elements();
        INFINI_CHECK(infini::checkRunArgs(workspace, workspace_size, op_desc->workspaceSize(),
                                          {{grad_input, elements},
                                           {grad_weight, info.channels},
                                           {grad_bias, info.channels},
                                           {input, elements},
                                           {grad_output, elements},
                                           {weight, info.channels},
                                           {running_mean, info.channels},
                                           {running_var, info.channels}}));
        INFINI_CHECK(infini::checkNoAliasing(op_desc->footprints, workspace, op_desc->workspaceSize(),
                                             {grad_input, grad_weight, grad_bias, input, grad_output, weight,
                                              running_mean, running_var},
                                             3, {{0, 4}})); // grad_input is grad_output
        return op_desc->calculate(workspace, grad_input, grad_weight, grad_bias, input, grad_output, weight,
                                  running_mean, running_var, stream);
    });
}

__C infiniStatus_t infiniopDestroyBatchNormBackwardDescriptor(infiniopBatchNormBackwardDescriptor_t desc) {
    return op::destroyDescriptor<Op>(desc);
}
