// The tensor descriptor behind infiniopTensorDescriptor_t, and dtype facts.
#ifndef INFINI_COMMON_TENSOR_H
#define INFINI_COMMON_TENSOR_H

#include "infinicore.h"

#include <cstddef>
#include <vector>

struct InfiniopTensorDescriptor {
    infiniDtype_t dtype;
    std::vector<size_t> shape;
    std::vector<ptrdiff_t> strides; // in elements

    size_t ndim() const { return shape.size(); }
    size_t numel() const {
        size_t n = 1;
        for (size_t extent : shape) n *= extent;
        return n;
    }
};

namespace infini {

// Size in bytes of one element; 0 for codes that are not a storable dtype.
size_t dtypeSize(infiniDtype_t dtype);

inline bool isNormFloat(infiniDtype_t dtype) {
    return dtype == INFINI_DTYPE_F16 || dtype == INFINI_DTYPE_F32 || dtype == INFINI_DTYPE_BF16;
}

} // namespace infini

#endif
