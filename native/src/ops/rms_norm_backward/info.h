// RMSNorm backward: the shape, dtype and stride rules (checked once, for every device) and the layout kept.
#ifndef INFINIOP_SRC_OPS_RMS_NORM_BACKWARD_INFO_H
#define INFINIOP_SRC_OPS_RMS_NORM_BACKWARD_INFO_H

#include "common/layout.h"
#include "common/status.h"
#include "ops/rows.h"

namespace op::rms_norm_backward {

struct Info {
    infiniDtype_t dtype;
    size_t rows; // all leading dims flattened
    size_t dim;  // D, the normalized length
    RowLayout grad_x, grad_y, x;
    ptrdiff_t grad_w_stride, w_stride;

    static infiniStatus_t create(Info *info, infini::Tensor grad_x, infini::Tensor grad_w, infini::Tensor grad_y,
                                 infini::Tensor x, infini::Tensor w) {
        INFINI_CHECK(infini::checkSameNormFloat({grad_x, grad_w, grad_y, x, w}));

        size_t ndim = grad_x->ndim();
        if (ndim != 2 && ndim != 3) return INFINI_STATUS_BAD_TENSOR_SHAPE;
        size_t dim = grad_x->shape.back();
        if (!infini::sameShape(grad_y, grad_x) || !infini::sameShape(x, grad_x) || !infini::isVector(grad_w, dim) ||
            !infini::isVector(w, dim)) {
            return INFINI_STATUS_BAD_TENSOR_SHAPE;
        }

        if (!infini::lastDimContiguous(grad_x) || !infini::lastDimContiguous(grad_y) ||
            !infini::lastDimContiguous(x) || !infini::nonOverlapping(grad_x) || !infini::nonOverlapping(grad_w)) {
            return INFINI_STATUS_BAD_TENSOR_STRIDES;
        }

        *info = Info{grad_x->dtype,
                     infini::leadingCount(grad_x),
                     dim,
                     RowLayout::of(grad_x, ndim - 1),
                     RowLayout::of(grad_y, ndim - 1),
                     RowLayout::of(x, ndim - 1),
                     grad_w->strides[0],
                     w->strides[0]};
        return INFINI_STATUS_SUCCESS;
    }
};

} // namespace op::rms_norm_backward

#endif
