// Row views used by the row-normalizing ops (RMSNorm, LayerNorm): a tensor's leading dims flattened to rows.
#ifndef INFINIOP_OPS_ROWS_H
#define INFINIOP_OPS_ROWS_H

#include "common/tensor.h"

#include <cstddef>

namespace op {

// Offsets of rows laid out as (outer, inner) leading dims with arbitrary strides (2-D tensors: outer == 1).
struct RowLayout {
    size_t inner = 1;
    ptrdiff_t outer_stride = 0;
    ptrdiff_t inner_stride = 0;

    // The layout of the first `leading` (1 or 2) dims of t.
    static RowLayout of(const InfiniopTensorDescriptor *t, size_t leading) {
        RowLayout layout;
        if (leading == 2) {
            layout.outer_stride = t->strides[0];
            layout.inner = t->shape[1];
            layout.inner_stride = t->strides[1];
        } else {
            layout.inner = t->shape[0];
            layout.inner_stride = t->strides[0];
        }
        return layout;
    }

    ptrdiff_t offset(size_t row) const {
        return static_cast<ptrdiff_t>(row / inner) * outer_stride + static_cast<ptrdiff_t>(row % inner) * inner_stride;
    }
};

} // namespace op

#endif
