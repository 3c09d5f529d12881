#include "rms_norm.h"

#include "infiniop/ops/rms_norm.h"
#include "ops/dispatch.h"

using op::rms_norm::Op;

__C infiniStatus_t infiniopCreateRMSNormDescriptor(infiniopHandle_t handle, infiniopRMSNormDescriptor_t *desc_ptr,
                                                   infiniopTensorDescriptor_t y_desc,
                                                   infiniopTensorDescriptor_t x_desc,
                                                   infiniopTensorDescriptor_t w_desc, float epsilon) {
    // The footprints in the order the run checks them: outputs (y, rstd) first.
    return op::createFromInfo<Op>(handle, desc_ptr, {y_desc, nullptr, x_desc, w_desc},
                                  [&](Op::Info *info) { return Op::Info::create(info, y_desc, x_desc, w_desc, epsilon); });
}

__C infiniStatus_t infiniopCreateRMSNormDescriptorEx(infiniopHandle_t handle, infiniopRMSNormDescriptor_t *desc_ptr,
                                                     infiniopTensorDescriptor_t y_desc,
                                                     infiniopTensorDescriptor_t rstd_desc,
                                                     infiniopTensorDescriptor_t x_desc,
                                                     infiniopTensorDescriptor_t w_desc, double epsilon) {
    return op::createFromInfo<Op>(handle, desc_ptr, {y_desc, rstd_desc, x_desc, w_desc}, [&](Op::Info *info) {
        return Op::Info::createEx(info, y_desc, rstd_desc, x_desc, w_desc, epsilon);
    });
}

__C infiniStatus_t infiniopGetRMSNormWorkspaceSize(infiniopRMSNormDescriptor_t desc, size_t *size) {
    return op::getWorkspaceSize<Op>(desc, size);
}

__C infiniStatus_t infiniopRMSNormEx(infiniopRMSNormDescriptor_t desc, void *workspace, size_t workspace_size,
                                     void *y, void *rstd, const void *x, const void *w, void *stream) {
    return infini::guarded([&] {
        const Op::Descriptor *op_desc;
        INFINI_CHECK(op::descriptorOf<Op>(desc, &op_desc));
        const auto &info = op_desc->info;
        const size_t elements = info.rows * info.dim;
        // An absent tensor counts as empty: its pointer is never read.
        INFINI_CHECK(infini::checkRunArgs(workspace, workspace_size, op_desc->workspaceSize(),
                                          {{y, elements}, {rstd, info.has_rstd ? info.rows : 0}, {x, elements},
                                           {w, info.dim}}));
        INFINI_CHECK(infini::checkNoAliasing(op_desc->footprints, workspace, op_desc->workspaceSize(),
                                             {y, rstd, x, w}, 2, {{0, 2}})); // y is x
        return op_desc->calculate(workspace, y, rstd, x, w, stream);
    });
}

__C infiniStatus_t infiniopRMSNorm(infiniopRMSNormDescriptor_t desc, void *workspace, size_t workspace_size, void *y,
                                   const void *x, const void *w, void *stream) {
    return infiniopRMSNormEx(desc, workspace, workspace_size, y, nullptr, x, w, stream);
}

__C infiniStatus_t infiniopDestroyRMSNormDescriptor(infiniopRMSNormDescriptor_t desc) {
    return op::destroyDescriptor<Op>(desc);
}
