// F16/BF16 rows as raw 16-byte vectors (8 elements each), widened only where a kernel computes with them: what
// the packed row kernels of the forwards and the backwards share. Raw words keep a thread's share of a row in 4
// registers a vector where widened values took 8. F32 rows take the same 8 elements a thread as two 16-byte vectors
// (PackedF32; nothing to widen), so one kernel serves both.
#ifndef INFINI_DEVICES_NVIDIA_PACKED_CUH
#define INFINI_DEVICES_NVIDIA_PACKED_CUH

#include "nvidia_reduce.cuh"
#include "nvidia_types.cuh"

#include <cfloat>
#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace nvidia {

constexpr int kPackedItems = 8; // elements of one vector: 16 bytes of 16-bit values

// A thread's kPackedItems elements as loaded: one uint4 of 16-bit values, or two float4 of F32 ones.
struct PackedF32 {
    float4 low, high;
};
template <typename T>
using Packed = std::conditional_t<std::is_same_v<T, float>, PackedF32, uint4>;

// Threads for a row of `dim` at one vector a thread, in whole warps.
inline int packedThreads(size_t dim) {
    return static_cast<int>((dim + 32 * kPackedItems - 1) / (32 * kPackedItems) * 32);
}

// A short row on part of a warp: `lanes` a row, the fewest of 4, 8, 16 and 32 whose 16-byte vectors hold it, one
// vector a lane; past 32 vectors a whole warp and `vectors` a lane (2 up to rows of 512, the longest so planned).
// The forwards' short rows and the backwards' warp rows take the same groups. vectors 0: no such plan.
struct LaneGroups {
    int lanes = 0, vectors = 0;
    static LaneGroups of(size_t dim) {
        const size_t needed = (dim + kPackedItems - 1) / kPackedItems; // vectors of the row
        if (needed > 32) return LaneGroups{32, static_cast<int>((needed + 31) / 32)};
        int lanes = 4;
        while (static_cast<size_t>(lanes) < needed) lanes *= 2;
        return LaneGroups{lanes, 1};
    }
};

// Calls body(G, K), each a std::integral_constant, with the kernel template arguments of `groups` (vectors 1 or 2).
template <typename Body>
decltype(auto) withLaneGroups(LaneGroups groups, Body &&body) {
    using std::integral_constant;
    if (groups.vectors > 1) return body(integral_constant<int, 32>{}, integral_constant<int, 2>{});
    switch (groups.lanes) {
    case 4: return body(integral_constant<int, 4>{}, integral_constant<int, 1>{});
    case 8: return body(integral_constant<int, 8>{}, integral_constant<int, 1>{});
    case 16: return body(integral_constant<int, 16>{}, integral_constant<int, 1>{});
    default: return body(integral_constant<int, 32>{}, integral_constant<int, 1>{});
    }
}

// A vector's 32-bit word i: two elements, the lower address in the low half. Raw bits and shifts, not a union of
// 16-bit values, which put the vectors in local memory (a 32-byte stack frame and 56 bytes of spills).
__device__ __forceinline__ uint32_t wordOf(uint4 v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }

// The two elements of a word, widened; and two values narrowed into a word (round to nearest even).
__device__ __forceinline__ float2 widenWord(bf16_t, uint32_t word) {
    return make_float2(__uint_as_float(word << 16), __uint_as_float(word & 0xffff0000u));
}
__device__ __forceinline__ float2 widenWord(f16_t, uint32_t word) {
    return make_float2(widen(f16_t{static_cast<uint16_t>(word & 0xffffu)}),
                       widen(f16_t{static_cast<uint16_t>(word >> 16)}));
}
template <typename T>
__device__ __forceinline__ uint32_t narrowWord(float low, float high) {
    return narrow<T>(low).bits | static_cast<uint32_t>(narrow<T>(high).bits) << 16;
}

template <typename T>
__device__ __forceinline__ Packed<T> loadPacked(const T *row, size_t col, size_t dim, bool vectors) {
    if constexpr (std::is_same_v<T, float>) {
        if (vectors && col + kPackedItems <= dim) {
            const float4 *v = reinterpret_cast<const float4 *>(row + col);
            return PackedF32{v[0], v[1]};
        }
        float e[kPackedItems];
#pragma unroll
        for (int i = 0; i < kPackedItems; ++i) e[i] = col + i < dim ? row[col + i] : 0.f;
        return PackedF32{make_float4(e[0], e[1], e[2], e[3]), make_float4(e[4], e[5], e[6], e[7])};
    } else {
        if (vectors && col + kPackedItems <= dim) return *reinterpret_cast<const uint4 *>(row + col);
        uint32_t words[kPackedItems / 2];
#pragma unroll
        for (int i = 0; i < kPackedItems / 2; ++i) {
            const size_t c = col + 2 * i;
            words[i] = (c < dim ? row[c].bits : 0u) | (c + 1 < dim ? static_cast<uint32_t>(row[c + 1].bits) << 16 : 0u);
        }
        return make_uint4(words[0], words[1], words[2], words[3]);
    }
}

