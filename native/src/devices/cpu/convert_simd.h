// Conversions of the D- or C-length vectors (weights in, weight gradients out), built once per ISA: a scalar
// F16 conversion outside the ISA files is a soft-float call, which dominates for rows of a million elements.
#ifndef INFINI_DEVICES_CPU_CONVERT_SIMD_H
#define INFINI_DEVICES_CPU_CONVERT_SIMD_H

#include "half.h"
#include "isa.h"

#include <cstddef>

namespace cpu {

template <typename T>
struct Conversions {
    // dst[j] = float(src[j * stride]) for j in [0, n).
    void (*widen)(size_t n, const T *src, ptrdiff_t stride, float *dst);
    // dst[j * stride] = T(src[j]) for j in [0, n), rounding to nearest even.
    void (*narrow)(size_t n, const float *src, T *dst, ptrdiff_t stride);
    // dst[j * stride] = T(float(the F64 sum, from 0 and in block order, of src[b * block_stride + j] for b in
    // [0, blocks))) for j in [0, n): the weight gradient from its row blocks' partials.
    void (*narrowSum)(size_t n, const float *src, size_t blocks, size_t block_stride, T *dst, ptrdiff_t stride);
};

} // namespace cpu

#endif
