// Vector helpers for the per-ISA kernel files (*_simd.cc), written with GCC vector extensions so the same
// source compiles to AVX-512, AVX2 or SSE2 by flags alone. Everything here has internal linkage: each ISA's
// translation unit keeps its own copy, so the linker can never hand AVX-512 code to the generic path.
#ifndef INFINI_DEVICES_CPU_SIMD_H
#define INFINI_DEVICES_CPU_SIMD_H

#include "half.h"
#include "reduce.h"
#include "row_hints.h"

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <type_traits>
#include <utility>

#if defined(__AVX512F__) || defined(__F16C__) || defined(__AVX__)
// infinicore.h's __C (upstream's name) is also a parameter name inside GCC's intrinsic headers.
#pragma push_macro("__C")
#undef __C
// GCC 12's _mm512_undefined_* initialize a variable with itself, which -Wuninitialized reports wherever an
// intrinsic using them is inlined (GCC bug 105593).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#pragma pop_macro("__C")
#endif

#ifndef CPU_ISA
#error "simd.h is for the *_simd.cc files, compiled once per ISA with CPU_ISA defined"
#endif

// Whether this build defines the kernel tables that have no BF16 (cpu::HasBf16): all but avx512bf16, whose code
// for them is avx512's, instruction for instruction (its F32 and F16 LayerNorm and RMSNorm kernels compared).
#if defined(__AVX512BF16__)
#define SIMD_NON_BF16_TABLES 0
#else
#define SIMD_NON_BF16_TABLES 1
#endif

namespace {
namespace simd {

// The per-vector helpers are always inlined, and on 8-lane hardware the passes inline everything they call
// (steps, side work, the callers' lambdas): GCC left calls per vector there, which cost AVX2 up to 4x. AVX-512
// code needs no flattening (GCC inlines it all) and keeps the code it was tuned with.
#define SIMD_INLINE inline __attribute__((always_inline))
// The same for a lambda that a pass calls per vector (after its parameter list). GCC's inlining is budgeted per
// file: when the row ops' files gained their 16-bit-weight kernels, the AVX-512 build left the next row's
// reduction as a call per vector in the F32-weight kernels it had inlined before (LayerNorm BF16 4096x4096, BF16
// rounded in software: 1.10x as long).
#define SIMD_LAMBDA_INLINE __attribute__((always_inline))
#if defined(__AVX512F__)
#define SIMD_FLATTEN
#else
#define SIMD_FLATTEN __attribute__((flatten))
#endif
// passAlongside on AVX2 inlines the next row's reduction whole, constructor and finish included (RMSNorm BF16
// 4096x4096 and 256x65536 took 1.3x as long without, LayerNorm 1.02-1.05x; one thread, 2026-11-27). The generic
// build ran 1.12x slower with it and AVX-512 code keeps what it was tuned with.
#if defined(__AVX__) && !defined(__AVX512F__)
#define SIMD_ALONGSIDE_FLATTEN __attribute__((flatten))
#else
#define SIMD_ALONGSIDE_FLATTEN
#endif

constexpr size_t kWidth = 16; // floats per vector
// Row reductions run in chunks of this many elements: F32 lanes inside a chunk, F64 across chunks.
// Chunk boundaries are fixed relative to the row start, so a row split across threads sums identically.
constexpr size_t kChunk = 4096;
constexpr size_t kLineBytes = 64; // a cache line

typedef float f32x8 __attribute__((vector_size(32)));
typedef uint32_t u32v __attribute__((vector_size(64)));
typedef int32_t i32v __attribute__((vector_size(64)));
typedef uint16_t u16v __attribute__((vector_size(32)));
typedef _Float16 f16v __attribute__((vector_size(32)));

#if defined(__AVX__) && !defined(__AVX512F__)
// 8-lane hardware: a vector is two 256-bit halves. A 16-lane vector type has no machine mode there, so GCC keeps
// such variables (accumulators, captured coefficients) on the stack and moves them in pieces that stores cannot
// forward to loads (AVX2 ran up to 10x slower than AVX-512); the halves stay in registers.
struct f32v {
    f32x8 low, high;
};
SIMD_INLINE f32v operator+(f32v a, f32v b) { return {a.low + b.low, a.high + b.high}; }
SIMD_INLINE f32v operator-(f32v a, f32v b) { return {a.low - b.low, a.high - b.high}; }
SIMD_INLINE f32v operator*(f32v a, f32v b) { return {a.low * b.low, a.high * b.high}; }
SIMD_INLINE f32v &operator+=(f32v &a, f32v b) { return a = a + b; }
SIMD_INLINE f32x8 lowHalf(f32v v) { return v.low; }
SIMD_INLINE f32x8 highHalf(f32v v) { return v.high; }
SIMD_INLINE f32v joinHalves(__m256 low, __m256 high) { return {(f32x8)low, (f32x8)high}; }
#else
typedef float f32v __attribute__((vector_size(64)));
SIMD_INLINE f32x8 lowHalf(f32v v) { return __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7); }
SIMD_INLINE f32x8 highHalf(f32v v) { return __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15); }
SIMD_INLINE f32v joinHalves(f32x8 low, f32x8 high) {
    return __builtin_shufflevector(low, high, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
}
#endif

// A broadcast on every ISA (`f32v{} + value` was built from 16 scalar stores on 8-lane hardware).
SIMD_INLINE f32v splat(float value) {
#if defined(__AVX512F__)
    return (f32v)_mm512_set1_ps(value);
#elif defined(__AVX__)
    const __m256 half = _mm256_set1_ps(value);
    return joinHalves(half, half);
#else
    return f32v{value, value, value, value, value, value, value, value,
                value, value, value, value, value, value, value, value};
#endif
}

// a * b + c, rounded once where the ISA has FMA (the x86-64-v3 and v4 builds), as two operations elsewhere.
SIMD_INLINE f32v mulAdd(f32v a, f32v b, f32v c) {
#if defined(__AVX512F__)
    return (f32v)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)c);
#elif defined(__FMA__)
    return {(f32x8)_mm256_fmadd_ps((__m256)a.low, (__m256)b.low, (__m256)c.low),
            (f32x8)_mm256_fmadd_ps((__m256)a.high, (__m256)b.high, (__m256)c.high)};
#else
    return a * b + c;
#endif
}

// The same for one float, rounded once where mulAdd's lanes are: where a sum's terms must not depend on how the
// compiler contracts `c += a * b`, which it did differently where one function was inlined into two kernels (a
// LayerNorm backward row's sums, in its row and its block kernels).
SIMD_INLINE float mulAdd(float a, float b, float c) {
#if defined(__FMA__)
    return __builtin_fmaf(a, b, c);
#else
    return a * b + c;
#endif
}

SIMD_INLINE f32v load(const float *p) {
#if defined(__AVX__) && !defined(__AVX512F__)
    return joinHalves(_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8));
