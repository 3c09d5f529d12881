// The C++ types behind the dtype pairs of the Ex rule (common/layout.h checkNormDtypesEx), and the vector
// conversions of the D- or C-length parameters: widened to the compute type before a run, narrowed after.
#ifndef INFINI_DEVICES_CPU_TYPES_H
#define INFINI_DEVICES_CPU_TYPES_H

#include "convert_simd.h"
#include "half.h"
#include "parallel.h"

#include <cstddef>
#include <type_traits>

namespace cpu {

// Sums and coefficients are F32 for F16/BF16/F32 data (F64 for the partial sums of whole rows), F64 for F64.
template <typename T>
using ComputeOf = std::conditional_t<std::is_same_v<T, double>, double, float>;

// ComputeOf as a dtype, for descriptors that size a workspace before any T is known.
inline infiniDtype_t computeDtypeOf(infiniDtype_t dtype) {
    return dtype == INFINI_DTYPE_F64 ? INFINI_DTYPE_F64 : INFINI_DTYPE_F32;
}

// body(T{}, W{}): T the activations' type, W the parameters' (T, or float for F16/BF16 with F32 parameters).
template <typename Body>
void withDataAndParameterTypes(infiniDtype_t dtype, infiniDtype_t parameter_dtype, Body &&body) {
    const bool f32_parameters = parameter_dtype == INFINI_DTYPE_F32;
    switch (dtype) {
    case INFINI_DTYPE_F64: body(double{}, double{}); break;
    case INFINI_DTYPE_F16: f32_parameters ? body(f16_t{}, float{}) : body(f16_t{}, f16_t{}); break;
    case INFINI_DTYPE_BF16: f32_parameters ? body(bf16_t{}, float{}) : body(bf16_t{}, bf16_t{}); break;
    default: body(float{}, float{}); break;
    }
}

// An op's leaf kernels for data T and parameters read as W: the per-ISA table for F16/BF16/F32, the op's scalar
// `f64` table for F64.
template <template <typename, typename> class Kernels, typename T, typename W>
const Kernels<T, W> &kernelsFor(const Kernels<double, double> &f64) {
    if constexpr (std::is_same_v<T, double>) {
        return f64;
    } else {
        return selectedTable<Kernels<T, W>>();
    }
}

// One stored value as double (F16/BF16 go through their exact float value).
template <typename W>
double toDouble(W value) {
    if constexpr (std::is_same_v<W, double>) {
        return value;
    } else {
        return toFloat(value);
    }
}

// dst[j] = src[j * stride] in the compute type; src NULL (an absent weight) gives ones. Long vectors (a single
// row of a million elements has one) are converted on the op's threads, in fixed pieces.
template <typename W, typename C>
void widenVector(size_t n, const W *src, ptrdiff_t stride, C *dst) {
    constexpr size_t kPiece = size_t(1) << 16;
    parallelFor((n + kPiece - 1) / kPiece, [&](size_t piece) {
        const size_t begin = piece * kPiece, count = n - begin < kPiece ? n - begin : kPiece;
        C *out = dst + begin;
        if (src == nullptr) {
            for (size_t j = 0; j < count; ++j) out[j] = C(1);
            return;
        }
        const W *in = src + static_cast<ptrdiff_t>(begin) * stride;
        if constexpr (std::is_same_v<W, double>) {
            for (size_t j = 0; j < count; ++j) out[j] = in[static_cast<ptrdiff_t>(j) * stride];
        } else {
            selectedTable<Conversions<W>>().widen(count, in, stride, out);
        }
    }, threadsFor(n));
}

// Whether the kernels read a parameter vector as the caller stores it: present, contiguous, and of the compute
// type or 16-bit with `sixteen_bit_as_stored`. Else withKernelVector widens it into a copy in the workspace.
inline bool readAsStored(bool present, ptrdiff_t stride, bool of_compute_type, bool sixteen_bit_as_stored) {
    return present && stride == 1 && (of_compute_type || sixteen_bit_as_stored);
}

// body(vector) with the parameter vector as the kernels read it (readAsStored): src itself, the kernels widening
// a 16-bit one as they load each vector; else widened into `copy` (C elements) as widenVector does.
template <typename W, typename C, typename Body>
void withKernelVector(size_t n, const W *src, ptrdiff_t stride, bool sixteen_bit_as_stored, C *copy, Body &&body) {
    if (readAsStored(src != nullptr, stride, std::is_same_v<W, C>, sixteen_bit_as_stored)) {
        body(src);
        return;
    }
    widenVector(n, src, stride, copy);
    body(static_cast<const C *>(copy));
}

// Sets n elements of a strided parameter-gradient vector to zero: the gradient of an empty batch.
template <typename W>
void zeroVector(W *vector, size_t n, ptrdiff_t stride) {
    for (size_t i = 0; i < n; ++i) vector[static_cast<ptrdiff_t>(i) * stride] = W{};
}

} // namespace cpu

#endif
