#include "rms_norm_backward.h"

#include "infiniop/ops/rms_norm_backward.h"
#include "ops/dispatch.h"

using op::rms_norm_backward::Op;

__C infiniStatus_t infiniopCreateRMSNormBackwardDescriptor(
    infiniopHandle_t handle, infiniopRMSNormBackwardDescriptor_t *desc_ptr, infiniopTensorDescriptor_t grad_x_desc,
    infiniopTensorDescriptor_t grad_w_desc, infiniopTensorDescriptor_t grad_y_desc, infiniopTensorDescriptor_t x_desc,
    infiniopTensorDescriptor_t w_desc) {
    return op::createDescriptor<Op>(handle, desc_ptr, op::kNoneOptional, grad_x_desc, grad_w_desc, grad_y_desc, x_desc,
                                    w_desc);
}

__C infiniStatus_t infiniopCreateRMSNormBackwardDescriptorEx(
    infiniopHandle_t handle, infiniopRMSNormBackwardDescriptor_t *desc_ptr, infiniopTensorDescriptor_t grad_x_desc,
    infiniopTensorDescriptor_t grad_w_desc, infiniopTensorDescriptor_t grad_y_desc, infiniopTensorDescriptor_t x_desc,
    infiniopTensorDescriptor_t w_desc, infiniopTensorDescriptor_t rstd_desc, double epsilon) {
    return op::createFromInfo<Op>(handle, desc_ptr, {grad_x_desc, grad_w_desc, grad_y_desc, x_desc, w_desc, rstd_desc},
                                  [&](Op::Info *info) {
        return Op::Info::createEx(info, grad_x_desc, grad_w_desc, grad_y_desc, x_desc, w_desc, rstd_desc, epsilon);
    });
}

__C infiniStatus_t infiniopGetRMSNormBackwardWorkspaceSize(infiniopRMSNormBackwardDescriptor_t desc, size_t *size) {
    return op::getWorkspaceSize<Op>(desc, size);
}

__C infiniStatus_t infiniopRMSNormBackwardEx(infiniopRMSNormBackwardDescriptor_t desc, void *workspace,
                                             size_t workspace_size, void *grad_x, void *grad_w, const void *grad_y,
                                             const void *x, const void *w, const void *rstd, void *stream) {
    return infini::guarded([&] {
        const Op::Descriptor *op_desc;
        INFINI_CHECK(op::descriptorOf<Op>(desc, &op_desc));
        const auto &info = op_desc->info;
        size_t elements = info.rows * info.dim;
        // An absent tensor counts as empty: its pointer is never read.
        INFINI_CHECK(infini::checkRunArgs(workspace, workspace_size, op_desc->workspaceSize(),
                                          {{grad_x, elements},
                                           {grad_w, info.has_grad_w ? info.dim : 0},
                                           {grad_y, elements},
                                           {x, elements},
                                           {w, info.dim},
                                           {rstd, info.has_rstd ? info.rows : 0}}));
        INFINI_CHECK(infini::checkNoAliasing(op_desc->footprints, workspace, op_desc->workspaceSize(),
                                             {grad_x, grad_w, grad_y, x, w, rstd}, 2, {{0, 2}})); // grad_x is grad_y
        return op_desc->calculate(workspace, grad_x, grad_w, grad_y, x, w, rstd, stream);
    });
}

__C infiniStatus_t infiniopRMSNormBackward(infiniopRMSNormBackwardDescriptor_t desc, void *workspace,
                                           size_t workspace_size, void *grad_x, void *grad_w, const void *grad_y,
                                           const void *x, const void *w, void *stream) {
    return infiniopRMSNormBackwardEx(desc, workspace, workspace_size, grad_x, grad_w, grad_y, x, w, nullptr, stream);
}

__C infiniStatus_t infiniopDestroyRMSNormBackwardDescriptor(infiniopRMSNormBackwardDescriptor_t desc) {
    return op::destroyDescriptor<Op>(desc);
}