#else
    f32v v;
    std::memcpy(&v, p, sizeof v);
    return v;
#endif
}

#if !defined(__AVX512F__) && !defined(__F16C__)
// F16 conversions for builds without the F16C / AVX-512 instructions used below: F32 -> F16 rounds to nearest
// even; a NaN keeps its sign and the top of its payload, quiet, as the instructions do.
#if defined(__x86_64__) || defined(__i386__)
// The generic x86 build (SSE2 only). GCC converts _Float16 vectors there with a libgcc call per lane, which the
// flattened passes copied everywhere: its LayerNorm file held 11 MB of code and took GCC 12 over two and a half
// minutes to compile. These give libgcc's bits (all 2^16 F16 and all 2^32 F32 inputs checked, with and without
// DAZ/FTZ) with vector integer ops, plus one integer-to-float conversion (widening) or float addition (narrowing)
// whose result never depends on an F32 subnormal, so DAZ and FTZ leave it alone; masks are the signs of
// differences, as compares of 16 lanes are done lane by lane on SSE2. Out of line, one copy each: F16 LayerNorm
// 256x4096 and RMSNorm 1024x4096 took 0.12 of the libgcc conversions' time (one thread, same bits).
__attribute__((noinline)) inline f32v widenF16(const cpu::f16_t *p) {
    u16v half;
    std::memcpy(&half, p, sizeof half);
    const i32v h = (i32v)__builtin_convertvector(half, u32v), magnitude = h & 0x7fff, mantissa = h & 0x03ff;
    const i32v special = (0x7bff - magnitude) >> 31; // exponent all ones: infinity or NaN
    const i32v small = (magnitude - 0x0400) >> 31;   // exponent zero: zero or subnormal
    const i32v normal_bits = (magnitude << 13) + ((127 - 15) << 23);
    const i32v quiet = ((0 - mantissa) >> 31) & 0x00400000; // a NaN comes out quiet
    const i32v special_bits = (mantissa << 13) | 0x7f800000 | quiet;
    // A subnormal is mantissa * 2^-24: the mantissa as a float, 24 taken off its exponent (zero stays zero).
    const i32v small_bits = ((i32v)__builtin_convertvector(magnitude, f32v) - (24 << 23)) & ((0 - magnitude) >> 31);
    const i32v sign = (i32v)(((u32v)h & 0x8000u) << 16); // unsigned: shifting into the sign bit is no overflow
    const i32v bits = sign | (normal_bits & ~(special | small)) | (special_bits & special) | (small_bits & small);
    return (f32v)bits;
}

__attribute__((noinline)) inline u16v narrowToF16(f32v v) {
    const u32v f = (u32v)v;
    const i32v magnitude = (i32v)(f & 0x7fffffffu);
    const i32v nan = (0x7f800000 - magnitude) >> 31;
    const i32v large = (0x477fffff - magnitude) >> 31; // at least 2^16: infinity (or NaN)
    const i32v small = (magnitude - 0x38800000) >> 31; // below 2^-14: zero or subnormal
    const i32v large_bits = 0x7c00 | (nan & (0x0200 | ((magnitude >> 13) & 0x03ff)));
    // Below 2^-14, adding 0.5 rounds to a multiple of 2^-24 (to nearest even) in the low mantissa bits.
    const i32v small_bits = (i32v)((f32v)magnitude + 0.5f) - 0x3f000000;
    // Rebias the exponent; adding 0xfff plus the lowest kept bit rounds the 13 dropped bits to nearest even (a
    // carry out of the mantissa gives the next exponent, or infinity).
    const i32v normal_bits = (magnitude + (-((127 - 15) << 23) + 0x0fff) + ((magnitude >> 13) & 1)) >> 13;
    const i32v bits = (large_bits & large) | (small_bits & small) | (normal_bits & ~(large | small));
    return __builtin_convertvector((u32v)bits | ((f >> 16) & 0x8000u), u16v);
}
#else
SIMD_INLINE f32v widenF16(const cpu::f16_t *p) {
    f16v half;
    std::memcpy(&half, p, sizeof half);
    return __builtin_convertvector(half, f32v);
}

SIMD_INLINE u16v narrowToF16(f32v v) {
    u16v bits;
    f16v half = __builtin_convertvector(v, f16v);
    std::memcpy(&bits, &half, sizeof bits);
    return bits;
}
#endif
#endif

// BF16 is the top half of an F32. GCC 12 widens 16 lanes through four 256-bit shuffles, so say it directly.
SIMD_INLINE f32v load(const cpu::bf16_t *p) {
#if defined(__AVX512F__)
    __m512i wide = _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(p))), 16);
    f32v v;
    std::memcpy(&v, &wide, sizeof v);
    return v;
#elif defined(__AVX2__)
    // Eight BF16 into the top halves of eight F32 lanes with one shuffle of a broadcast load (the broadcast is
    // done by the load unit), not a zero-extension and a shift: BF16 on AVX2 is bound by the vector ALUs.
    const __m256i to_top_halves = _mm256_setr_epi8(-1, -1, 0, 1, -1, -1, 2, 3, -1, -1, 4, 5, -1, -1, 6, 7,
                                                   -1, -1, 8, 9, -1, -1, 10, 11, -1, -1, 12, 13, -1, -1, 14, 15);
    auto widen = [&](const cpu::bf16_t *eight) {
        const __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i *>(eight));
        return (__m256)_mm256_shuffle_epi8(_mm256_broadcastsi128_si256(bits), to_top_halves);
    };
    return joinHalves(widen(p), widen(p + 8));
#else
    u16v half;
    std::memcpy(&half, p, sizeof half);
    return (f32v)(__builtin_convertvector(half, u32v) << 16);
#endif
}

// GCC scalarizes vector conversions to and from _Float16, so use the F16C / AVX-512 instructions directly.
SIMD_INLINE f32v load(const cpu::f16_t *p) {
#if defined(__AVX512F__)
    return (f32v)_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i *>(p)));
#elif defined(__F16C__)
    return joinHalves(_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(p))),
                      _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i *>(p + 8))));
#else
    return widenF16(p);
#endif
}

