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

// F64 vectors of the hardware's width: GCC keeps a wider vector type on the stack on narrower hardware, and a
// 64-byte F64 accumulator made AVX2's narrowSum move every partial through memory (12% of LayerNorm BF16 256x4096).
#if defined(__AVX512F__)
constexpr size_t kF64Lanes = 8;
#elif defined(__AVX__)
constexpr size_t kF64Lanes = 4;
#else
constexpr size_t kF64Lanes = 2;
#endif
typedef double f64h __attribute__((vector_size(kF64Lanes * sizeof(double))));
typedef float f32h __attribute__((vector_size(kF64Lanes * sizeof(float))));
constexpr size_t kF64Parts = simd::kWidth / kF64Lanes;

// kF64Lanes floats from p, widened (GCC 12 converts an f32h through 2-lane pieces on AVX2).
inline __attribute__((always_inline)) f64h widenToF64(const float *p) {
#if defined(__AVX512F__)
    return (f64h)_mm512_cvtps_pd(_mm256_loadu_ps(p));
#elif defined(__AVX__)
    return (f64h)_mm256_cvtps_pd(_mm_loadu_ps(p));
#else
    f32h part;
    std::memcpy(&part, p, sizeof part);
    return __builtin_convertvector(part, f64h);
#endif
}

template <typename T>
void narrowSum(size_t n, const float *src, size_t blocks, size_t block_stride, T *dst, ptrdiff_t stride) {
    size_t j = 0;
    if (stride == 1) {
        for (; j + simd::kWidth <= n; j += simd::kWidth) {
            f64h sums[kF64Parts] = {};
            for (size_t b = 0; b < blocks; ++b) {
                const float *block = src + b * block_stride + j;
                for (size_t k = 0; k < kF64Parts; ++k) sums[k] += widenToF64(block + k * kF64Lanes);
            }
            float narrowed[simd::kWidth];
            for (size_t k = 0; k < kF64Parts; ++k) {
                const f32h part = __builtin_convertvector(sums[k], f32h);
                std::memcpy(narrowed + k * kF64Lanes, &part, sizeof part);
            }
            simd::store(dst + j, simd::load(narrowed));
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
#if SIMD_NON_BF16_TABLES
template <>
const Conversions<float> &isaTable<Isa::CPU_ISA, Conversions<float>>() {
    return cpu::table<float>();
}
template <>
const Conversions<f16_t> &isaTable<Isa::CPU_ISA, Conversions<f16_t>>() {
    return cpu::table<f16_t>();
}
#endif
template <>
const Conversions<bf16_t> &isaTable<Isa::CPU_ISA, Conversions<bf16_t>>() {
    return cpu::table<bf16_t>();
}
} // namespace cpu
