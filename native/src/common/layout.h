// Stride and dtype rules shared by the op info.h files (see README "Validation rules").
#ifndef INFINI_COMMON_LAYOUT_H
#define INFINI_COMMON_LAYOUT_H

#include "tensor.h"

#include <initializer_list>

namespace infini {

using Tensor = const InfiniopTensorDescriptor *;

// BAD_TENSOR_DTYPE unless every tensor has the first one's dtype and it is F16, F32 or BF16.
// NULL entries after the first (an absent grad_bias) are skipped.
infiniStatus_t checkSameNormFloat(std::initializer_list<Tensor> tensors);

// The dtype of the statistics (saved mean, rstd, invstd; BatchNorm's per-channel sums): F32, or F64 for F64 dT.
inline infiniDtype_t statisticsDtypeOf(infiniDtype_t dtype) {
    return dtype == INFINI_DTYPE_F64 ? INFINI_DTYPE_F64 : INFINI_DTYPE_F32;
}

// The dtype rule of the ...Ex create functions; NULL entries (absent optional tensors) are skipped.
// activations share dT in {F16, BF16, F32, F64}; parameters share dT or, for F16/BF16 dT, F32;
// statistics are F32, or F64 for F64 dT.
infiniStatus_t checkNormDtypesEx(std::initializer_list<Tensor> activations, std::initializer_list<Tensor> parameters,
                                 std::initializer_list<Tensor> statistics);
// The dtype every present tensor of `tensors` shares (they were checked); `fallback` when none is present.
infiniDtype_t dtypeOfFirst(std::initializer_list<Tensor> tensors, infiniDtype_t fallback);

bool sameShape(Tensor a, Tensor b);
bool isVector(Tensor t, size_t length);
// Product of all dims but the last: the number of rows of a row-normalized tensor.
size_t leadingCount(Tensor t);

// Product of dims [begin, end).
size_t countOf(Tensor t, size_t begin, size_t end);
// The last k dims are row-major packed with unit innermost stride (dims of size <= 1 ignored; empty t passes).
bool trailingPacked(Tensor t, size_t k);
// t's elements lie on one arithmetic progression, in index order; *stride gets its step (0 when t has at
// most one element). A row-major view of a vector, e.g. a contiguous (H, W) weight, or a strided (D,) one.
bool collapsesToVector(Tensor t, ptrdiff_t *stride);

// Last dim has stride 1, or is of size <= 1 (never stepped, so its stride does not matter), or t is empty.
bool lastDimContiguous(Tensor t);
// Row-major contiguous, ignoring dims of size 1; empty tensors count as contiguous.
bool fullyContiguous(Tensor t);
// No two indices of the tensor share a memory offset (required of every output).
bool nonOverlapping(Tensor t);

} // namespace infini

#endif