// F32 -> 16-bit conversions, rounding to nearest even (NaN stays a quiet NaN).
SIMD_INLINE u16v narrowBits(f32v v, cpu::bf16_t) {
    u16v half;
#if defined(__AVX512BF16__)
    // One instruction instead of seven; like every AVX512-BF16 conversion, it flushes F32 subnormals to zero.
    __m256bh narrowed = _mm512_cvtneps_pbh((__m512)v);
    std::memcpy(&half, &narrowed, sizeof half);
#elif defined(__AVX512F__)
    const __m512i bits = (__m512i)v;
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
    __m512i rounded = _mm512_add_epi32(bits, _mm512_add_epi32(_mm512_set1_epi32(0x7fff), lsb)); // ties to even
    const __mmask16 is_nan = _mm512_cmp_ps_mask((__m512)v, (__m512)v, _CMP_UNORD_Q);
    rounded = _mm512_mask_or_epi32(rounded, is_nan, bits, _mm512_set1_epi32(0x00400000)); // NaN stays quiet
    // The top halves (odd words) to 16 words in one permute; vpmovdw after a shift is three ops on Intel.
    const __m512i odd_words = _mm512_set_epi32(0, 0, 0, 0, 0, 0, 0, 0, 0x001f001d, 0x001b0019, 0x00170015,
                                               0x00130011, 0x000f000d, 0x000b0009, 0x00070005, 0x00030001);
    const __m256i narrowed = _mm512_castsi512_si256(_mm512_permutexvar_epi16(odd_words, rounded));
    std::memcpy(&half, &narrowed, sizeof half);
#elif defined(__AVX2__)
    // GCC scalarizes comparisons of 16 lanes on 8-lane hardware, so work on the two halves. A NaN would carry
    // into the exponent or lose its payload (round to infinity), so it needs a blend; but NaNs are rare and
    // these passes are bound by their vector ops, so one compare of both halves and a movemask test send only
    // vectors holding one to the blend (4 of 18 ops saved per vector). Both ways give the same bits.
    const __m256i wide_low = (__m256i)lowHalf(v), wide_high = (__m256i)highHalf(v);
    auto rounded = [](__m256i bits) SIMD_LAMBDA_INLINE { // ties to even, in the top half
        const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
        return _mm256_add_epi32(bits, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb));
    };
    __m256i top_low, top_high;
    if (__builtin_expect(_mm256_movemask_ps(_mm256_cmp_ps(lowHalf(v), highHalf(v), _CMP_UNORD_Q)) == 0, 1)) {
        top_low = _mm256_srli_epi32(rounded(wide_low), 16);
        top_high = _mm256_srli_epi32(rounded(wide_high), 16);
    } else {
        auto nan_kept = [&](__m256i bits) SIMD_LAMBDA_INLINE {
            const __m256i is_nan = (__m256i)_mm256_cmp_ps((__m256)bits, (__m256)bits, _CMP_UNORD_Q);
            const __m256i quiet = _mm256_or_si256(bits, _mm256_set1_epi32(0x00400000)); // a quiet NaN
            return _mm256_srli_epi32(_mm256_blendv_epi8(rounded(bits), quiet, is_nan), 16);
        };
        top_low = nan_kept(wide_low);
        top_high = nan_kept(wide_high);
    }
    // packus interleaves the 128-bit lanes of its two sources; the permute puts them back in order.
    __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(top_low, top_high), 0xd8);
    std::memcpy(&half, &packed, sizeof half);
#else
    u32v bits = (u32v)v;
    u32v rounded = bits + 0x7fffu + ((bits >> 16) & 1u); // nearest, ties to even
    // A select by mask, not `is_nan ? a : b`, which GCC scalarizes where 16 lanes are wider than the hardware; and
    // the mask is the sign of 0x7f800000 - |bits| (no overflow; negative for NaN), not a compare, which GCC also
    // does lane by lane on SSE2 (generic x86 BF16 LayerNorm 1024x4096 and RMSNorm 256x16384 took 0.7 of the time).
    u32v is_nan = (u32v)((0x7f800000 - (i32v)(bits & 0x7fffffffu)) >> 31);
    u32v result = (((bits | 0x00400000u) & is_nan) | (rounded & ~is_nan)) >> 16; // keep NaN a quiet NaN
    half = __builtin_convertvector(result, u16v);
#endif
    return half;
}

SIMD_INLINE u16v narrowBits(f32v v, cpu::f16_t) {
    u16v bits;
#if defined(__AVX512F__) || defined(__F16C__)
    constexpr int kNearest = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
#endif
#if defined(__AVX512F__)
    __m256i narrowed = _mm512_cvtps_ph((__m512)v, kNearest);
    std::memcpy(&bits, &narrowed, sizeof bits);
#elif defined(__F16C__)
    const __m256i narrowed = _mm256_set_m128i(_mm256_cvtps_ph(highHalf(v), kNearest), _mm256_cvtps_ph(lowHalf(v), kNearest));
    std::memcpy(&bits, &narrowed, sizeof bits);
#else
    bits = narrowToF16(v);
#endif
    return bits;
}

SIMD_INLINE void store(float *p, f32v v) {
#if defined(__AVX__) && !defined(__AVX512F__)
    _mm256_storeu_ps(p, lowHalf(v));
    _mm256_storeu_ps(p + 8, highHalf(v));
#else
    std::memcpy(p, &v, sizeof v);
#endif
}

template <typename T>
SIMD_INLINE void storeBits(T *p, u16v bits) {
    std::memcpy(p, &bits, sizeof bits);
}

template <typename T>
SIMD_INLINE void store(T *p, f32v v) {
    storeBits(p, narrowBits(v, T{}));
}

// The bits of +0.0 + x rounded back to T, for the 16 values x of T at p: x itself, but -0.0 made +0.0 and a
// signaling NaN quiet (its payload kept), as narrowBits of the F32 sum gives. Six integer ops on 16-bit lanes
// where the round trip takes a widening, an addition and narrowBits.
template <typename T>
SIMD_INLINE u16v zeroPlusBits(const T *p) {
    static_assert(std::is_same_v<T, cpu::bf16_t> || std::is_same_v<T, cpu::f16_t>, "16-bit types only");
    constexpr int16_t kInfinity = std::is_same_v<T, cpu::bf16_t> ? 0x7f80 : 0x7c00;
    constexpr int16_t kQuietBit = std::is_same_v<T, cpu::bf16_t> ? 0x0040 : 0x0200;
    u16v result;
#if defined(__AVX2__)
    const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i *>(p));
    const __m256i negative_zero = _mm256_cmpeq_epi16(bits, _mm256_set1_epi16(INT16_MIN));
    const __m256i nan = _mm256_cmpgt_epi16(_mm256_and_si256(bits, _mm256_set1_epi16(INT16_MAX)),
                                           _mm256_set1_epi16(kInfinity));
    const __m256i kept = _mm256_or_si256(_mm256_andnot_si256(negative_zero, bits),
                                         _mm256_and_si256(nan, _mm256_set1_epi16(kQuietBit)));
    std::memcpy(&result, &kept, sizeof result);
#else
    typedef int16_t i16v __attribute__((vector_size(32)));
    i16v bits;
    std::memcpy(&bits, p, sizeof bits);
    constexpr int16_t kNegativeZero = INT16_MIN, kMagnitude = INT16_MAX;
    const i16v negative_zero = bits == kNegativeZero, nan = (bits & kMagnitude) > kInfinity; // lanes of all ones
    const i16v kept = (bits & ~negative_zero) | (nan & kQuietBit);
    std::memcpy(&result, &kept, sizeof result);