template <typename T>
__device__ __forceinline__ void unpack(Packed<T> raw, ComputeOf<T> *out) {
    if constexpr (std::is_same_v<T, float>) {
        const float4 low = raw.low, high = raw.high;
        out[0] = low.x, out[1] = low.y, out[2] = low.z, out[3] = low.w;
        out[4] = high.x, out[5] = high.y, out[6] = high.z, out[7] = high.w;
    } else {
#pragma unroll
        for (int i = 0; i < kPackedItems / 2; ++i) {
            const float2 pair = widenWord(T{}, wordOf(raw, i));
            out[2 * i] = pair.x;
            out[2 * i + 1] = pair.y;
        }
    }
}

template <typename T>
__device__ __forceinline__ void storePacked(T *row, size_t col, size_t dim, bool vectors, const ComputeOf<T> *in) {
    if constexpr (std::is_same_v<T, float>) {
        if (vectors && col + kPackedItems <= dim) {
            float4 *v = reinterpret_cast<float4 *>(row + col);
            v[0] = make_float4(in[0], in[1], in[2], in[3]);
            v[1] = make_float4(in[4], in[5], in[6], in[7]);
            return;
        }
#pragma unroll
        for (int i = 0; i < kPackedItems; ++i) {
            if (col + i < dim) row[col + i] = in[i];
        }
    } else {
        uint32_t words[kPackedItems / 2];
#pragma unroll
        for (int i = 0; i < kPackedItems / 2; ++i) {
            words[i] = narrowWord<T>(in[2 * i], in[2 * i + 1]);
        }
        if (vectors && col + kPackedItems <= dim) {
            *reinterpret_cast<uint4 *>(row + col) = make_uint4(words[0], words[1], words[2], words[3]);
            return;
        }
#pragma unroll
        for (int i = 0; i < kPackedItems / 2; ++i) {
            const size_t c = col + 2 * i;
            if (c < dim) row[c].bits = static_cast<uint16_t>(words[i] & 0xffffu);
            if (c + 1 < dim) row[c + 1].bits = static_cast<uint16_t>(words[i] >> 16);
        }
    }
}

// Sum over each aligned group of Lanes lanes of the warp (the whole warp by default) by a xor butterfly, in F32: every
// lane of a group ends with the same bits (IEEE addition commutes). Every lane of the warp must call it.
template <int Lanes = 32>
__device__ __forceinline__ float2 warpAllSum(float2 value) {
    static_assert(Lanes >= 1 && Lanes <= 32 && (Lanes & (Lanes - 1)) == 0, "a power of two up to a warp");
#pragma unroll
    for (int mask = Lanes / 2; mask > 0; mask /= 2) {
        value.x += __shfl_xor_sync(kFullMask, value.x, mask);
        value.y += __shfl_xor_sync(kFullMask, value.y, mask);
    }
    return value;
}

// The shared slots of a packed kernel's CTA sums, [parity][warp]: each warp's sum goes to its slot, then after one
// barrier every warp adds all of them in one order; consecutive sums alternate the parity, so a slot is rewritten
// only past the next barrier, which every reader of it has passed.
using CtaSumSlots = float2[2][32];

// 1 / sqrt(mean_square + epsilon), in the type the kernel keeps its statistics in. In F32 (the packed kernels') an
// epsilon below F32's normal range would vanish, so a row of zeros would get 1/sqrt(0) = inf and outputs of 0 * inf:
// where F32 cannot hold the sum, it is taken in F64, as the other kernels take it.
__device__ __forceinline__ float rstdOfMeanSquare(float mean_square, double epsilon) {
    const float sum = mean_square + static_cast<float>(epsilon);
    return sum >= FLT_MIN ? 1.0f / sqrtf(sum)
                          : static_cast<float>(1.0 / sqrt(static_cast<double>(mean_square) + epsilon));
}
__device__ __forceinline__ double rstdOfMeanSquare(double mean_square, double epsilon) {
    return 1.0 / sqrt(mean_square + epsilon);
}

} // namespace nvidia

#endif
