// F16 / BF16 storage as raw bits, conversions through float (round to nearest even), 16-byte vector loads.
#ifndef INFINI_DEVICES_NVIDIA_TYPES_CUH
#define INFINI_DEVICES_NVIDIA_TYPES_CUH

#include "infinicore.h"

#include <cstdint>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace nvidia {

// Plain structs, so they fit in unions and copy as bits.
struct f16_t {
    uint16_t bits;
};
struct bf16_t {
    uint16_t bits;
};

__device__ __forceinline__ float toFloat(float value) { return value; }
__device__ __forceinline__ float toFloat(f16_t value) { return __half2float(__ushort_as_half(value.bits)); }
__device__ __forceinline__ float toFloat(bf16_t value) {
    return __uint_as_float(static_cast<uint32_t>(value.bits) << 16); // exact
}

template <typename T>
__device__ __forceinline__ T fromFloat(float value);
template <>
__device__ __forceinline__ float fromFloat<float>(float value) {
    return value;
}
template <>
__device__ __forceinline__ f16_t fromFloat<f16_t>(float value) {
    return f16_t{__half_as_ushort(__float2half_rn(value))};
}
template <>
__device__ __forceinline__ bf16_t fromFloat<bf16_t>(float value) {
    return bf16_t{__bfloat16_as_ushort(__float2bfloat16_rn(value))};
}

// Elements of T in one 16-byte vector.
template <typename T>
constexpr int kVec = 16 / sizeof(T);

template <typename T, int V>
union Packet {
    static_assert(sizeof(T) * V == 16, "a packet is 16 bytes");
    uint4 raw;
    T values[V];
};

// out[0..V) = p[0..V) as float; p must be 16-byte aligned when V > 1.
template <int V, typename T>
__device__ __forceinline__ void loadFloats(const T *p, float *out) {
    if constexpr (V == 1) {
        out[0] = toFloat(p[0]);
    } else {
        Packet<T, V> packet;
        packet.raw = *reinterpret_cast<const uint4 *>(p);
#pragma unroll
        for (int v = 0; v < V; ++v) out[v] = toFloat(packet.values[v]);
    }
}

template <int V, typename T>
__device__ __forceinline__ void storeFloats(T *p, const float *in) {
    if constexpr (V == 1) {
        p[0] = fromFloat<T>(in[0]);
    } else {
        Packet<T, V> packet;
#pragma unroll
        for (int v = 0; v < V; ++v) packet.values[v] = fromFloat<T>(in[v]);
        *reinterpret_cast<uint4 *>(p) = packet.raw;
    }
}

// V elements starting at column `col` of a row of length dim, zero past the end: one vector load when the
// whole vector is inside the row, else element by element.
template <int V, typename T>
__device__ __forceinline__ void loadSpan(const T *row, size_t col, size_t dim, float *out) {
    if (V > 1 && col + V <= dim) {
        loadFloats<V>(row + col, out);
        return;
    }
#pragma unroll
    for (int v = 0; v < V; ++v) out[v] = col + v < dim ? toFloat(row[col + v]) : 0.0f;
}

template <int V, typename T>
__device__ __forceinline__ void storeSpan(T *row, size_t col, size_t dim, const float *in) {
    if (V > 1 && col + V <= dim) {
        storeFloats<V>(row + col, in);
        return;
    }
#pragma unroll
    for (int v = 0; v < V; ++v) {
        if (col + v < dim) row[col + v] = fromFloat<T>(in[v]);
    }
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

inline bool aligned16(const void *p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

} // namespace nvidia

#endif
