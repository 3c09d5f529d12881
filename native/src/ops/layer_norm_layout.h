// The shape and stride rules LayerNorm's forward and backward creates share, written once: row tensors of rank
// 1..8 whose dims after the first `leading` are normalized (packed), vectors of the normalized shape, per-row
// tensors of the leading shape. Each rule holds for whichever tensors are present (NULL: absent).
#ifndef INFINIOP_SRC_OPS_LAYER_NORM_LAYOUT_H
#define INFINIOP_SRC_OPS_LAYER_NORM_LAYOUT_H

#include "common/layout.h"
#include "common/status.h"

#include <initializer_list>
#include <vector>

namespace op {

struct LayerNormLayout {
    // A tensor of the call and whether the op writes it (an output must not overlap itself).
    struct Role {
        infini::Tensor tensor;
        bool written;
    };

    size_t rows = 0; // the leading dims' product
    size_t dim = 0;  // L, the normalized dims' product

    // rows: the first is present and gives the shape. vectors: the strides they step by go to vector_strides, in
    // order (0 for an absent one). BAD_TENSOR_SHAPE, then BAD_TENSOR_STRIDES, whichever tensor breaks them.
    static infiniStatus_t check(LayerNormLayout *layout, size_t leading, std::initializer_list<Role> rows,
                                std::initializer_list<Role> vectors, std::initializer_list<Role> per_row,
                                ptrdiff_t *vector_strides) {
        const infini::Tensor first = rows.begin()->tensor;
        const size_t ndim = first->ndim();
        if (ndim < 1 || ndim > 8 || leading >= ndim) return INFINI_STATUS_BAD_TENSOR_SHAPE;
        const std::vector<size_t> leading_shape(first->shape.begin(), first->shape.begin() + leading);
        const std::vector<size_t> normalized_shape(first->shape.begin() + leading, first->shape.end());
        for (const Role &r : rows) {
            if (r.tensor != nullptr && !infini::sameShape(r.tensor, first)) return INFINI_STATUS_BAD_TENSOR_SHAPE;
        }
        for (const Role &r : vectors) {
            if (r.tensor != nullptr && r.tensor->shape != normalized_shape) return INFINI_STATUS_BAD_TENSOR_SHAPE;
        }
        for (const Role &r : per_row) {
            if (r.tensor != nullptr && r.tensor->shape != leading_shape) return INFINI_STATUS_BAD_TENSOR_SHAPE;
        }

        const size_t normalized = ndim - leading;
        auto ownAddresses = [](const Role &r) { return !r.written || infini::nonOverlapping(r.tensor); };
        for (const Role &r : rows) {
            if (r.tensor != nullptr && (!infini::trailingPacked(r.tensor, normalized) || !ownAddresses(r))) {
                return INFINI_STATUS_BAD_TENSOR_STRIDES;
            }
        }
        size_t i = 0;
        for (const Role &r : vectors) {
            ptrdiff_t &stride = vector_strides[i++];
            stride = 0;
            if (r.tensor != nullptr && (!ownAddresses(r) || !infini::collapsesToVector(r.tensor, &stride))) {
                return INFINI_STATUS_BAD_TENSOR_STRIDES;
            }
        }
        for (const Role &r : per_row) {
            if (r.tensor != nullptr && !ownAddresses(r)) return INFINI_STATUS_BAD_TENSOR_STRIDES;
        }
        *layout = LayerNormLayout{infini::countOf(first, 0, leading), infini::countOf(first, leading, ndim)};
        return INFINI_STATUS_SUCCESS;
    }
};

} // namespace op

#endif
