// Row views used by the row-normalizing ops (RMSNorm, LayerNorm): a tensor's leading dims flattened to rows.
#ifndef INFINIOP_OPS_ROWS_H
#define INFINIOP_OPS_ROWS_H

#include "common/host_device.h"
#include "common/tensor.h"

#include <cstddef>
#include <initializer_list>

namespace op {

// Offsets of rows laid out as up to 7 leading dims with arbitrary strides. Dims of size 1 are dropped and
// neighbours that step as one dim are merged, so the usual layouts have depth 1 or 2. Trivially copyable:
// the CUDA kernels take it by value and call offset() on the device.
struct RowLayout {
    static constexpr size_t kMaxDepth = 7;
    size_t depth = 0;                   // dims kept, outermost first
    size_t sizes[kMaxDepth] = {};
    ptrdiff_t strides[kMaxDepth] = {};

    // The layout of the first `leading` (at most kMaxDepth) dims of t.
    static RowLayout of(const InfiniopTensorDescriptor *t, size_t leading) {
        RowLayout layout;
        for (size_t i = 0; i < leading; ++i) {
            if (t->shape[i] == 1) continue;
            size_t last = layout.depth - 1;
            if (layout.depth > 0 &&
                layout.strides[last] == t->strides[i] * static_cast<ptrdiff_t>(t->shape[i])) {
                layout.sizes[last] *= t->shape[i];
                layout.strides[last] = t->strides[i];
            } else {
                layout.sizes[layout.depth] = t->shape[i];
                layout.strides[layout.depth] = t->strides[i];
                ++layout.depth;
            }
        }
        return layout;
    }

    // Offset of row `row` (< the product of sizes): inner dims by division, the outermost by its stride alone.
    // Unrolled over constant indices so that CUDA kernels read the fields where they are, with no local copy.
    INFINI_HOST_DEVICE ptrdiff_t offset(size_t row) const {
        ptrdiff_t result = 0;
#ifdef __CUDA_ARCH__
#pragma unroll
#endif
        for (size_t i = kMaxDepth - 1; i > 0; --i) {
            if (i >= depth) continue;
            result += static_cast<ptrdiff_t>(row % sizes[i]) * strides[i];
            row /= sizes[i];
        }
        return result + static_cast<ptrdiff_t>(row) * strides[0]; // depth 0: row == 0, strides[0] == 0
    }

    // Whether row r lies at r * stride(): the rows are one stride apart.
    bool uniform() const { return depth <= 1; }
    ptrdiff_t stride() const { return depth == 0 ? 0 : strides[0]; }

    // The stride between neighbouring rows of the innermost dim, and how many rows from `row` on (at most `most`)
    // lie that far apart before the next dim steps: every row on where uniform.
    ptrdiff_t innerStride() const { return depth == 0 ? 0 : strides[depth - 1]; }
    size_t rowsInStride(size_t row, size_t most) const {
        if (uniform()) return most;
        const size_t left = sizes[depth - 1] - row % sizes[depth - 1];
        return left < most ? left : most;
    }

    // f(i, offset(row + i)) for i in [0, count): one stride apart where uniform, with no division per row (a row
    // block's statistics: dividing each row's index took a tenth of LayerNorm's time on CPU rows of 16).
    template <typename F>
    void forRows(size_t row, size_t count, F &&f) const {
        if (!uniform()) {
            for (size_t i = 0; i < count; ++i) f(i, offset(row + i));
            return;
        }
        const ptrdiff_t first = offset(row), step = stride();
        for (size_t i = 0; i < count; ++i) f(i, first + static_cast<ptrdiff_t>(i) * step);
    }

    // As (outer, inner) dims: row -> (row / inner) * outer_stride + (row % inner) * inner_stride.
    // Only for depth <= 2 (what the Ascend backend takes).
    struct TwoLevel {
        size_t inner;
        ptrdiff_t outer_stride, inner_stride;
    };
    TwoLevel twoLevel() const {
        if (depth == 0) return {1, 0, 0};
        if (depth == 1) return {sizes[0], 0, strides[0]};
        return {sizes[1], strides[0], strides[1]};
    }
};

// Whether every row of these layouts starts a whole number of `elements` from the first.
inline bool stridesMultipleOf(ptrdiff_t elements, std::initializer_list<RowLayout> layouts) {
    for (const RowLayout &layout : layouts) {
        for (size_t i = 0; i < layout.depth; ++i) {
            if (layout.strides[i] % elements != 0) return false;
        }
    }
    return true;
}

// Whether every row of these layouts starts a 16-byte vector apart from the first, for elements of `size` bytes.
inline bool vectorStrides(size_t element_size, std::initializer_list<RowLayout> layouts) {
    return stridesMultipleOf(static_cast<ptrdiff_t>(16 / element_size), layouts);
}

// Whether each of these layouts has its rows one stride apart (uniform()): the packed CUDA kernels' offsets.
inline bool flatRows(std::initializer_list<RowLayout> layouts) {
    for (const RowLayout &layout : layouts) {
        if (!layout.uniform()) return false;
    }
    return true;
}

// A row's offset where its layout has at most one dim (uniform(): the packed CUDA kernels' condition): no division,
// which the general offset() does per kept dim (its 64-bit divisions cost a CUDA kernel 20 bytes of spills).
INFINI_HOST_DEVICE inline ptrdiff_t flatOffset(const RowLayout &rows, size_t row) {
    return static_cast<ptrdiff_t>(row) * rows.strides[0];
}

} // namespace op

#endif
