// aclTensor views of our tensors: rows of a row-normalized tensor, vectors, and the checks aclnn needs.
#ifndef INFINI_DEVICES_ASCEND_VIEWS_H
#define INFINI_DEVICES_ASCEND_VIEWS_H

#include "plan.h"

#include "ops/rows.h"

#include <initializer_list>
#include <utility>

namespace ascend {

// (outer, inner, dim) view of rows laid out as `layout`, last dim contiguous.
inline TensorSpec rowsView(const op::RowLayout &rows_layout, size_t rows, size_t dim, aclDataType dtype,
                           Buffer buffer) {
    const op::RowLayout::TwoLevel layout = rows_layout.twoLevel();
    int64_t inner = static_cast<int64_t>(layout.inner);
    int64_t outer = inner == 0 ? 0 : static_cast<int64_t>(rows) / inner;
    int64_t length = static_cast<int64_t>(dim);
    // A dim of extent <= 1 is never stepped: give it its packed stride so contiguity checks see through it.
    int64_t inner_stride = inner <= 1 ? length : layout.inner_stride;
    int64_t outer_stride = outer <= 1 ? inner * length : layout.outer_stride;
    return TensorSpec{{outer, inner, length}, {outer_stride, inner_stride, 1}, dtype, buffer};
}

// (outer, inner, 1) view of one element per row (LayerNorm's std), broadcast along the row by aclnn.
inline TensorSpec perRowView(const op::RowLayout &layout, size_t rows, aclDataType dtype, Buffer buffer) {
    TensorSpec spec = rowsView(layout, rows, 1, dtype, buffer);
    return spec;
}

inline TensorSpec vectorView(size_t length, ptrdiff_t stride, aclDataType dtype, Buffer buffer) {
    return TensorSpec{{static_cast<int64_t>(length)}, {length <= 1 ? 1 : stride}, dtype, buffer};
}

// aclCreateTensor takes non-negative strides only.
inline bool nonNegative(const op::RowLayout &rows_layout, size_t rows) {
    const op::RowLayout::TwoLevel layout = rows_layout.twoLevel();
    size_t outer = layout.inner == 0 ? 0 : rows / layout.inner;
    return (outer <= 1 || layout.outer_stride >= 0) && (layout.inner <= 1 || layout.inner_stride >= 0);
}

// Row r starts at r * dim: the packed layout operators without strided-input support need.
inline bool packedRows(const op::RowLayout &rows_layout, size_t rows, size_t dim) {
    const op::RowLayout::TwoLevel layout = rows_layout.twoLevel();
    size_t outer = layout.inner == 0 ? 0 : rows / layout.inner;
    bool inner_ok = layout.inner <= 1 || layout.inner_stride == static_cast<ptrdiff_t>(dim);
    bool outer_ok = outer <= 1 || layout.outer_stride == static_cast<ptrdiff_t>(layout.inner * dim);
    return inner_ok && outer_ok;
}

inline bool unitStride(size_t length, ptrdiff_t stride) { return length <= 1 || stride == 1; }

// Vectors of `length` elements that are empty sums (no samples to reduce): zeroed at each run, which needs
// every one packed; BAD_TENSOR_STRIDES otherwise. Each entry is (argument index, stride).
inline infiniStatus_t addZeroedVectors(Plan &plan, size_t length, size_t element_bytes,
                                       std::initializer_list<std::pair<size_t, ptrdiff_t>> vectors) {
    for (auto [index, stride] : vectors) {
        if (!unitStride(length, stride)) return INFINI_STATUS_BAD_TENSOR_STRIDES;
    }
    for (auto [index, stride] : vectors) plan.addZeroFill(index, length * element_bytes);
    return INFINI_STATUS_SUCCESS;
}

} // namespace ascend

#endif
