// BatchNorm backward: the shape, dtype and stride rules (checked once, for every device) and the layout kept.
#ifndef INFINIOP_SRC_OPS_BATCH_NORM_BACKWARD_INFO_H
#define INFINIOP_SRC_OPS_BATCH_NORM_BACKWARD_INFO_H

#include "common/layout.h"
#include "common/status.h"

namespace op::batch_norm_backward {

struct Info {
    infiniDtype_t dtype;
    size_t batch, channels, length; // (N, C, L), fully contiguous
    ptrdiff_t grad_weight_stride, grad_bias_stride, weight_stride, running_mean_stride, running_var_stride;

    static infiniStatus_t create(Info *info, infini::Tensor grad_input, infini::Tensor grad_weight,
                                 infini::Tensor grad_bias, infini::Tensor input, infini::Tensor grad_output,
                                 infini::Tensor weight, infini::Tensor running_mean, infini::Tensor running_var) {
        INFINI_CHECK(infini::checkSameNormFloat(
            {grad_input, grad_weight, grad_bias, input, grad_output, weight, running_mean, running_var}));

        if (grad_input->ndim() != 3) return INFINI_STATUS_BAD_TENSOR_SHAPE;
        size_t channels = grad_input->shape[1];
        if (!infini::sameShape(input, grad_input) || !infini::sameShape(grad_output, grad_input) ||
            !infini::isVector(grad_weight, channels) || !infini::isVector(grad_bias, channels) ||
            !infini::isVector(weight, channels) || !infini::isVector(running_mean, channels) ||
            !infini::isVector(running_var, channels)) {
            return INFINI_STATUS_BAD_TENSOR_SHAPE;
        }

        if (!infini::fullyContiguous(grad_input) || !infini::fullyContiguous(input) ||
            !infini::fullyContiguous(grad_output) || !infini::nonOverlapping(grad_weight) ||
            !infini::nonOverlapping(grad_bias)) {
            return INFINI_STATUS_BAD_TENSOR_STRIDES;
        }

        *info = Info{grad_input->dtype,     grad_input->shape[0],   channels,
                     grad_input->shape[2],  grad_weight->strides[0], grad_bias->strides[0],
                     weight->strides[0],    running_mean->strides[0], running_var->strides[0]};
        return INFINI_STATUS_SUCCESS;
    }

    size_t elements() const { return batch * channels * length; }
};

} // namespace op::batch_norm_backward

#endif
