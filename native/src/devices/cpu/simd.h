// Vector helpers for the per-ISA kernel files (*_simd.cc), written with GCC vector extensions so the same
// source compiles to AVX-512, AVX2 or SSE2 by flags alone. Everything here has internal linkage: each ISA's
// translation unit keeps its own copy, so the linker can never hand AVX-512 code to the generic path.
#ifndef INFINI_DEVICES_CPU_SIMD_H
#define INFINI_DEVICES_CPU_SIMD_H

#include "half.h"
#include "reduce.h"

#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__AVX512F__) || defined(__F16C__)
// infinicore.h's __C (upstream's name) is also a parameter name inside GCC's intrinsic headers.
#pragma push_macro("__C")
#undef __C
#include <immintrin.h>
#pragma pop_macro("__C")
#endif

#ifndef CPU_ISA
#error "simd.h is for the *_simd.cc files, compiled once per ISA with CPU_ISA defined"
#endif

namespace {
namespace simd {

constexpr size_t kWidth = 16; // floats per vector
// Row reductions run in chunks of this many elements: F32 lanes inside a chunk, F64 across chunks.
// Chunk boundaries are fixed relative to the row start, so a row split across threads sums identically.
constexpr size_t kChunk = 4096;

typedef float f32v __attribute__((vector_size(64)));
typedef uint32_t u32v __attribute__((vector_size(64)));
typedef int32_t i32v __attribute__((vector_size(64)));
typedef uint16_t u16v __attribute__((vector_size(32)));
typedef _Float16 f16v __attribute__((vector_size(32)));

inline f32v splat(float value) { return f32v{} + value; }

inline f32v load(const float *p) {
    f32v v;
    std::memcpy(&v, p, sizeof v);
    return v;
}

inline f32v load(const cpu::bf16_t *p) {
    u16v half;
    std::memcpy(&half, p, sizeof half);
    return (f32v)(__builtin_convertvector(half, u32v) << 16);
}

// GCC scalarizes vector conversions to and from _Float16, so use the F16C / AVX-512 instructions directly.
inline f32v load(const cpu::f16_t *p) {
#if defined(__AVX512F__)
    return (f32v)_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(p)));
#elif defined(__F16C__)
    __m256 halves[2] = {_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(p))),
                        _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(p + 8)))};
    f32v v;
    std::memcpy(&v, halves, sizeof v);
    return v;
#else
    f16v half;
    std::memcpy(&half, p, sizeof half);
    return __builtin_convertvector(half, f32v);
#endif
}

inline void store(float *p, f32v v) { std::memcpy(p, &v, sizeof v); }

inline void store(cpu::bf16_t *p, f32v v) {
    u32v bits = (u32v)v;
    u32v rounded = bits + 0x7fffu + ((bits >> 16) & 1u); // nearest, ties to even
    i32v is_nan = (i32v)(bits & 0x7fffffffu) > 0x7f800000;
    u32v result = is_nan ? (bits | 0x00400000u) : rounded; // keep NaN a quiet NaN
    u16v half = __builtin_convertvector(result >> 16, u16v);
    std::memcpy(p, &half, sizeof half);
}

inline void store(cpu::f16_t *p, f32v v) {
#if defined(__AVX512F__) || defined(__F16C__)
    constexpr int kNearest = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
#endif
#if defined(__AVX512F__)
    _mm256_storeu_si256(reinterpret_cast<__m256i *>(p), _mm512_cvtps_ph((__m512)v, kNearest));
#elif defined(__F16C__)
    __m256 halves[2];
    std::memcpy(halves, &v, sizeof v);
    _mm_storeu_si128(reinterpret_cast<__m128i *>(p), _mm256_cvtps_ph(halves[0], kNearest));
    _mm_storeu_si128(reinterpret_cast<__m128i *>(p + 8), _mm256_cvtps_ph(halves[1], kNearest));
#else
    f16v half = __builtin_convertvector(v, f16v);
    std::memcpy(p, &half, sizeof half);
#endif
}

// Lane sum in a fixed order, in F64.
inline double sum(f32v v) {
    double total = 0.0;
    for (size_t lane = 0; lane < kWidth; ++lane) total += v[lane];
    return total;
}

// Sums of the two terms that terms(f32v...) gives for the vectors of `n` elements starting at each pointer,
// chunk by chunk; `scalar_terms(j, float &first, float &second)` handles the tail of each chunk.
template <typename VectorTerms, typename ScalarTerms>
inline cpu::PairSums chunkedSums(size_t n, VectorTerms &&vector_terms, ScalarTerms &&scalar_terms) {
    cpu::PairSums total;
    for (size_t begin = 0; begin < n; begin += kChunk) {
        size_t end = begin + kChunk < n ? begin + kChunk : n;
        f32v first0 = {}, first1 = {}, second0 = {}, second1 = {};
        size_t j = begin;
        for (; j + 2 * kWidth <= end; j += 2 * kWidth) {
            vector_terms(j, first0, second0);
            vector_terms(j + kWidth, first1, second1);
        }
        for (; j + kWidth <= end; j += kWidth) vector_terms(j, first0, second0);
        float tail_first = 0.0f, tail_second = 0.0f;
        for (; j < end; ++j) scalar_terms(j, tail_first, tail_second);
        total.first += sum(first0 + first1) + tail_first;
        total.second += sum(second0 + second1) + tail_second;
    }
    return total;
}

} // namespace simd
} // namespace

#endif
