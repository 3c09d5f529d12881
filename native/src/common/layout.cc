#include "layout.h"

#include <algorithm>
#include <cstdlib>
#include <utility>

namespace infini {

size_t dtypeSize(infiniDtype_t dtype) {
    switch (dtype) {
    case INFINI_DTYPE_BYTE:
    case INFINI_DTYPE_BOOL:
    case INFINI_DTYPE_I8:
    case INFINI_DTYPE_U8:
    case INFINI_DTYPE_F8: return 1;
    case INFINI_DTYPE_I16:
    case INFINI_DTYPE_U16:
    case INFINI_DTYPE_F16:
    case INFINI_DTYPE_BF16:
    case INFINI_DTYPE_C16: return 2;
    case INFINI_DTYPE_I32:
    case INFINI_DTYPE_U32:
    case INFINI_DTYPE_F32:
    case INFINI_DTYPE_C32: return 4;
    case INFINI_DTYPE_I64:
    case INFINI_DTYPE_U64:
    case INFINI_DTYPE_F64:
    case INFINI_DTYPE_C64: return 8;
    case INFINI_DTYPE_C128: return 16;
    default: return 0;
    }
}

infiniStatus_t checkSameNormFloat(std::initializer_list<Tensor> tensors) {
    infiniDtype_t dtype = (*tensors.begin())->dtype;
    for (Tensor t : tensors) {
        if (t != nullptr && t->dtype != dtype) return INFINI_STATUS_BAD_TENSOR_DTYPE;
    }
    return isNormFloat(dtype) ? INFINI_STATUS_SUCCESS : INFINI_STATUS_BAD_TENSOR_DTYPE;
}

infiniStatus_t checkNormDtypesEx(std::initializer_list<Tensor> activations, std::initializer_list<Tensor> parameters,
                                 std::initializer_list<Tensor> statistics) {
    infiniDtype_t dtype = (*activations.begin())->dtype;
    if (!isNormFloat(dtype) && dtype != INFINI_DTYPE_F64) return INFINI_STATUS_BAD_TENSOR_DTYPE;
    for (Tensor t : activations) { // the first is present; an optional output (LayerNorm's xhat) may be absent
        if (t != nullptr && t->dtype != dtype) return INFINI_STATUS_BAD_TENSOR_DTYPE;
    }
    const bool half = dtype == INFINI_DTYPE_F16 || dtype == INFINI_DTYPE_BF16;
    const infiniDtype_t parameter_dtype = dtypeOfFirst(parameters, dtype);
    if (parameter_dtype != dtype && !(half && parameter_dtype == INFINI_DTYPE_F32)) {
        return INFINI_STATUS_BAD_TENSOR_DTYPE;
    }
    for (Tensor t : parameters) {
        if (t != nullptr && t->dtype != parameter_dtype) return INFINI_STATUS_BAD_TENSOR_DTYPE;
    }
    const infiniDtype_t statistic_dtype = statisticsDtypeOf(dtype);
    for (Tensor t : statistics) {
        if (t != nullptr && t->dtype != statistic_dtype) return INFINI_STATUS_BAD_TENSOR_DTYPE;
    }
    return INFINI_STATUS_SUCCESS;
}

infiniDtype_t dtypeOfFirst(std::initializer_list<Tensor> tensors, infiniDtype_t fallback) {
    for (Tensor t : tensors) {
        if (t != nullptr) return t->dtype;
    }
    return fallback;
}

bool sameShape(Tensor a, Tensor b) { return a->shape == b->shape; }

bool isVector(Tensor t, size_t length) { return t->ndim() == 1 && t->shape[0] == length; }

size_t leadingCount(Tensor t) {
    size_t count = 1;
    for (size_t i = 0; i + 1 < t->ndim(); ++i) count *= t->shape[i];
    return count;
}

size_t countOf(Tensor t, size_t begin, size_t end) {
    size_t count = 1;
    for (size_t i = begin; i < end; ++i) count *= t->shape[i];
    return count;
}

bool trailingPacked(Tensor t, size_t k) {
    if (t->numel() == 0) return true;
    ptrdiff_t expected = 1;
    for (size_t i = t->ndim(); i-- > t->ndim() - k;) {
        if (t->shape[i] > 1 && t->strides[i] != expected) return false;
        expected *= static_cast<ptrdiff_t>(t->shape[i]);
    }
    return true;
}

bool collapsesToVector(Tensor t, ptrdiff_t *stride) {
    *stride = 0;
    bool found = false;
    ptrdiff_t expected = 0; // the stride the next stepped dim outwards must have
    for (size_t i = t->ndim(); i-- > 0;) {
        if (t->shape[i] <= 1) continue;
        if (!found) {
            *stride = t->strides[i];
            found = true;
        } else if (t->strides[i] != expected) {
            return false;
        }
        expected = t->strides[i] * static_cast<ptrdiff_t>(t->shape[i]);
    }
    return true;
}

bool lastDimContiguous(Tensor t) {
    if (t->ndim() == 0 || t->numel() == 0) return true; // an empty tensor is never read or written
    return t->shape.back() <= 1 || t->strides.back() == 1;
}

bool fullyContiguous(Tensor t) {
    if (t->numel() == 0) return true;
    ptrdiff_t expected = 1;
    for (size_t i = t->ndim(); i-- > 0;) {
        if (t->shape[i] > 1 && t->strides[i] != expected) return false;
        expected *= static_cast<ptrdiff_t>(t->shape[i]);
    }
    return true;
}

bool nonOverlapping(Tensor t) {
    if (t->numel() == 0) return true;
    std::vector<std::pair<size_t, size_t>> dims; // (|stride|, extent) of the dims that are stepped
    for (size_t i = 0; i < t->ndim(); ++i) {
        if (t->shape[i] > 1) dims.emplace_back(static_cast<size_t>(std::llabs(t->strides[i])), t->shape[i]);
    }
    std::sort(dims.begin(), dims.end());
    size_t reach = 0; // largest offset the smaller dims can produce
    for (auto [stride, extent] : dims) {
        if (stride < reach + 1) return false;
        reach += stride * (extent - 1);
    }
    return true;
}

} // namespace infini