#endif
    return result;
}

// Stores that bypass the caches, for a large output nobody reads again soon: a cached store first reads the
// line it writes (a third of a row kernel's DRAM traffic). The address must be kStreamAlignment<T>-aligned.
// The generic build has no such store and writes normally.
template <typename T>
constexpr size_t kStreamAlignment = kWidth * sizeof(T);
static_assert(cpu::kStreamElements == kWidth, "the stream conditions (row_hints.h) align to whole vectors");

SIMD_INLINE void storeStream(float *p, f32v v) {
#if defined(__AVX512F__)
    _mm512_stream_ps(p, (__m512)v);
#elif defined(__AVX__)
    _mm256_stream_ps(p, lowHalf(v));
    _mm256_stream_ps(p + 8, highHalf(v));
#else
    store(p, v);
#endif
}

template <typename T>
SIMD_INLINE void storeStream(T *p, f32v v) {
#if defined(__AVX__)
    u16v bits = narrowBits(v, T{});
    __m256i raw;
    std::memcpy(&raw, &bits, sizeof raw);
    _mm256_stream_si256(reinterpret_cast<__m256i *>(p), raw);
#else
    store(p, v);
#endif
}

using cpu::fenceStreams;

// put(stream, p, v): the store a forEachVector step was asked for.
template <typename T>
SIMD_INLINE void put(std::true_type, T *p, f32v v) {
    storeStream(p, v);
}
template <typename T>
SIMD_INLINE void put(std::false_type, T *p, f32v v) {
    store(p, v);
}

// forEachVector's side work for a pass that has none.
struct NoSideWork {
    void operator()() const {}
};

namespace detail {
template <typename A>
using Padded = std::array<std::remove_const_t<A>, kWidth>;

#if defined(__AVX512BW__)
// A partial vector in and out with byte-masked moves: a few instructions where memcpy of a variable length is a
// call. Masked-off bytes are neither read (no fault past an array's end) nor written.
template <typename A>
inline void copyIn(Padded<A> &copy, const A *array, size_t count) {
    static_assert(sizeof copy == 64 || sizeof copy == 32, "a padded vector is 64 or 32 bytes");
    if constexpr (sizeof copy == 64) {
        _mm512_storeu_si512(copy.data(), _mm512_maskz_loadu_epi8(_bzhi_u64(~0ull, count * sizeof(A)), array));
    } else {
        _mm256_storeu_si256(reinterpret_cast<__m256i *>(copy.data()),
                            _mm256_maskz_loadu_epi8(_bzhi_u32(~0u, count * sizeof(A)), array));
    }
}
template <typename A>
inline void copyOut(A *array, const Padded<A> &copy, size_t count) {
    if constexpr (sizeof copy == 64) {
        _mm512_mask_storeu_epi8(array, _bzhi_u64(~0ull, count * sizeof(A)), _mm512_loadu_si512(copy.data()));
    } else {
        _mm256_mask_storeu_epi8(array, _bzhi_u32(~0u, count * sizeof(A)),
                                _mm256_loadu_si256(reinterpret_cast<const __m256i *>(copy.data())));
    }
}
#else
template <typename A>
inline void copyIn(Padded<A> &copy, const A *array, size_t count) {
    copy = {};
    std::memcpy(copy.data(), array, count * sizeof(A));
}
template <typename A>
inline void copyOut(A *array, const Padded<A> &copy, size_t count) {
    std::memcpy(array, copy.data(), count * sizeof(A));
}
#endif

template <typename A>
inline void copyBack(const A *, const Padded<A> &, size_t) {}
template <typename A>
inline void copyBack(A *array, const Padded<A> &copy, size_t count) {
    copyOut(array, copy, count);
}

// step on zero-padded copies of `count` < kWidth elements; what it wrote is copied back.
template <typename Step, typename T, typename... Arrays, size_t... I>
inline void stepPadded(Step &step, size_t count, std::index_sequence<I...>, T *out, Arrays *...arrays) {
    std::tuple<Padded<Arrays>...> copies;
    (copyIn(std::get<I>(copies), arrays, count), ...);
    Padded<T> out_copy;
    step(std::false_type{}, out_copy.data(), std::get<I>(copies).data()...);
    copyOut(out, out_copy, count);
    (copyBack(arrays, std::get<I>(copies), count), ...);
}
} // namespace detail

// The first `count` (at most kWidth) elements at p as a vector, zero beyond them; a plain load when count is kWidth.
template <typename T>
SIMD_INLINE f32v loadPart(const T *p, size_t count) {
    if (count == kWidth) return load(p);
    detail::Padded<const T> copy;
    detail::copyIn(copy, p, count);
    return load(copy.data());
}

// The first `count` lanes of v into p; nothing past them is written.
template <typename T>
SIMD_INLINE void storePart(T *p, f32v v, size_t count) {
    if (count == kWidth) return store(p, v);
    detail::Padded<T> copy;
    store(copy.data(), v);
    detail::copyOut(p, copy, count);
}

// The elementwise pass over n elements: step(stream, out, arrays...) computes kWidth elements at the pointers
// it is given and stores its output with put(stream, ...); arrays it takes as non-const are updated in place.
// Full vectors run in place. The partial ones, the head before `out` is aligned for streamed stores and the
// tail, run the same step on zero-padded copies, so each element is computed by the same instructions wherever
// it falls: results never depend on the buffers' alignment or on `stream`. side_work() runs once per two full
// vectors: work interleaved with the pass (RowSums::step), or NoSideWork. A caller that streams calls
// fenceStreams() once its whole output is written (per call here would cost a fence per short run).
// Streamed, no line is written both ways: a 16-bit vector is half a line, so a lone full vector at either end of
// the streamed part that shares its line with a partial vector (stored cached) is stored cached too. A line
// written partly by cached and partly by streamed stores costs far more than either (2026-12-06, AVX-512 Xeon,
// 2 threads: LayerNorm forward BF16 16384x2056 took 4.5 ms, 16384x2048 3.3 ms, before this). The stream tags
// stay compile-time constants: with a runtime choice for the lone vectors, RMSNorm backward BF16 took 1.09-1.13x
// as long, rows of whole vectors too (2026-12-06, same machine, A/B in alternating processes).
template <typename Step, typename SideWork, typename T, typename... Arrays>
SIMD_FLATTEN inline void forEachVector(size_t n, bool stream, Step &&step, SideWork &&side_work, T *out, Arrays *...arrays) {
    constexpr auto kArrays = std::index_sequence_for<Arrays...>{};
    constexpr bool kHalfLines = kStreamAlignment<T> < kLineBytes;
    static_assert(2 * kStreamAlignment<T> >= kLineBytes, "a pair of vectors fills a line");
    size_t j = 0;
    const size_t misalignment = reinterpret_cast<uintptr_t>(out) % kStreamAlignment<T>;
    stream = stream && misalignment % sizeof(T) == 0;
    if (stream && misalignment != 0) {
        j = (kStreamAlignment<T> - misalignment) / sizeof(T);
        if (j > n) j = n;
        detail::stepPadded(step, j, kArrays, out, arrays...);
    }
    auto lone_vector = [&](auto stream_tag) {
        if (j + kWidth > n) return;
        step(stream_tag, out + j, (arrays + j)...);
        j += kWidth;
    };
    auto full_vectors = [&](auto stream_tag) {
        for (; j + 2 * kWidth <= n; j += 2 * kWidth) {
            side_work();
            step(stream_tag, out + j, (arrays + j)...);
            step(stream_tag, out + j + kWidth, (arrays + j + kWidth)...);
        }
    };
    if (!stream) {
        full_vectors(std::false_type{});
        lone_vector(std::false_type{});
    } else if constexpr (kHalfLines) {
        // A lone vector shares its line with the partial vector beside it where there is one: cached then.
        if (reinterpret_cast<uintptr_t>(out + j) % kLineBytes != 0) {
            if (j != 0) {
                lone_vector(std::false_type{});
            } else {
                lone_vector(std::true_type{});
            }
        }
        full_vectors(std::true_type{});
        if (n - j > kWidth) {
            lone_vector(std::false_type{});
        } else {
            lone_vector(std::true_type{});
        }
    } else {
        full_vectors(std::true_type{});
        lone_vector(std::true_type{});
    }
    if (j < n) detail::stepPadded(step, n - j, kArrays, out + j, (arrays + j)...);
}

