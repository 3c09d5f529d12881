// RMSNorm forward: the shape, dtype and stride rules (checked once, for every device) and the layout kept.
#ifndef INFINIOP_SRC_OPS_RMS_NORM_INFO_H
#define INFINIOP_SRC_OPS_RMS_NORM_INFO_H

#include "common/layout.h"
#include "common/status.h"
#include "ops/rms_norm_layout.h"
#include "ops/rows.h"

#include <cmath>

namespace op::rms_norm {

struct Info {
    infiniDtype_t dtype;        // y, x
    infiniDtype_t weight_dtype; // w
    size_t rows;                // all leading dims flattened
    size_t dim;                 // D, the normalized length (all normalized dims flattened)
    RowLayout y, x;
    RowLayout rstd; // one element per row, when has_rstd
    ptrdiff_t w_stride;
    bool has_rstd;
    double epsilon;

    // infiniopCreateRMSNormDescriptor: upstream's ranks (2 or 3, w a vector), no rstd; the Ex dtype rules.
    static infiniStatus_t create(Info *info, infini::Tensor y, infini::Tensor x, infini::Tensor w, float epsilon) {
        if (y == nullptr || x == nullptr || w == nullptr) return INFINI_STATUS_NULL_POINTER;
        INFINI_CHECK(infini::checkNormDtypesEx({y, x}, {w}, {}));
        if ((y->ndim() != 2 && y->ndim() != 3) || w->ndim() != 1) return INFINI_STATUS_BAD_TENSOR_SHAPE;
        return createEx(info, y, nullptr, x, w, epsilon);
    }

    // infiniopCreateRMSNormDescriptorEx: rstd may be NULL (see the public header).
    static infiniStatus_t createEx(Info *info, infini::Tensor y, infini::Tensor rstd, infini::Tensor x,
                                   infini::Tensor w, double epsilon) {
        if (y == nullptr || x == nullptr || w == nullptr) return INFINI_STATUS_NULL_POINTER;
        if (!std::isfinite(epsilon) || epsilon < 0.0) return INFINI_STATUS_BAD_PARAM;
        INFINI_CHECK(infini::checkNormDtypesEx({y, x}, {w}, {rstd}));
        RmsNormLayout layout{};
        INFINI_CHECK(RmsNormLayout::check(&layout, {y, x}, w, nullptr, rstd, true));
        *info = Info{y->dtype,
                     w->dtype,
                     layout.rows,
                     layout.dim,
                     RowLayout::of(y, layout.leading),
                     RowLayout::of(x, layout.leading),
                     rstd != nullptr ? RowLayout::of(rstd, layout.leading) : RowLayout{},
                     layout.w_stride,
                     rstd != nullptr,
                     epsilon};
        return INFINI_STATUS_SUCCESS;
    }
};

} // namespace op::rms_norm

#endif
