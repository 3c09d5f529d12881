#include "layer_norm.h"

#include "infiniop/ops/layer_norm.h"
#include "ops/dispatch.h"

using op::layer_norm::Op;

__C infiniStatus_t infiniopCreateLayerNormDescriptor(infiniopHandle_t handle, infiniopLayerNormDescriptor_t *desc_ptr,
                                                     infiniopTensorDescriptor_t output_desc,
                                                     infiniopTensorDescriptor_t input_standardization_desc,
                                                     infiniopTensorDescriptor_t input_std_deviation_desc,
                                                     infiniopTensorDescriptor_t input_desc,
                                                     infiniopTensorDescriptor_t weight_desc,
                                                     infiniopTensorDescriptor_t bias_desc, float eps) {
    return op::createFromInfo<Op>(handle, desc_ptr,
                                  {output_desc, input_standardization_desc, input_std_deviation_desc, input_desc,
                                   weight_desc, bias_desc},
                                  [&](Op::Info *info) {
        return Op::Info::create(info, output_desc, input_standardization_desc, input_std_deviation_desc,
                                input_desc, weight_desc, bias_desc, eps);
    });
}

__C infiniStatus_t infiniopCreateLayerNormDescriptorEx(infiniopHandle_t handle, infiniopLayerNormDescriptor_t *desc_ptr,
                                                       infiniopTensorDescriptor_t y_desc,
                                                       infiniopTensorDescriptor_t mean_desc,
                                                       infiniopTensorDescriptor_t rstd_desc,
                                                       infiniopTensorDescriptor_t x_desc,
                                                       infiniopTensorDescriptor_t w_desc,
                                                       infiniopTensorDescriptor_t b_desc, double eps) {
    return op::createFromInfo<Op>(handle, desc_ptr, {y_desc, mean_desc, rstd_desc, x_desc, w_desc, b_desc},
                                  [&](Op::Info *info) {
        return Op::Info::createEx(info, y_desc, mean_desc, rstd_desc, x_desc, w_desc, b_desc, eps);
    });
}

__C infiniStatus_t infiniopGetLayerNormWorkspaceSize(infiniopLayerNormDescriptor_t desc, size_t *size) {
    return op::getWorkspaceSize<Op>(desc, size);
}

namespace {

// Both run functions: the descriptor must be of their form (BAD_PARAM, nothing written, otherwise). The data
// pointers in C order: y, then the form's row output (xhat, NULL in the statistics form) and its two per-row
// outputs (std and NULL, or mean and rstd), then x, w, b.
infiniStatus_t runForm(infiniopLayerNormDescriptor_t desc, Op::Info::Form form, void *workspace,
                       size_t workspace_size, void *y, void *xhat, void *first_statistic, void *rstd, const void *x,
                       const void *w, const void *b, void *stream) {
    return infini::guarded([&] {
        const Op::Descriptor *op_desc;
        INFINI_CHECK(op::descriptorOf<Op>(desc, &op_desc));
        const auto &info = op_desc->info;
        if (info.form != form) return INFINI_STATUS_BAD_PARAM;
        const size_t elements = info.rows * info.dim;
        // An absent tensor counts as empty: its pointer is never read.
        INFINI_CHECK(infini::checkRunArgs(workspace, workspace_size, op_desc->workspaceSize(),
                                          {{y, elements},
                                           {xhat, info.has_xhat ? elements : 0},
                                           {first_statistic, info.has_first_statistic ? info.rows : 0},
                                           {rstd, info.has_rstd ? info.rows : 0},
                                           {x, elements},
                                           {w, info.has_w ? info.dim : 0},
                                           {b, info.has_b ? info.dim : 0}}));
        // The footprints follow the create's order: the seed's (y, xhat, std, x, w, b), the Ex's (y, mean, rstd,
        // x, w, b); y may be x.
        if (form == Op::Info::Form::xhat) {
            INFINI_CHECK(infini::checkNoAliasing(op_desc->footprints, workspace, op_desc->workspaceSize(),
                                                 {y, xhat, first_statistic, x, w, b}, 3, {{0, 3}}));
        } else {
            INFINI_CHECK(infini::checkNoAliasing(op_desc->footprints, workspace, op_desc->workspaceSize(),
                                                 {y, first_statistic, rstd, x, w, b}, 3, {{0, 3}}));
        }
        return op_desc->calculate(workspace, y, xhat, first_statistic, rstd, x, w, b, stream);
    });
}

} // namespace

__C infiniStatus_t infiniopLayerNorm(infiniopLayerNormDescriptor_t desc, void *workspace, size_t workspace_size,
                                     void *output, void *input_standardization, void *input_std_deviation,
                                     const void *input, const void *weight, const void *bias, void *stream) {
    return runForm(desc, Op::Info::Form::xhat, workspace, workspace_size, output, input_standardization,
                   input_std_deviation, nullptr, input, weight, bias, stream);
}

__C infiniStatus_t infiniopLayerNormEx(infiniopLayerNormDescriptor_t desc, void *workspace, size_t workspace_size,
                                       void *y, void *mean, void *rstd, const void *x, const void *w, const void *b,
                                       void *stream) {
    return runForm(desc, Op::Info::Form::statistics, workspace, workspace_size, y, nullptr, mean, rstd, x, w, b,
                   stream);
}

__C infiniStatus_t infiniopDestroyLayerNormDescriptor(infiniopLayerNormDescriptor_t desc) {
    return op::destroyDescriptor<Op>(desc);
}
