// F16 / BF16 storage as raw bits, conversions to and from the compute type (round to nearest even), 16-byte
// vector loads, and the dtype pairs the kernels are built for.
#ifndef INFINI_DEVICES_NVIDIA_TYPES_CUH
#define INFINI_DEVICES_NVIDIA_TYPES_CUH

#include "infinicore.h"

#include <cstdint>
#include <type_traits>
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

// What sums and coefficients are computed in: F32 for F16/BF16/F32 data, F64 for F64 (as on the CPU).
template <typename T>
using ComputeOf = std::conditional_t<std::is_same_v<T, double>, double, float>;

// A kernel's dynamic shared memory (the launch's third argument) as T[]; the CPU emulation keeps it per CTA.
template <typename T>
__device__ __forceinline__ T *dynamicShared() {
#if defined(__CUDACC__)
    extern __shared__ __align__(16) unsigned char dynamic_shared_bytes[];
    return reinterpret_cast<T *>(dynamic_shared_bytes);
#else
    return emu::dynamicShared<T>();
#endif
}

// A stored value in its compute type (exact).
__device__ __forceinline__ float widen(float value) { return value; }
__device__ __forceinline__ double widen(double value) { return value; }
__device__ __forceinline__ float widen(f16_t value) { return __half2float(__ushort_as_half(value.bits)); }
__device__ __forceinline__ float widen(bf16_t value) {
    return __uint_as_float(static_cast<uint32_t>(value.bits) << 16);
}

// A compute-type value stored as T (F16/BF16 round to nearest even).
template <typename T>
__device__ __forceinline__ T narrow(ComputeOf<T> value) {
    if constexpr (std::is_same_v<T, f16_t>) {
        return f16_t{__half_as_ushort(__float2half_rn(value))};
    } else if constexpr (std::is_same_v<T, bf16_t>) {
        return bf16_t{__bfloat16_as_ushort(__float2bfloat16_rn(value))};
    } else {
        return value;
    }
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

// out[0..V) = p[0..V) widened; p must be 16-byte aligned when V > 1.
template <int V, typename T>
__device__ __forceinline__ void loadValues(const T *p, ComputeOf<T> *out) {
    if constexpr (V == 1) {
        out[0] = widen(p[0]);
    } else {
        Packet<T, V> packet;
        packet.raw = *reinterpret_cast<const uint4 *>(p);
#pragma unroll
        for (int v = 0; v < V; ++v) out[v] = widen(packet.values[v]);
    }
}

template <int V, typename T>
__device__ __forceinline__ void storeValues(T *p, const ComputeOf<T> *in) {
    if constexpr (V == 1) {
        p[0] = narrow<T>(in[0]);
    } else {
        Packet<T, V> packet;
#pragma unroll
        for (int v = 0; v < V; ++v) packet.values[v] = narrow<T>(in[v]);
        *reinterpret_cast<uint4 *>(p) = packet.raw;
    }
}

// V elements starting at column `col` of a row of length dim, zero past the end: one vector load when the
// whole vector is inside the row and `vectors` (the row's vectors are 16-byte aligned), else element by element.
template <int V, typename T>
__device__ __forceinline__ void loadSpan(const T *row, size_t col, size_t dim, ComputeOf<T> *out, bool vectors = true) {
    if (V > 1 && vectors && col + V <= dim) {
        loadValues<V>(row + col, out);
        return;
    }
#pragma unroll
    for (int v = 0; v < V; ++v) out[v] = col + v < dim ? widen(row[col + v]) : ComputeOf<T>(0);
}

template <int V, typename T>
__device__ __forceinline__ void storeSpan(T *row, size_t col, size_t dim, const ComputeOf<T> *in, bool vectors = true) {
    if (V > 1 && vectors && col + V <= dim) {
        storeValues<V>(row + col, in);
        return;
    }
#pragma unroll
    for (int v = 0; v < V; ++v) {
        if (col + v < dim) row[col + v] = narrow<T>(in[v]);
    }
}

// body(T{}, W{}): T the data's storage type, W the parameters' (T, or float for F16/BF16 data with F32
// parameters); the pairs of the Ex dtype rule (common/layout.h), checked by info.h.
template <typename Body>
auto withDataAndParameterTypes(infiniDtype_t dtype, infiniDtype_t parameter_dtype, Body &&body) {
    const bool f32_parameters = parameter_dtype == INFINI_DTYPE_F32;
    switch (dtype) {
    case INFINI_DTYPE_F64: return body(double{}, double{});
    case INFINI_DTYPE_F16: return f32_parameters ? body(f16_t{}, float{}) : body(f16_t{}, f16_t{});
    case INFINI_DTYPE_BF16: return f32_parameters ? body(bf16_t{}, float{}) : body(bf16_t{}, bf16_t{});
    default: return body(float{}, float{});
    }
}

inline bool aligned16(const void *p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

} // namespace nvidia

#endif
