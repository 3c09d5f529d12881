// Stride and dtype rules shared by the op info.h files (see README "Validation rules").
#ifndef INFINI_COMMON_LAYOUT_H
#define INFINI_COMMON_LAYOUT_H

#include "tensor.h"

#include <initializer_list>

namespace infini {

using Tensor = const InfiniopTensorDescriptor *;

// BAD_TENSOR_DTYPE unless every tensor has the first one's dtype and it is F16, F32 or BF16.
infiniStatus_t checkSameNormFloat(std::initializer_list<Tensor> tensors);

bool sameShape(Tensor a, Tensor b);
bool isVector(Tensor t, size_t length);
// Product of all dims but the last: the number of rows of a row-normalized tensor.
size_t leadingCount(Tensor t);

// Last dim has stride 1, or is of size <= 1 (never stepped, so its stride does not matter), or t is empty.
bool lastDimContiguous(Tensor t);
// Row-major contiguous, ignoring dims of size 1; empty tensors count as contiguous.
bool fullyContiguous(Tensor t);
// No two indices of the tensor share a memory offset (required of every output).
bool nonOverlapping(Tensor t);

} // namespace infini

#endif
