// The shape and stride rules RMSNorm's forward and backward Ex creates share, written once: row tensors of any
// rank 1..8 normalized over w's k trailing dims (packed), w of the normalized shape, an optional weight gradient
// of w's shape and an optional one-per-row rstd of the leading shape.
#ifndef INFINIOP_SRC_OPS_RMS_NORM_LAYOUT_H
#define INFINIOP_SRC_OPS_RMS_NORM_LAYOUT_H

#include "common/layout.h"
#include "common/status.h"

#include <initializer_list>
#include <vector>

namespace op {

struct RmsNormLayout {
    size_t leading = 0; // dims of x before the normalized ones
    size_t rows = 0;    // their product
    size_t dim = 0;     // D, the product of the normalized dims
    ptrdiff_t w_stride = 0, grad_w_stride = 0;

    // rows: the row tensors, non-NULL, the first one written (y, grad_x), the others read; w: non-NULL, its rank
    // k names the normalized dims; grad_w: NULL or written; rstd: NULL, or written where rstd_written, else read.
    // BAD_TENSOR_SHAPE, then BAD_TENSOR_STRIDES, whichever tensor breaks them.
    static infiniStatus_t check(RmsNormLayout *layout, std::initializer_list<infini::Tensor> rows, infini::Tensor w,
                                infini::Tensor grad_w, infini::Tensor rstd, bool rstd_written) {
        const infini::Tensor output = *rows.begin();
        const size_t ndim = output->ndim(), normalized = w->ndim();
        if (ndim < 1 || ndim > 8 || normalized < 1 || normalized > ndim) return INFINI_STATUS_BAD_TENSOR_SHAPE;
        const size_t leading = ndim - normalized;
        const std::vector<size_t> leading_shape(output->shape.begin(), output->shape.begin() + leading);
        const std::vector<size_t> normalized_shape(output->shape.begin() + leading, output->shape.end());
        for (infini::Tensor t : rows) {
            if (!infini::sameShape(t, output)) return INFINI_STATUS_BAD_TENSOR_SHAPE;
        }
        if (w->shape != normalized_shape || (grad_w != nullptr && grad_w->shape != normalized_shape) ||
            (rstd != nullptr && rstd->shape != leading_shape)) {
            return INFINI_STATUS_BAD_TENSOR_SHAPE;
        }

        for (infini::Tensor t : rows) {
            if (!infini::trailingPacked(t, normalized)) return INFINI_STATUS_BAD_TENSOR_STRIDES;
        }
        ptrdiff_t w_stride = 0, grad_w_stride = 0;
        if (!infini::nonOverlapping(output) || !infini::collapsesToVector(w, &w_stride) ||
            (grad_w != nullptr &&
             (!infini::nonOverlapping(grad_w) || !infini::collapsesToVector(grad_w, &grad_w_stride))) ||
            (rstd != nullptr && rstd_written && !infini::nonOverlapping(rstd))) {
            return INFINI_STATUS_BAD_TENSOR_STRIDES;
        }
        *layout = RmsNormLayout{leading, infini::countOf(output, 0, leading), infini::countOf(output, leading, ndim),
                                w_stride, grad_w_stride};
        return INFINI_STATUS_SUCCESS;
    }
};

} // namespace op

#endif
