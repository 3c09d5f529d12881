#include "batch_norm.h"

#include "infiniop/ops/batch_norm.h"
#include "ops/dispatch.h"

using op::batch_norm::Op;

__C infiniStatus_t infiniopCreateBatchNormDescriptor(infiniopHandle_t handle, infiniopBatchNormDescriptor_t *desc_ptr,
                                                     infiniopTensorDescriptor_t output_desc,
                                                     infiniopTensorDescriptor_t running_mean_desc,
                                                     infiniopTensorDescriptor_t running_var_desc,
                                                     infiniopTensorDescriptor_t input_desc,
                                                     infiniopTensorDescriptor_t weight_desc,
                                                     infiniopTensorDescriptor_t bias_desc, float momentum, float eps) {
    // The footprints in the Ex run's order: y, save_mean, save_invstd, running_mean, running_var, x, w, b.
    return op::createFromInfo<Op>(handle, desc_ptr,
                                  {output_desc, nullptr, nullptr, running_mean_desc, running_var_desc, input_desc,
                                   weight_desc, bias_desc},
                                  [&](Op::Info *info) {
        return Op::Info::create(info, output_desc, running_mean_desc, running_var_desc, input_desc, weight_desc,
                                bias_desc, momentum, eps);
    });
}

__C infiniStatus_t infiniopCreateBatchNormDescriptorEx(
    infiniopHandle_t handle, infiniopBatchNormDescriptor_t *desc_ptr, infiniopTensorDescriptor_t y_desc,
    infiniopTensorDescriptor_t save_mean_desc, infiniopTensorDescriptor_t save_invstd_desc,
    infiniopTensorDescriptor_t running_mean_desc, infiniopTensorDescriptor_t running_var_desc,
    infiniopTensorDescriptor_t x_desc, infiniopTensorDescriptor_t weight_desc, infiniopTensorDescriptor_t bias_desc,
    int training, double momentum, double eps) {
    return op::createFromInfo<Op>(handle, desc_ptr,
                                  {y_desc, save_mean_desc, save_invstd_desc, running_mean_desc, running_var_desc,
                                   x_desc, weight_desc, bias_desc},
                                  [&](Op::Info *info) {
        return Op::Info::createEx(info, y_desc, save_mean_desc, save_invstd_desc, running_mean_desc,
                                  running_var_desc, x_desc, weight_desc, bias_desc, training, momentum, eps);
    });
}

__C infiniStatus_t infiniopGetBatchNormWorkspaceSize(infiniopBatchNormDescriptor_t desc, size_t *size) {
    return op::getWorkspaceSize<Op>(desc, size);
}

__C infiniStatus_t infiniopBatchNormEx(infiniopBatchNormDescriptor_t desc, void *workspace, size_t workspace_size,
                                       void *y, void *save_mean, void *save_invstd, void *running_mean,
                                       void *running_var, const void *x, const void *weight, const void *bias,
                                       void *stream) {
    return infini::guarded([&] {
        const Op::Descriptor *op_desc;
        INFINI_CHECK(op::descriptorOf<Op>(desc, &op_desc));
        const auto &info = op_desc->info;
        const size_t elements = info.elements();
        auto channelsIf = [&](bool used) { return used ? info.channels : 0; };
        // An absent tensor counts as empty: its pointer is never read.
        INFINI_CHECK(infini::checkRunArgs(workspace, workspace_size, op_desc->workspaceSize(),
                                          {{y, elements},
                                           {save_mean, channelsIf(info.has_save_mean)},
                                           {save_invstd, channelsIf(info.has_save_invstd)},
                                           {running_mean, channelsIf(info.has_running)},
                                           {running_var, channelsIf(info.has_running)},
                                           {x, elements},
                                           {weight, channelsIf(info.has_weight)},
                                           {bias, channelsIf(info.has_bias)}}));
        // Outputs first: y, the saved statistics and the running ones (in/out); y may be x.
        INFINI_CHECK(infini::checkNoAliasing(op_desc->footprints, workspace, op_desc->workspaceSize(),
                                             {y, save_mean, save_invstd, running_mean, running_var, x, weight, bias},
                                             5, {{0, 5}}));
        auto ifUsed = [](bool used, auto *pointer) { return used ? pointer : nullptr; };
        return op_desc->calculate(workspace, y, ifUsed(info.has_save_mean, save_mean),
                                  ifUsed(info.has_save_invstd, save_invstd), ifUsed(info.has_running, running_mean),
                                  ifUsed(info.has_running, running_var), x, ifUsed(info.has_weight, weight),
                                  ifUsed(info.has_bias, bias), stream);
    });
}

__C infiniStatus_t infiniopBatchNorm(infiniopBatchNormDescriptor_t desc, void *workspace, size_t workspace_size,
                                     void *output, void *running_mean, void *running_var, const void *input,
                                     const void *weight, const void *bias, void *stream) {
    return infiniopBatchNormEx(desc, workspace, workspace_size, output, nullptr, nullptr, running_mean, running_var,
                               input, weight, bias, stream);
}

__C infiniStatus_t infiniopDestroyBatchNormDescriptor(infiniopBatchNormDescriptor_t desc) {
    return op::destroyDescriptor<Op>(desc);
}
