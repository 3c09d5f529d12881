// Compiled once per ISA (CPU_ISA = avx512, avx2 or generic, with matching flags); see simd.h.
#include "convert_simd.h"

#include "simd.h"

namespace cpu::CPU_ISA {
namespace {

template <typename T>
void widen(size_t n, const T *src, ptrdiff_t stride, float *dst) {
    size_t j = 0;
    if (stride == 1) {
        for (; j + simd::kWidth <= n; j += simd::kWidth) simd::store(dst + j, simd::load(src + j));
    }
    for (; j < n; ++j) dst[j] = toFloat(src[static_cast<ptrdiff_t>(j) * stride]);
}

template <typename T>
void narrow(size_t n, const float *src, T *dst, ptrdiff_t stride) {
    size_t j = 0;
    if (stride == 1) {
        for (; j + simd::kWidth <= n; j += simd::kWidth) simd::store(dst + j, simd::load(src + j));
    }
    for (; j < n; ++j) dst[static_cast<ptrdiff_t>(j) * stride] = fromFloat<T>(src[j]);
}

} // namespace

template <typename T>
const Conversions<T> &conversions() {
    static const Conversions<T> table{widen<T>, narrow<T>};
    return table;
}

template const Conversions<float> &conversions<float>();
template const Conversions<f16_t> &conversions<f16_t>();
template const Conversions<bf16_t> &conversions<bf16_t>();

} // namespace cpu::CPU_ISA
