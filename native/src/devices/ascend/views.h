// aclTensor views of our tensors: rows of a row-normalized tensor, vectors, and the checks aclnn needs.
#ifndef INFINI_DEVICES_ASCEND_VIEWS_H
#define INFINI_DEVICES_ASCEND_VIEWS_H

#include "plan.h"

#include "ops/rows.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <memory>
#include <utility>
#include <vector>

namespace ascend {

// The leading dims several layouts of the same rows can all be viewed with: split wherever any of them splits
// (outermost first). Their splits nest, as they all merge the dims of one leading shape.
inline std::vector<int64_t> commonRowDims(size_t rows, const std::vector<const op::RowLayout *> &layouts) {
    std::vector<size_t> bounds{rows}; // rows per step of each dim, innermost dims' first
    for (const op::RowLayout *layout : layouts) {
        size_t inner = 1;
        for (size_t i = layout->depth; i-- > 1;) bounds.push_back(inner *= layout->sizes[i]);
    }
    std::sort(bounds.begin(), bounds.end());
    bounds.erase(std::unique(bounds.begin(), bounds.end()), bounds.end());
    std::vector<int64_t> dims;
    size_t inner = 1;
    for (size_t bound : bounds) {
        if (bound > inner) dims.insert(dims.begin(), static_cast<int64_t>(bound / inner));
        inner = bound;
    }
    return dims;
}

// (dims..., dim) view of rows laid out as `layout` (which splits no finer than `dims`), last dim contiguous;
// size-1 dims in front up to two leading dims (rank 3 to 8).
inline TensorSpec rowsView(const op::RowLayout &layout, const std::vector<int64_t> &dims, size_t dim,
                           aclDataType dtype, Buffer buffer) {
    const size_t leading = dims.size() < 2 ? 2 : dims.size();
    std::vector<int64_t> shape(leading + 1, 1), strides(leading + 1, 1);
    std::copy(dims.begin(), dims.end(), shape.begin() + static_cast<ptrdiff_t>(leading - dims.size()));
    shape[leading] = static_cast<int64_t>(dim);
    int64_t packed = static_cast<int64_t>(dim); // elements spanned by the dims inside this one, if packed
    size_t kept = layout.depth;                 // the layout's dim being walked, innermost first
    int64_t within = 1;                         // extent of it covered by the dims already placed
    for (size_t i = leading; i-- > 0;) {
        if (shape[i] <= 1) {
            strides[i] = packed; // never stepped: the packed stride lets contiguity checks see through it
        } else {
            if (within == 1) --kept;
            strides[i] = layout.strides[kept] * within;
            within *= shape[i];
            if (within == static_cast<int64_t>(layout.sizes[kept])) within = 1;
        }
        packed *= shape[i];
    }
    return TensorSpec{std::move(shape), std::move(strides), dtype, buffer};
}

inline TensorSpec vectorView(size_t length, ptrdiff_t stride, aclDataType dtype, Buffer buffer) {
    return TensorSpec{{static_cast<int64_t>(length)}, {length <= 1 ? 1 : stride}, dtype, buffer};
}

// aclCreateTensor takes non-negative strides only.
inline bool nonNegative(const op::RowLayout &layout) {
    for (size_t i = 0; i < layout.depth; ++i) {
        if (layout.sizes[i] > 1 && layout.strides[i] < 0) return false;
    }
    return true;
}

// Row r starts at r * dim: the packed layout operators without strided-input support need.
inline bool packedRows(const op::RowLayout &rows_layout, size_t rows, size_t dim) {
    if (rows_layout.depth > 2) return rows == 0; // packed rows merge into one dim
    const op::RowLayout::TwoLevel layout = rows_layout.twoLevel();
    size_t outer = layout.inner == 0 ? 0 : rows / layout.inner;
    bool inner_ok = layout.inner <= 1 || layout.inner_stride == static_cast<ptrdiff_t>(dim);
    bool outer_ok = outer <= 1 || layout.outer_stride == static_cast<ptrdiff_t>(layout.inner * dim);
    return inner_ok && outer_ok;
}

inline bool unitStride(size_t length, ptrdiff_t stride) { return length <= 1 || stride == 1; }

// An output a plan with nothing to compute sets at each run (aclnn refuses empty tensors): the sums of no samples
// (0), the statistics of rows or channels of no elements (NaN; BatchNorm's saved invstd 1/sqrt(eps)).
struct ConstantOutput {
    size_t index;      // in the run's pointers
    size_t count;      // elements; 0: nothing to set (not wanted, or empty)
    bool packed;       // a fill needs its elements contiguous
    aclDataType dtype;
    float value;
};

// The gradient vector at `index`, when wanted, as a sum of no samples.
inline ConstantOutput emptySum(size_t index, bool wanted, size_t length, ptrdiff_t stride, infiniDtype_t dtype) {
    return {index, wanted ? length : 0, unitStride(length, stride), aclDtypeOf(dtype), 0.0f};
}

// The per-row statistic at `index`, when wanted, of rows with no elements: NaN (0/0).
inline ConstantOutput emptyStatistic(size_t index, bool wanted, const op::RowLayout &layout, size_t rows,
                                     aclDataType dtype) {
    return {index, wanted ? rows : 0, !wanted || packedRows(layout, rows, 1), dtype, NAN};
}

// An op descriptor's plan on `device`, built: `plan_calls(plan)` when there is something to compute, otherwise a fill
// of each constant output, which needs every one packed (BAD_TENSOR_STRIDES otherwise).
template <typename PlanCalls>
infiniStatus_t makePlan(const Api *acl, int device, bool computes, std::initializer_list<ConstantOutput> constants,
                        PlanCalls &&plan_calls, std::unique_ptr<Plan> *out) {
    auto plan = std::make_unique<Plan>(acl, device);
    if (computes) {
        plan_calls(*plan);
    } else {
        for (const ConstantOutput &c : constants) {
            if (c.count > 0 && !c.packed) return INFINI_STATUS_BAD_TENSOR_STRIDES;
        }
        for (const ConstantOutput &c : constants) {
            if (c.count > 0) plan->addFill(c.index, c.dtype, c.count, c.value);
        }
    }
    INFINI_CHECK(plan->build());
    *out = std::move(plan);
    return INFINI_STATUS_SUCCESS;
}

// CANN's norm kernels take FLOAT, FLOAT16 and BFLOAT16 ("DOUBLE: 指令不支持DOUBLE"); F64 descriptors get
// NOT_IMPLEMENTED on Ascend.
inline bool cannHasDtype(infiniDtype_t dtype) {
    return dtype == INFINI_DTYPE_F16 || dtype == INFINI_DTYPE_F32 || dtype == INFINI_DTYPE_BF16;
}

// What every Ascend create checks first, in this order: a data dtype CANN's norm kernels take (F64:
// NOT_IMPLEMENTED), CANN itself (loaded into *acl), and strides its views can take (BAD_TENSOR_STRIDES otherwise:
// aclCreateTensor takes non-negative ones only, some operators packed ones only).
inline infiniStatus_t loadFor(infiniDtype_t dtype, bool strides_taken, const Api **acl) {
    if (!cannHasDtype(dtype)) return INFINI_STATUS_NOT_IMPLEMENTED;
    INFINI_CHECK(api(acl));
    return strides_taken ? INFINI_STATUS_SUCCESS : INFINI_STATUS_BAD_TENSOR_STRIDES;
}

} // namespace ascend

#endif
