// RMSNorm backward: the shape, dtype and stride rules (checked once, for every device) and the layout kept.
#ifndef INFINIOP_SRC_OPS_RMS_NORM_BACKWARD_INFO_H
#define INFINIOP_SRC_OPS_RMS_NORM_BACKWARD_INFO_H

#include "common/layout.h"
#include "common/status.h"
#include "ops/rms_norm_layout.h"
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

        RmsNormLayout layout{};
        INFINI_CHECK(RmsNormLayout::check(&layout, {grad_x, grad_y, x}, w, grad_w, rstd, false));
        *info = Info{grad_x->dtype,
                     w->dtype,
                     layout.rows,
                     layout.dim,
                     RowLayout::of(grad_x, layout.leading),
                     RowLayout::of(grad_y, layout.leading),
                     RowLayout::of(x, layout.leading),
                     rstd != nullptr ? RowLayout::of(rstd, layout.leading) : RowLayout{},
                     layout.grad_w_stride,
                     layout.w_stride,
                     grad_w != nullptr,
                     rstd != nullptr,
                     epsilon};
        return INFINI_STATUS_SUCCESS;
    }
};

} // namespace op::rms_norm_backward

#endif
