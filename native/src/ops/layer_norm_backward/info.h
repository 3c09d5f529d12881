// LayerNorm backward: the shape, dtype and stride rules (checked once, for every device) and the layout kept.
#ifndef INFINIOP_SRC_OPS_LAYER_NORM_BACKWARD_INFO_H
#define INFINIOP_SRC_OPS_LAYER_NORM_BACKWARD_INFO_H

#include "common/layout.h"
#include "common/status.h"
#include "ops/rows.h"

namespace op::layer_norm_backward {

struct Info {
    infiniDtype_t dtype;
    size_t rows; // all leading dims flattened
    size_t dim;  // L, the normalized length
    RowLayout grad_input, grad_output, input_standardization;
    RowLayout input_std_deviation; // one element per row
    ptrdiff_t grad_weight_stride, grad_bias_stride, weight_stride;

    static infiniStatus_t create(Info *info, infini::Tensor grad_input, infini::Tensor grad_weight,
                                 infini::Tensor grad_bias, infini::Tensor grad_output, infini::Tensor weight,
                                 infini::Tensor input_standardization, infini::Tensor input_std_deviation) {
        INFINI_CHECK(infini::checkSameNormFloat(
            {grad_input, grad_weight, grad_bias, grad_output, weight, input_standardization, input_std_deviation}));

        size_t ndim = grad_input->ndim();
        if (ndim != 2 && ndim != 3) return INFINI_STATUS_BAD_TENSOR_SHAPE;
        size_t dim = grad_input->shape.back();
        std::vector<size_t> leading_shape(grad_input->shape.begin(), grad_input->shape.end() - 1);
        if (!infini::sameShape(grad_output, grad_input) || !infini::sameShape(input_standardization, grad_input) ||
            input_std_deviation->shape != leading_shape || !infini::isVector(grad_weight, dim) ||
            !infini::isVector(grad_bias, dim) || !infini::isVector(weight, dim)) {
            return INFINI_STATUS_BAD_TENSOR_SHAPE;
        }

        if (!infini::lastDimContiguous(grad_input) || !infini::lastDimContiguous(grad_output) ||
            !infini::lastDimContiguous(input_standardization) || !infini::nonOverlapping(grad_input) ||
            !infini::nonOverlapping(grad_weight) || !infini::nonOverlapping(grad_bias)) {
            return INFINI_STATUS_BAD_TENSOR_STRIDES;
        }

        *info = Info{grad_input->dtype,
                     infini::leadingCount(grad_input),
                     dim,
                     RowLayout::of(grad_input, ndim - 1),
                     RowLayout::of(grad_output, ndim - 1),
                     RowLayout::of(input_standardization, ndim - 1),
                     RowLayout::of(input_std_deviation, ndim - 1),
                     grad_weight->strides[0],
                     grad_bias->strides[0],
                     weight->strides[0]};
        return INFINI_STATUS_SUCCESS;
    }
};

} // namespace op::layer_norm_backward

#endif
