// RMSNorm backward: the shape, dtype and stride rules (checked once, for every device) and the layout kept.
#ifndef INFINIOP_SRC_OPS_RMS_NORM_BACKWARD_INFO_H
#define INFINIOP_SRC_OPS_RMS_NORM_BACKWARD_INFO_H

#include "common/layout.h"
#include "common/status.h"
#include "ops/rows.h"

#include <cmath>

namespace op::rms_norm_backward {

struct Info {
    infiniDtype_t dtype;        // grad_x, grad_y, x
    infiniDtype_t weight_dtype; // w, grad_w
    size_t rows;                // all leading dims flattened
    size_t dim;                 // D, the normalized length (all normalized dims flattened)
    RowLayout grad_x, grad_y, x;
    RowLayout rstd; // one element per row, when has_rstd
    ptrdiff_t grad_w_stride, w_stride;
    bool has_grad_w, has_rstd;
    double epsilon;

    // infiniopCreateRMSNormBackwardDescriptor: one dtype of F16/F32/BF16, rank 2 or 3, no epsilon.
    static infiniStatus_t create(Info *info, infini::Tensor grad_x, infini::Tensor grad_w, infini::Tensor grad_y,
                                 infini::Tensor x, infini::Tensor w) {
        INFINI_CHECK(infini::checkSameNormFloat({grad_x, grad_w, grad_y, x, w}));
        size_t ndim = grad_x->ndim();
        if ((ndim != 2 && ndim != 3) || w->ndim() != 1 || grad_w->ndim() != 1) return INFINI_STATUS_BAD_TENSOR_SHAPE;
        return createEx(info, grad_x, grad_w, grad_y, x, w, nullptr, 0.0);
    }

    // infiniopCreateRMSNormBackwardDescriptorEx: grad_w and rstd may be NULL (see the public header).
    static infiniStatus_t createEx(Info *info, infini::Tensor grad_x, infini::Tensor grad_w, infini::Tensor grad_y,
                                   infini::Tensor x, infini::Tensor w, infini::Tensor rstd, double epsilon) {
        if (grad_x == nullptr || grad_y == nullptr || x == nullptr || w == nullptr) return INFINI_STATUS_NULL_POINTER;
        if (!std::isfinite(epsilon) || epsilon < 0.0) return INFINI_STATUS_BAD_PARAM;
        INFINI_CHECK(infini::checkNormDtypesEx({grad_x, grad_y, x}, {w, grad_w}, {rstd}));

        const size_t ndim = grad_x->ndim(), normalized = w->ndim();
        if (ndim < 1 || ndim > 8 || normalized < 1 || normalized > ndim) return INFINI_STATUS_BAD_TENSOR_SHAPE;
        const size_t leading = ndim - normalized;
        const std::vector<size_t> leading_shape(grad_x->shape.begin(), grad_x->shape.begin() + leading);
        const std::vector<size_t> normalized_shape(grad_x->shape.begin() + leading, grad_x->shape.end());
        if (!infini::sameShape(grad_y, grad_x) || !infini::sameShape(x, grad_x) || w->shape != normalized_shape ||
            (grad_w != nullptr && grad_w->shape != normalized_shape) ||
            (rstd != nullptr && rstd->shape != leading_shape)) {
            return INFINI_STATUS_BAD_TENSOR_SHAPE;
        }

        ptrdiff_t w_stride = 0, grad_w_stride = 0;
        if (!infini::trailingPacked(grad_x, normalized) || !infini::trailingPacked(grad_y, normalized) ||
            !infini::trailingPacked(x, normalized) || !infini::nonOverlapping(grad_x) ||
            !infini::collapsesToVector(w, &w_stride) ||
            (grad_w != nullptr &&
             (!infini::nonOverlapping(grad_w) || !infini::collapsesToVector(grad_w, &grad_w_stride)))) {
            return INFINI_STATUS_BAD_TENSOR_STRIDES;
        }

        *info = Info{grad_x->dtype,
                     w->dtype,
                     infini::countOf(grad_x, 0, leading),
                     infini::countOf(grad_x, leading, ndim),
                     RowLayout::of(grad_x, leading),
                     RowLayout::of(grad_y, leading),
                     RowLayout::of(x, leading),
                     rstd != nullptr ? RowLayout::of(rstd, leading) : RowLayout{},
                     grad_w_stride,
                     w_stride,
                     grad_w != nullptr,
                     rstd != nullptr,
                     epsilon};
        return INFINI_STATUS_SUCCESS;
    }
};

} // namespace op::rms_norm_backward

#endif