// v with its lanes from `count` (at most kWidth) on made +0, bitwise (an infinity or NaN there is dropped too).
SIMD_INLINE f32v keepLanes(f32v v, size_t count) {
#if defined(__AVX512F__)
    return (f32v)_mm512_maskz_mov_ps(static_cast<__mmask16>((1u << count) - 1), (__m512)v);
#elif defined(__AVX2__)
    const __m256i limit = _mm256_set1_epi32(static_cast<int>(count));
    const __m256i low = _mm256_cmpgt_epi32(limit, _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    const __m256i high = _mm256_cmpgt_epi32(limit, _mm256_setr_epi32(8, 9, 10, 11, 12, 13, 14, 15));
    return joinHalves(_mm256_and_ps(lowHalf(v), (__m256)low), _mm256_and_ps(highHalf(v), (__m256)high));
#else
    float lanes[kWidth];
    std::memcpy(lanes, &v, sizeof v);
    for (size_t i = count; i < kWidth; ++i) lanes[i] = 0.0f;
    std::memcpy(&v, lanes, sizeof v);
    return v;
#endif
}

// Eight F64 lanes (sum, sums: F64 trees across an F32 vector's lanes).
typedef double f64x8 __attribute__((vector_size(64)));

// F64 lanes of the short-row kernels' per-row statistics, computed side by side: as many as one register holds.
// Statistics of 8 rows in a 64-byte generic vector left AVX2 with each lane apart, joined through the stack for
// every operation with 32-byte loads that cannot forward from the 8-byte stores (5-9 such stalls a block).
#if defined(__AVX512F__)
constexpr size_t kF64Lanes = 8;
#else
constexpr size_t kF64Lanes = 4;
#endif
typedef double f64l __attribute__((vector_size(8 * kF64Lanes)));
typedef float f32l __attribute__((vector_size(4 * kF64Lanes)));

// body(std::integral_constant<size_t, P>{}) for each group of lanes P .. P + kF64Lanes of a vector.
template <typename Body, size_t... kGroups>
SIMD_INLINE void forEachLaneGroup(Body &&body, std::index_sequence<kGroups...>) {
    (body(std::integral_constant<size_t, kGroups * kF64Lanes>{}), ...);
}
template <typename Body>
SIMD_INLINE void forEachLaneGroup(Body &&body) {
    forEachLaneGroup(body, std::make_index_sequence<kWidth / kF64Lanes>{});
}

// Lanes kFirst .. kFirst + kF64Lanes of v, in F64.
template <size_t kFirst>
SIMD_INLINE f64l widenLanes(f32v v) {
#if defined(__AVX512F__)
    const f32x8 group = kFirst == 0 ? lowHalf(v) : highHalf(v);
#elif defined(__AVX__)
    typedef float f32x4 __attribute__((vector_size(16)));
    const f32x8 half = kFirst < 8 ? lowHalf(v) : highHalf(v);
    constexpr int k = kFirst % 8;
    const f32x4 group = __builtin_shufflevector(half, half, k, k + 1, k + 2, k + 3);
#else
    f32l group;
    for (size_t i = 0; i < kF64Lanes; ++i) group[i] = v[kFirst + i];
#endif
    return __builtin_convertvector(group, f64l);
}

SIMD_INLINE f64l sqrtLanes(f64l v) {
#if defined(__AVX512F__)
    return (f64l)_mm512_sqrt_pd((__m512d)v);
#elif defined(__AVX__)
    return (f64l)_mm256_sqrt_pd((__m256d)v);
#else
    for (size_t i = 0; i < kF64Lanes; ++i) v[i] = __builtin_sqrt(v[i]);
    return v;
#endif
}

// Bit i set where a[i] > b[i] (false where either is NaN).
SIMD_INLINE unsigned lanesAbove(f64l a, f64l b) {
#if defined(__AVX512F__)
    return _mm512_cmp_pd_mask((__m512d)a, (__m512d)b, _CMP_GT_OQ);
#elif defined(__AVX__)
    return static_cast<unsigned>(_mm256_movemask_pd(_mm256_cmp_pd((__m256d)a, (__m256d)b, _CMP_GT_OQ)));
#else
    unsigned mask = 0;
    for (size_t i = 0; i < kF64Lanes; ++i) mask |= static_cast<unsigned>(a[i] > b[i]) << i;
    return mask;
#endif
}

// Lane sum in F64, in a fixed order: lane i + lane i + 8, then halving. A tree, not one chain of 16 dependent
// F64 additions: BatchNorm's channels-first tiles finish two such sums per channel, often per few vectors.
inline double sum(f32v v) {
    typedef double f64x4 __attribute__((vector_size(32)));
    typedef double f64x2 __attribute__((vector_size(16)));
    const f64x8 eight = __builtin_convertvector(lowHalf(v), f64x8) + __builtin_convertvector(highHalf(v), f64x8);
    const f64x4 four = __builtin_shufflevector(eight, eight, 0, 1, 2, 3) + __builtin_shufflevector(eight, eight, 4, 5, 6, 7);
    const f64x2 two = __builtin_shufflevector(four, four, 0, 1) + __builtin_shufflevector(four, four, 2, 3);
    return two[0] + two[1];
}

// sum() of each of `count` (at most kWidth) vectors: out[r] = sum(v[r]) bit for bit (the same additions in the same
// order), the rows' trees side by side in F64 lanes. Short rows finish their sums this way by groups: each sum()
// on its own was a chain of dependent shuffles and additions, most of a row of 16 elements' time.
inline void sums(const f32v *v, size_t count, double *out) {
    f64x8 eight[kWidth], four[kWidth / 2], two[kWidth / 4];
    for (size_t r = 0; r < kWidth; ++r) {
        eight[r] = r < count ? __builtin_convertvector(lowHalf(v[r]), f64x8) +
                                   __builtin_convertvector(highHalf(v[r]), f64x8)
                             : f64x8{};
    }
    // Lanes i + i + 4 of rows 2k and 2k + 1 (sum's `four`), side by side.
    for (size_t k = 0; k < kWidth / 2; ++k) {
        four[k] = __builtin_shufflevector(eight[2 * k], eight[2 * k + 1], 0, 1, 2, 3, 8, 9, 10, 11) +
                  __builtin_shufflevector(eight[2 * k], eight[2 * k + 1], 4, 5, 6, 7, 12, 13, 14, 15);
    }
    // Lanes i + i + 2 of rows 4k .. 4k + 3 (sum's `two`).
    for (size_t k = 0; k < kWidth / 4; ++k) {
        two[k] = __builtin_shufflevector(four[2 * k], four[2 * k + 1], 0, 1, 4, 5, 8, 9, 12, 13) +
                 __builtin_shufflevector(four[2 * k], four[2 * k + 1], 2, 3, 6, 7, 10, 11, 14, 15);
    }
    // two[0] + two[1] of rows 8k .. 8k + 7.
    for (size_t k = 0; k < kWidth / 8; ++k) {
        const f64x8 one = __builtin_shufflevector(two[2 * k], two[2 * k + 1], 0, 2, 4, 6, 8, 10, 12, 14) +
                          __builtin_shufflevector(two[2 * k], two[2 * k + 1], 1, 3, 5, 7, 9, 11, 13, 15);
        for (size_t r = 0; r < 8 && 8 * k + r < count; ++r) out[8 * k + r] = one[r];
    }
}

// The lane sums of `count` (at most kWidth) vectors in F32, side by side: lane r of the result is the sum of
// vector_at(r)'s lanes (0 past count). Halving trees, each level adding two rows' halves in one instruction: for
// short rows (RowBlock), where these sums are most of the work and each lane holds at most 8 elements, so that F32
// across the lanes is what a longer row's F32 lanes do within a chunk.
template <typename VectorAt>
SIMD_INLINE f32v laneSums(size_t count, VectorAt vector_at) {
    f32x8 eight[kWidth], four[kWidth / 2], two[kWidth / 4], one[2];
    for (size_t r = 0; r < kWidth; ++r) {
        if (r < count) {
            const f32v v = vector_at(r);
            eight[r] = lowHalf(v) + highHalf(v);
        } else {
            eight[r] = f32x8{};
        }
    }
    for (size_t k = 0; k < kWidth / 2; ++k) { // rows 2k, 2k + 1: four lanes each
        four[k] = __builtin_shufflevector(eight[2 * k], eight[2 * k + 1], 0, 1, 2, 3, 8, 9, 10, 11) +
                  __builtin_shufflevector(eight[2 * k], eight[2 * k + 1], 4, 5, 6, 7, 12, 13, 14, 15);
    }
    for (size_t k = 0; k < kWidth / 4; ++k) { // rows 4k .. 4k + 3: two each
        two[k] = __builtin_shufflevector(four[2 * k], four[2 * k + 1], 0, 1, 4, 5, 8, 9, 12, 13) +
                 __builtin_shufflevector(four[2 * k], four[2 * k + 1], 2, 3, 6, 7, 10, 11, 14, 15);
    }
    for (size_t k = 0; k < 2; ++k) { // rows 8k .. 8k + 7: one each
        one[k] = __builtin_shufflevector(two[2 * k], two[2 * k + 1], 0, 2, 4, 6, 8, 10, 12, 14) +
                 __builtin_shufflevector(two[2 * k], two[2 * k + 1], 1, 3, 5, 7, 9, 11, 13, 15);
    }
    return joinHalves(one[0], one[1]);
}

// One vector's lanes summed in F32, in laneSums's order (lane i + i + 8, then + 4, + 2, + 1). Where a row's chain of
// sums across lanes bounds its time: sum()'s F64 tree (widening, then adding) is twice as long.
SIMD_INLINE float laneSum(f32v v) {
    typedef float f32x4 __attribute__((vector_size(16)));
    const f32x8 eight = lowHalf(v) + highHalf(v);
    const f32x4 four =
        __builtin_shufflevector(eight, eight, 0, 1, 2, 3) + __builtin_shufflevector(eight, eight, 4, 5, 6, 7);
    return (four[0] + four[2]) + (four[1] + four[3]);
}

// A row's two sums before the additions across lanes: the F32 lanes, and the F32 sums of the elements past the last
// whole vector.
struct RowLanes {
    f32v first, second;
    float tail_first, tail_second;
};

// Sums of two terms over the n elements of a row, chunk by chunk: F32 lanes inside a kChunk-element chunk, F64
// across chunks. vector_terms(j, f32v &first, f32v &second) adds the terms of the vector at j;
// scalar_terms(j, float &first, float &second) those of one element of the last chunk's tail. The vectors of a
// chunk go by pairs to two accumulator pairs, whether the row is reduced on its own (finish) or a pair of vectors
// at a time inside another pass (step, then finish): both give the same bits.
// The terms come from factories, make_vector_terms() and make_scalar_terms(), so that their closures are built in
// place: copied in, GCC stored their captures one at a time and moved them with one 32-byte load, which cannot
// forward from those stores (AVX2: a stall each row, 17 such sites in LayerNorm backward's passes).
template <typename VectorTerms, typename ScalarTerms>
class RowSums {
  public:
    template <typename MakeVectorTerms, typename MakeScalarTerms>
    SIMD_INLINE RowSums(size_t n, MakeVectorTerms &&make_vector_terms, MakeScalarTerms &&make_scalar_terms)
        : n_(n), chunk_end_(n < kChunk ? n : kChunk), vector_terms_(make_vector_terms()),
          scalar_terms_(make_scalar_terms()) {}

    // The next pair of vectors of the current chunk, if one is left.
    SIMD_INLINE SIMD_FLATTEN void step() {
        if (j_ + 2 * kWidth > chunk_end_) return;
        stepPair();
        if (j_ == chunk_end_ && j_ < n_) { // kChunk holds whole pairs
            closeChunk({even_first_ + odd_first_, even_second_ + odd_second_, 0.0f, 0.0f});
        }
    }

    // Everything not stepped yet; the row's sums.
    SIMD_FLATTEN cpu::PairSums finish() {
        for (;;) {
            closeChunk(chunkLanes());
            if (j_ >= n_) return total_;
        }
    }

    // A row of at most kChunk elements (one chunk), nothing stepped: its lanes, which finishRows sums across with
    // other rows' to the bits finish() gives.
    SIMD_FLATTEN RowLanes lanes() { return chunkLanes(); }

  private:
    SIMD_INLINE void stepPair() {
        vector_terms_(j_, even_first_, even_second_);
        vector_terms_(j_ + kWidth, odd_first_, odd_second_);
        j_ += 2 * kWidth;
    }

    // The rest of the current chunk, its lanes not summed yet.
    SIMD_INLINE RowLanes chunkLanes() {
        while (j_ + 2 * kWidth <= chunk_end_) stepPair();
        if (j_ + kWidth <= chunk_end_) {
            vector_terms_(j_, even_first_, even_second_);
            j_ += kWidth;
        }
        float tail_first = 0.0f, tail_second = 0.0f;
        for (; j_ < chunk_end_; ++j_) scalar_terms_(j_, tail_first, tail_second);
        return {even_first_ + odd_first_, even_second_ + odd_second_, tail_first, tail_second};
    }

    void closeChunk(const RowLanes &chunk) {
        total_.first += sum(chunk.first) + chunk.tail_first;
        total_.second += sum(chunk.second) + chunk.tail_second;
        even_first_ = even_second_ = odd_first_ = odd_second_ = f32v{};
        chunk_end_ = n_ - chunk_end_ < kChunk ? n_ : chunk_end_ + kChunk;
    }

    size_t n_, j_ = 0, chunk_end_;
    VectorTerms vector_terms_;
    ScalarTerms scalar_terms_;
    f32v even_first_ = {}, even_second_ = {}, odd_first_ = {}, odd_second_ = {}; // by the vector's index in its chunk
    cpu::PairSums total_;
};

template <typename MakeVectorTerms, typename MakeScalarTerms>
RowSums(size_t, MakeVectorTerms &&, MakeScalarTerms &&)
    -> RowSums<std::invoke_result_t<MakeVectorTerms &>, std::invoke_result_t<MakeScalarTerms &>>;

// The lanes of up to kWidth one-chunk rows, field by field (so that finishRows reads them in place).
struct BlockLanes {
    f32v first[kWidth], second[kWidth];
    float tail_first[kWidth], tail_second[kWidth];

    SIMD_INLINE void set(size_t r, const RowLanes &lanes) {
        first[r] = lanes.first;
        second[r] = lanes.second;
        tail_first[r] = lanes.tail_first;
        tail_second[r] = lanes.tail_second;
    }
};

// finish() of `count` (at most kWidth) one-chunk rows from their lanes(): the same bits, the additions across lanes
// side by side (sums).
inline void finishRows(const BlockLanes &rows, size_t count, cpu::PairSums *totals) {
    double sum_first[kWidth], sum_second[kWidth];
    sums(rows.first, count, sum_first);
    sums(rows.second, count, sum_second);
    for (size_t r = 0; r < count; ++r) {
        totals[r].first = 0.0 + (sum_first[r] + rows.tail_first[r]); // as finish() adds the chunk to its 0
        totals[r].second = 0.0 + (sum_second[r] + rows.tail_second[r]);
    }
}

// What RowBlock and RowView share, over a block's `vectors` and countOf(j) (the elements of a row's vector j).
template <typename Block>
struct RowParts {
    // A parameter vector's pieces, as the rows' (zero past the end).
    template <typename W>
    SIMD_INLINE void loadVector(const W *v, f32v *pieces) const {
        const Block &block = static_cast<const Block &>(*this);
        for (size_t j = 0; j < block.vectors; ++j) pieces[j] = loadPart(v + j * kWidth, block.countOf(j));
    }

    // Row r's output: out(j) for each of its vectors, stored at y's row r. stream: past the caches (storeStream;
    // y's rows aligned for it, cpu::RowPlan::streams), honoured where the rows are whole vectors; the
    // caller fences (fenceStreams) once it has stored all its rows.
    template <typename T, typename Out>
    SIMD_INLINE void storeRow(T *y, ptrdiff_t y_stride, size_t r, Out out, bool stream = false) const {
        const Block &block = static_cast<const Block &>(*this);
        T *row = y + static_cast<ptrdiff_t>(r) * y_stride;
        if (stream && block.last == kWidth) {
            for (size_t j = 0; j < block.vectors; ++j) storeStream(row + j * kWidth, out(j));
            return;
        }
        for (size_t j = 0; j < block.vectors; ++j) storePart(row + j * kWidth, out(j), block.countOf(j));
    }

    // Fetch row r of the group `rows` rows on (x's rows x_stride apart) into the caches, a line at a time, while this
    // group's outputs are stored (harmless past x's end: a prefetch never faults). Where the call streams (x from DRAM
    // too); and for rows longer than a line, where the call's inputs do not fit the caches (`cached`:
    // cpu::RowPlan::cached) or the block is a RowView, whose vectors load one by one as the group's chains of sums
    // reach them, so that without it each group starts waiting on L3 or DRAM. A RowBlock loads its group whole, at
    // once, which the caches serve fast enough.
    // RowBlocks of uncached, unstreamed calls fetching ahead, 2026-12-07, AVX-512 Xeon, 2 threads, A/B in alternating
    // processes, same bits, back to back / each call after a 256 MiB copy: LayerNorm forward BF16 65536x128 0.96-1.01 /
    // 0.82-0.86 of the time, F16 98304x128 1.01 / 0.84, BF16 131072x64 0.96 / 0.96, BF16 65536x100 1.02 / 0.85, F32
    // 131072x40 0.87 / 0.88; RMSNorm forward BF16 65536x128 0.93 / 0.84, F16 65536x64 0.81-0.82 / 0.95, F32 131072x24
    // 0.91 / 0.89; the AVX2 kernels, LayerNorm BF16 65536x128 0.96 / 0.86, RMSNorm F16 65536x64 0.91 / 0.89.
    // Unstreamed F32 rows of 32-128 fetching ahead, 2026-12-07, AVX-512 Xeon, 2 threads, A/B in alternating processes,
    // same bits, back to back / each call after a 256 MiB copy: LayerNorm forward 8192x128 0.96-1.00 / 0.83-0.93 of the
    // time, 32768x32 0.87 / 0.93, 16384x64 1.00-1.07 / 0.91-0.94, 65536x64 0.98 / 0.92; RMSNorm forward 8192x128
    // 0.95-0.99 / 0.98-1.00, 65536x64 0.99 / 0.92; the AVX2 kernels on the same machine, LayerNorm 8192x128 0.95 /
    // 0.84, 16384x64 0.84 / 0.86. Not rows of a line (F32 rows of 16), which the hardware prefetchers follow: LayerNorm
    // 65536x16 0.99 / 0.99, 131072x16 1.03 / 1.03, AVX2 0.99 / 1.09. Nor RowBlocks in the caches: BF16 16384x128
    // 1.02-1.10x as long back to back, F16 2048x128 1.06x.
    template <typename T>
    SIMD_INLINE void fetchAhead(bool stream, bool cached, const T *x, ptrdiff_t x_stride, size_t rows,
                                size_t r) const {
        const Block &block = static_cast<const Block &>(*this);
        const size_t row_bytes = block.vectors * kWidth * sizeof(T);
        if (!stream && !(row_bytes > kLineBytes && (Block::kReadsInPlace || !cached))) return;
        const char *row = reinterpret_cast<const char *>(x + static_cast<ptrdiff_t>(rows + r) * x_stride);
        for (size_t line = 0; line < row_bytes; line += kLineBytes) __builtin_prefetch(row + line);
    }
};

// Up to kWidth short rows of at most kVectors vectors each, loaded once, for kernels that take such a group whole
// (its rows' sums side by side, laneSums, then their outputs from these registers). kVectors 1: the compiler drops
// the loops over a row's vectors.
template <size_t kVectors>
struct RowBlock : RowParts<RowBlock<kVectors>> {
    static constexpr size_t kVectorsMost = kVectors; // as RowView's
    static constexpr bool kReadsInPlace = false;      // loaded whole by the constructor (fetchAhead)
    size_t vectors, last;            // vectors a row; elements of the last one
    f32v values[kWidth][kVectors];   // the last vector zero past the row's end

    template <typename T>
    SIMD_INLINE RowBlock(size_t rows, size_t n, const T *x, ptrdiff_t x_stride)
        : vectors(kVectors == 1 ? 1 : (n + kWidth - 1) / kWidth), last(n - (vectors - 1) * kWidth) {
        for (size_t r = 0; r < rows; ++r) {
            const T *row = x + static_cast<ptrdiff_t>(r) * x_stride;
            for (size_t j = 0; j + 1 < vectors; ++j) values[r][j] = load(row + j * kWidth);
            values[r][vectors - 1] = loadPart(row + (vectors - 1) * kWidth, last);
        }
    }

    SIMD_INLINE f32v value(size_t r, size_t j) const { return values[r][j]; }

    SIMD_INLINE size_t countOf(size_t j) const { return j + 1 < vectors ? kWidth : last; }
};

// RowBlock's interface over F32 rows of whole vectors, read where they lie (each vector from L1 after its first
// load) rather than copied to the stack: the copy is a store and a load per vector that F32 needs no widening to
// justify (LayerNorm forward F32, 2 threads, A/B in alternating processes, calls back to back: 32768x32 0.76 of the
// time, 16384x64 0.82-0.90, 8192x128 0.89, 1048576x16 0.91; after a 256 MiB copy level, rows of 16 0.89).
template <size_t kVectors>
struct RowView : RowParts<RowView<kVectors>> {
    static constexpr size_t kVectorsMost = kVectors;
    static constexpr bool kReadsInPlace = true;
    static constexpr size_t last = kWidth;
    size_t vectors;
    const float *x;
    ptrdiff_t x_stride;

    SIMD_INLINE RowView(size_t, size_t n, const float *x, ptrdiff_t x_stride)
        : vectors(n / kWidth), x(x), x_stride(x_stride) {}

    SIMD_INLINE f32v value(size_t r, size_t j) const {
        return load(x + static_cast<ptrdiff_t>(r) * x_stride + j * kWidth);
    }

    SIMD_INLINE size_t countOf(size_t) const { return kWidth; } // so RowParts' loadPart/storePart are plain
};

// body(std::integral_constant<size_t, K>{}) with K the RowBlock size for rows of n (at most cpu::kBlockRowsMaxDim)
// elements: rows of one vector, of up to 4 and of up to 8 apart (LayerNorm F32, 2 threads, after a 256 MiB copy:
// with the loops over a row's vectors left in, rows of 16 took 1.17x as long; rows of 64 as 8 vectors, 1.1x).
template <typename Body>
SIMD_INLINE void withRowBlockSize(size_t n, Body &&body) {
    static_assert(cpu::kBlockRows == kWidth && cpu::kBlockRowsMaxDim == 8 * kWidth, "a lane per row, 8 vectors");
    if (n <= kWidth) return body(std::integral_constant<size_t, 1>{});
    if (n <= 4 * kWidth) return body(std::integral_constant<size_t, 4>{});
    return body(std::integral_constant<size_t, 8>{});
}

// body(tag) with tag's ::type the block for rows of n elements of T (withRowBlockSize's sizes): a RowView where T is
// F32 and the rows are whole vectors, else a RowBlock.
template <typename T, typename Body>
SIMD_INLINE void withRowBlock(size_t n, Body &&body) {
    withRowBlockSize(n, [&](auto vectors) SIMD_LAMBDA_INLINE {
        constexpr size_t kVectors = decltype(vectors)::value;
        if constexpr (std::is_same_v<T, float>) {
            if (n % kWidth == 0) return body(std::common_type<RowView<kVectors>>{});
        }
        body(std::common_type<RowBlock<kVectors>>{});
    });
}

// Brings a row's two inputs into L2, the lines of a pair of vectors per step: a row ahead of the reduction that
// will read them, so that their DRAM latency hides behind a whole row of work (measured 10-20% faster on rows
// of 4096, F32 and BF16).
template <typename T>
class RowFetch {
  public:
    RowFetch(const T *a, const T *b) : a_(reinterpret_cast<const char *>(a)), b_(reinterpret_cast<const char *>(b)) {}

    SIMD_INLINE void step() {
        for (size_t line = 0; line < 2 * kWidth * sizeof(T); line += kLineBytes) {
            __builtin_prefetch(a_ + offset_ + line, 0, 1);
            __builtin_prefetch(b_ + offset_ + line, 0, 1);
        }
        offset_ += 2 * kWidth * sizeof(T);
    }

  private:
    const char *a_, *b_;
    size_t offset_ = 0;
};

// Runs a row's elementwise pass, pass(side_work), with the side work its hints ask for: reducing the next row
// (row_sums_of(a, b) gives that row's RowSums) and fetching the one after. Returns the next row's sums ({} if none).
template <typename T, typename RowSumsOf, typename Pass>
SIMD_ALONGSIDE_FLATTEN inline cpu::PairSums passAlongside(const cpu::RowHints<T> &hints, RowSumsOf &&row_sums_of,
                                                           Pass &&pass) {
    if (hints.next_a == nullptr) {
        pass(NoSideWork{});
        return {};
    }
    auto next = row_sums_of(hints.next_a, hints.next_b);
    if (hints.fetch_a == nullptr) {
        pass([&next] { next.step(); });
    } else {
        RowFetch<T> fetch(hints.fetch_a, hints.fetch_b);
        pass([&] {
            next.step();
            fetch.step();
        });
    }
    return next.finish();
}

} // namespace simd
} // namespace

#endif
