// F16 / BF16 storage types and their conversions to and from float (round to nearest even).
#ifndef INFINI_DEVICES_CPU_HALF_H
#define INFINI_DEVICES_CPU_HALF_H

#include "infinicore.h"

#include <cstdint>
#include <cstring>

namespace cpu {

struct f16_t {
    uint16_t bits;
};
struct bf16_t {
    uint16_t bits;
};

// Internal linkage: the per-ISA kernel files include this too, and must not share out-of-line copies.
namespace {

inline float toFloat(float value) { return value; }

inline float toFloat(f16_t value) {
    _Float16 half;
    std::memcpy(&half, &value.bits, sizeof half);
    return static_cast<float>(half);
}

inline float toFloat(bf16_t value) {
    uint32_t bits = static_cast<uint32_t>(value.bits) << 16;
    float result;
    std::memcpy(&result, &bits, sizeof result);
    return result;
}

template <typename T>
T fromFloat(float value);

template <>
inline float fromFloat<float>(float value) {
    return value;
}

template <>
inline f16_t fromFloat<f16_t>(float value) {
    _Float16 half = static_cast<_Float16>(value);
    f16_t result;
    std::memcpy(&result.bits, &half, sizeof half);
    return result;
}

template <>
inline bf16_t fromFloat<bf16_t>(float value) {
    uint32_t bits;
    std::memcpy(&bits, &value, sizeof bits);
    if ((bits & 0x7f800000u) == 0x7f800000u && (bits & 0x007fffffu) != 0) {
        return bf16_t{static_cast<uint16_t>((bits >> 16) | 0x0040u)}; // keep NaN a (quiet) NaN
    }
    bits += 0x7fffu + ((bits >> 16) & 1u); // round to nearest, ties to even
    return bf16_t{static_cast<uint16_t>(bits >> 16)};
}

// Calls body(T{}) with T the storage type of a norm dtype (F16, F32 or BF16; checked by info.h).
template <typename Body>
auto withNormFloat(infiniDtype_t dtype, Body &&body) {
    switch (dtype) {
    case INFINI_DTYPE_F16: return body(f16_t{});
    case INFINI_DTYPE_BF16: return body(bf16_t{});
    default: return body(float{});
    }
}

} // namespace
} // namespace cpu

#endif
