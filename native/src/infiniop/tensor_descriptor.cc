#include "infiniop/tensor_descriptor.h"

#include "common/enum_value.h"
#include "common/status.h"
#include "common/tensor.h"

#include <cstdint>
#include <cstdlib>
#include <limits>
#include <utility>

namespace {

// Every byte offset a kernel can form must fit in int64 (kernels index with ptrdiff_t, and the aliasing check
// of each run works on byte footprints): the element count, the contiguous strides (made for NULL strides, even
// of empty tensors) and the span of the given strides, each times the item size.
bool fitsInt64(size_t ndim, const size_t *shape, const ptrdiff_t *strides, size_t itemsize) {
    const uint64_t limit = static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) / itemsize;
    uint64_t contiguous = 1; // the products of shape suffixes, as infiniopCreateTensorDescriptor forms them
    for (size_t i = ndim; i-- > 0;) {
        if (shape[i] > limit || (shape[i] != 0 && contiguous > limit / shape[i])) return false;
        contiguous *= shape[i];
    }
    uint64_t span = 0;
    for (size_t i = 0; strides != nullptr && i < ndim; ++i) {
        if (shape[i] == 0) continue;
        uint64_t stride = static_cast<uint64_t>(strides[i]);
        if (strides[i] < 0) stride = 0 - stride; // |stride|, well defined even for the most negative value
        uint64_t steps = shape[i] - 1;
        if (steps != 0 && stride > (limit - span) / steps) return false;
        span += stride * steps;
    }
    return true;
}

bool isDtypeCode(const infiniDtype_t &dtype) { // by reference: copying an invalid enum is a load too
    return infini::rawValue(dtype) >= INFINI_DTYPE_BYTE && infini::rawValue(dtype) <= INFINI_DTYPE_BF16;
}

} // namespace

__C infiniStatus_t infiniopCreateTensorDescriptor(infiniopTensorDescriptor_t *desc_ptr, size_t ndim,
                                                  const size_t *shape, const ptrdiff_t *strides,
                                                  infiniDtype_t dtype) {
    return infini::guarded([&] {
        if (desc_ptr == nullptr || (ndim > 0 && shape == nullptr)) return INFINI_STATUS_NULL_POINTER;
        if (!isDtypeCode(dtype)) return INFINI_STATUS_BAD_TENSOR_DTYPE;
        if (!fitsInt64(ndim, shape, strides, infini::dtypeSize(dtype))) return INFINI_STATUS_BAD_TENSOR_SHAPE;

        std::vector<ptrdiff_t> element_strides(ndim, 0); // sized at construction: resize() would export a std symbol
        ptrdiff_t contiguous = 1;
        for (size_t i = ndim; i-- > 0;) {
            element_strides[i] = strides != nullptr ? strides[i] : contiguous;
            contiguous *= static_cast<ptrdiff_t>(shape[i]);
        }
        auto *desc =
            new InfiniopTensorDescriptor{dtype, std::vector<size_t>(shape, shape + ndim), std::move(element_strides)};
        *desc_ptr = desc;
        return INFINI_STATUS_SUCCESS;
    });
}

__C infiniStatus_t infiniopDestroyTensorDescriptor(infiniopTensorDescriptor_t desc) {
    if (desc == nullptr) return INFINI_STATUS_NULL_POINTER;
    delete desc;
    return INFINI_STATUS_SUCCESS;
}
