// Compiled once per ISA (CPU_ISA = avx512bf16, avx512, avx2 or generic, with matching flags); see simd.h.
#include "convert_simd.h"

#include "simd.h"

namespace cpu {
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

template <typename T>
void narrowSum(size_t n, const float *src, size_t blocks, size_t block_stride, T *dst, ptrdiff_t stride) {
    typedef double f64x8 __attribute__((vector_size(64)));
    size_t j = 0;
    if (stride == 1) {
        for (; j + simd::kWidth <= n; j += simd::kWidth) {
            f64x8 low = {}, high = {};
            for (size_t b = 0; b < blocks; ++b) {
                const simd::f32v v = simd::load(src + b * block_stride + j);
                low += __builtin_convertvector(simd::lowHalf(v), f64x8);
                high += __builtin_convertvector(simd::highHalf(v), f64x8);
            }
            simd::store(dst + j, simd::joinHalves(__builtin_convertvector(low, simd::f32x8),
                                                  __builtin_convertvector(high, simd::f32x8)));
        }
    }
    for (; j < n; ++j) {
        double sum = 0.0;
        for (size_t b = 0; b < blocks; ++b) sum += src[b * block_stride + j];
        dst[static_cast<ptrdiff_t>(j) * stride] = fromFloat<T>(static_cast<float>(sum));
    }
}

template <typename T>
const Conversions<T> &table() {
    static const Conversions<T> table{widen<T>, narrow<T>, narrowSum<T>};
    return table;
}

} // namespace
} // namespace cpu

// This ISA's tables: CPU_ISA names a cpu::Isa value.
namespace cpu {
template <>
const Conversions<float> &isaTable<Isa::CPU_ISA, Conversions<float>>() {
    return cpu::table<float>();
}
template <>
const Conversions<f16_t> &isaTable<Isa::CPU_ISA, Conversions<f16_t>>() {
    return cpu::table<f16_t>();
}
template <>
const Conversions<bf16_t> &isaTable<Isa::CPU_ISA, Conversions<bf16_t>>() {
    return cpu::table<bf16_t>();
}
} // namespace cpu
