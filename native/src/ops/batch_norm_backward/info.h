// BatchNorm backward: the shape, dtype and stride rules (checked once, for every device) and the layout kept.
#ifndef INFINIOP_SRC_OPS_BATCH_NORM_BACKWARD_INFO_H
#define INFINIOP_SRC_OPS_BATCH_NORM_BACKWARD_INFO_H

#include "common/layout.h"
#include "common/status.h"
#include "ops/batch_norm_layout.h"

#include <cmath>

namespace op::batch_norm_backward {

using Layout = BatchNormLayout;

struct Info {
    infiniDtype_t dtype;           // grad_input, input, grad_output
    infiniDtype_t parameter_dtype; // weight, grad_weight, grad_bias, running_mean, running_var
    infiniDtype_t statistic_dtype; // save_mean, save_invstd
    size_t batch, channels, length; // (N, C, L)
    Layout layout;
    ptrdiff_t grad_weight_stride, grad_bias_stride, weight_stride, running_mean_stride, running_var_stride,
        save_mean_stride, save_invstd_stride;
    bool has_grad_weight, has_grad_bias, has_weight, has_save;
    bool training;
    double epsilon;

    size_t elements() const { return batch * channels * length; }
    // mean and invstd come from running_mean / running_var (otherwise from save_mean / save_invstd).
    bool usesRunning() const { return !(training && has_save); }

    // infiniopCreateBatchNormBackwardDescriptor: one dtype of F16/F32/BF16, rank 3, fully contiguous.
    static infiniStatus_t create(Info *info, infini::Tensor grad_input, infini::Tensor grad_weight,
                                 infini::Tensor grad_bias, infini::Tensor input, infini::Tensor grad_output,
                                 infini::Tensor weight, infini::Tensor running_mean, infini::Tensor running_var) {
        INFINI_CHECK(infini::checkSameNormFloat(
            {grad_input, grad_weight, grad_bias, input, grad_output, weight, running_mean, running_var}));
        if (grad_input->ndim() != 3) return INFINI_STATUS_BAD_TENSOR_SHAPE;
        INFINI_CHECK(createEx(info, grad_input, grad_weight, grad_bias, input, grad_output, weight, running_mean,
                              running_var, nullptr, nullptr, 0.0, 1));
        return info->layout == Layout::channels_first ? INFINI_STATUS_SUCCESS : INFINI_STATUS_BAD_TENSOR_STRIDES;
    }

    // infiniopCreateBatchNormBackwardDescriptorEx (rules in the public header), checked in the order
    // NULL / parameters, dtypes, shapes, strides.
    static infiniStatus_t createEx(Info *info, infini::Tensor grad_input, infini::Tensor grad_weight,
                                   infini::Tensor grad_bias, infini::Tensor input, infini::Tensor grad_output,
                                   infini::Tensor weight, infini::Tensor running_mean, infini::Tensor running_var,
                                   infini::Tensor save_mean, infini::Tensor save_invstd, double epsilon,
                                   int training) {
        if (grad_input == nullptr || input == nullptr || grad_output == nullptr) return INFINI_STATUS_NULL_POINTER;
        if (!std::isfinite(epsilon) || epsilon < 0.0) return INFINI_STATUS_BAD_PARAM;
        const bool has_save = save_mean != nullptr;
        if (has_save != (save_invstd != nullptr) || (training == 0 && has_save)) return INFINI_STATUS_BAD_PARAM;
        if ((training == 0 || !has_save) && (running_mean == nullptr || running_var == nullptr)) {
            return INFINI_STATUS_NULL_POINTER;
        }
        INFINI_CHECK(infini::checkNormDtypesEx({grad_input, input, grad_output},
                                               {weight, grad_weight, grad_bias, running_mean, running_var},
                                               {save_mean, save_invstd}));

        const size_t ndim = grad_input->ndim();
        if (!BatchNormShape::rankOk(grad_input)) return INFINI_STATUS_BAD_TENSOR_SHAPE;
        const size_t channels = grad_input->shape[1];
        if (!infini::sameShape(input, grad_input) || !infini::sameShape(grad_output, grad_input)) {
            return INFINI_STATUS_BAD_TENSOR_SHAPE;
        }
        for (infini::Tensor vector : {grad_weight, grad_bias, weight, running_mean, running_var, save_mean, save_invstd}) {
            if (vector != nullptr && !infini::isVector(vector, channels)) return INFINI_STATUS_BAD_TENSOR_SHAPE;
        }

        Layout layout;
        if (!BatchNormShape::sharedLayout({grad_input, input, grad_output}, &layout) ||
            (grad_weight != nullptr && !infini::nonOverlapping(grad_weight)) ||
            (grad_bias != nullptr && !infini::nonOverlapping(grad_bias))) {
            return INFINI_STATUS_BAD_TENSOR_STRIDES;
        }

        const infiniDtype_t dtype = grad_input->dtype;
        auto strideOf = [](infini::Tensor vector) { return vector != nullptr ? vector->strides[0] : 0; };
        *info = Info{dtype,
                     infini::dtypeOfFirst({weight, grad_weight, grad_bias, running_mean, running_var}, dtype),
                     infini::statisticsDtypeOf(dtype),
                     grad_input->shape[0],
                     channels,
                     infini::countOf(grad_input, 2, ndim),
                     layout,
                     strideOf(grad_weight),
                     strideOf(grad_bias),
                     strideOf(weight),
                     strideOf(running_mean),
                     strideOf(running_var),
                     strideOf(save_mean),
                     strideOf(save_invstd),
                     grad_weight != nullptr,
                     grad_bias != nullptr,
                     weight != nullptr,
                     has_save,
                     training != 0,
                     epsilon};
        return INFINI_STATUS_SUCCESS;
    }
};

} // namespace op::batch_norm_backward

#endif
