// Deterministic reductions: fixed trees whose order depends only on the block shape, never on timing.
#ifndef INFINI_DEVICES_NVIDIA_REDUCE_CUH
#define INFINI_DEVICES_NVIDIA_REDUCE_CUH

#include <cuda_runtime.h>

namespace nvidia {

constexpr unsigned kFullMask = 0xffffffffu;

__device__ __forceinline__ double2 add(double2 a, double2 b) { return make_double2(a.x + b.x, a.y + b.y); }

// Sum over the warp, valid in lane 0 only (a fixed halving tree).
__device__ __forceinline__ double2 warpSumToLane0(double2 value) {
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) {
        value.x += __shfl_down_sync(kFullMask, value.x, offset);
        value.y += __shfl_down_sync(kFullMask, value.y, offset);
    }
    return value;
}

__device__ __forceinline__ double warpSumToLane0(double value) {
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) value += __shfl_down_sync(kFullMask, value, offset);
    return value;
}

// Sum over the warp, the same bits in every lane.
__device__ __forceinline__ double2 warpSum(double2 value) {
    value = warpSumToLane0(value);
    return make_double2(__shfl_sync(kFullMask, value.x, 0), __shfl_sync(kFullMask, value.y, 0));
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024), the same bits in every thread.
// Every thread of the block must call it; `scratch` holds 33 entries and may be reused right after.
__device__ __forceinline__ double2 blockSum(double2 value, double2 *scratch) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
    value = warpSumToLane0(value);
    if (lane == 0) scratch[warp] = value;
    __syncthreads();
    if (warp == 0) {
        value = warpSumToLane0(lane < warps ? scratch[lane] : make_double2(0.0, 0.0));
        if (lane == 0) scratch[32] = value;
    }
    __syncthreads();
    double2 total = scratch[32];
    __syncthreads(); // scratch is free again
    return total;
}

// Offsets of rows laid out as (outer, inner) leading dims with arbitrary (also negative or zero) strides.
struct RowOffsets {
    size_t inner;
    ptrdiff_t outer_stride, inner_stride;

    __device__ __forceinline__ ptrdiff_t operator()(size_t row) const {
        return static_cast<ptrdiff_t>(row / inner) * outer_stride + static_cast<ptrdiff_t>(row % inner) * inner_stride;
    }
};

} // namespace nvidia

#endif
