// CUDA kernels shared by the row-normalizing forwards (RMSNorm; LayerNorm, which also centres the row). Per row:
// reduce, turn the sums into the row's statistics, write y (and the statistics where wanted).
//  - Rows of D <= kMaxGroup * kItems: a group of G threads (a warp, or a whole CTA) holds the row in registers
//    between its reductions and its output, so x is read from DRAM once and y written once. Each thread keeps the
//    same columns for every row it takes, so it loads w (and b) once.
//  - Packed (F16/BF16/F32 rows of kMinPackedDim..kMaxPackedDim): a CTA a row, each thread 8 elements of it as loaded
//    (one 16-byte vector of raw 16-bit values, or two of F32; past kMaxOneVectorDim twice that), the CTA's next row
//    already loading. Shorter rows: 4-32 lanes of a warp a row, in the same vectors (packedShortRowsKernel).
//  - Longer rows: a CTA of kMaxGroup threads per row, reading the row again from L2 for each reduction and for
//    the output.
// Reductions are fixed trees in the compute type (F32, F64 for F64 data): results do not depend on timing. Nor on
// the call a row is in: which kernel takes a row, and which thread each element, depend on its dtype and length
// alone. Rows of any layout and alignment take the same kernel, with vector loads where their rows are 16-byte
// aligned and element by element where not, into the same registers (tests/test_determinism.py).
#ifndef INFINIOP_OPS_ROW_FORWARD_NVIDIA_CUH
#define INFINIOP_OPS_ROW_FORWARD_NVIDIA_CUH

#include "common/moments.h"
#include "common/status.h"
#include "devices/nvidia/nvidia_packed.cuh"
#include "devices/nvidia/nvidia_status.h"
#include "devices/nvidia/nvidia_types.cuh"
#include "ops/rows.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>

namespace op::row_forward {

using nvidia::ComputeOf;
using nvidia::CtaSumSlots;

constexpr int kItems = 16;     // elements of a row held per thread
constexpr int kMaxGroup = 1024; // threads per row, at most
constexpr size_t kMaxRegisterDim = static_cast<size_t>(kMaxGroup) * kItems;
constexpr int kWarpCta = 128;  // a CTA of warp-sized groups: four rows at a time

// One call, untyped; what an op's calculate fills in. NULL pointers: not wanted (w, b: ones, zeros).
struct RowCall {
    void *y;
    void *xhat;               // LayerNorm's seed output: (x - mean) * rstd, of the data type
    void *mean, *stat;        // per row, of the statistics type: the mean, and rstd (or std where stat_is_std)
    const void *x, *w, *b;
    RowLayout y_rows, xhat_rows, x_rows, mean_rows, stat_rows;
    ptrdiff_t w_stride, b_stride;
    double epsilon;
    bool stat_is_std; // write sqrt(var + eps) instead of its inverse (the seed LayerNorm's std)
};

// Typed: T the data, W the parameters, S the statistics' storage.
template <typename T, typename W, typename S>
struct Args {
    T *y, *xhat;
    S *mean, *stat;
    const T *x;
    const W *w, *b;
    RowLayout y_rows, xhat_rows, x_rows, mean_rows, stat_rows;
    ptrdiff_t w_stride, b_stride;
    size_t rows, dim;
    double epsilon;
    bool stat_is_std;
};

// w and b at column `col` as a kernel computing in C takes them: 1 and 0 where the op has none or col is past the
// row's end (in_row false).
template <typename C, typename T, typename W, typename S>
__device__ __forceinline__ C weightAt(const Args<T, W, S> &args, ptrdiff_t col, bool in_row) {
    return in_row && args.w != nullptr ? static_cast<C>(nvidia::widen(args.w[col * args.w_stride])) : C(1);
}
template <typename C, typename T, typename W, typename S>
__device__ __forceinline__ C biasAt(const Args<T, W, S> &args, ptrdiff_t col, bool in_row) {
    return in_row && args.b != nullptr ? static_cast<C>(nvidia::widen(args.b[col * args.b_stride])) : C(0);
}

template <typename S>
__device__ __forceinline__ S storeAs(double value) {
    if constexpr (std::is_same_v<S, float> || std::is_same_v<S, double>) {
        return static_cast<S>(value);
    } else {
        return nvidia::narrow<S>(static_cast<float>(value));
    }
}

// Two sums over a group of G threads, the same bits in every thread of the group: a warp's halving tree to lane
// 0, then (G > 32, where the group is the whole CTA) lane 0s through shared memory. `scratch`: 66 entries.
template <int G, typename C>
__device__ __forceinline__ void groupSums(C &a, C &b, C *scratch) {
#pragma unroll
    for (int offset = 16; offset > 0; offset /= 2) {
        a += __shfl_down_sync(0xffffffffu, a, offset);
        b += __shfl_down_sync(0xffffffffu, b, offset);
    }
    if constexpr (G == 32) {
        a = __shfl_sync(0xffffffffu, a, 0);
        b = __shfl_sync(0xffffffffu, b, 0);
    } else {
        const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
        if (lane == 0) {
            scratch[2 * warp] = a;
            scratch[2 * warp + 1] = b;
        }
        __syncthreads();
        if (warp == 0) {
            C ta = lane < G / 32 ? scratch[2 * lane] : C(0), tb = lane < G / 32 ? scratch[2 * lane + 1] : C(0);
#pragma unroll
            for (int offset = 16; offset > 0; offset /= 2) {
                ta += __shfl_down_sync(0xffffffffu, ta, offset);
                tb += __shfl_down_sync(0xffffffffu, tb, offset);
            }
            if (lane == 0) {
                scratch[64] = ta;
                scratch[65] = tb;
            }
        }
        __syncthreads();
        a = scratch[64];
        b = scratch[65];
        __syncthreads(); // scratch is free again
    }
}

template <int G, typename C>
__device__ __forceinline__ C groupSum(C value, C *scratch) {
    C unused = 0;
    groupSums<G>(value, unused, scratch);
    return value;
}

// A mean held as two compute-type values (hi + lo), so that x - mean loses nothing to the mean's rounding when
// the mean is large against the spread (e.g. 1e4 + N(0, 1) in F32).
template <typename C>
struct SplitMean {
    C hi, lo;
    __device__ __forceinline__ static SplitMean of(double mean) {
        const C hi = static_cast<C>(mean);
        return {hi, static_cast<C>(mean - static_cast<double>(hi))};
    }
    __device__ __forceinline__ C centre(C x) const { return (x - hi) - lo; }
};

// Centred statistics from a first mean (mean0) and the sums of d = x - mean0 and of d^2 over the row: the
// corrected two-pass formulas, so an inexact mean0 (an F32 sum of a large-mean row) costs nothing.
__device__ __forceinline__ void correctedMoments(double mean0, double sum_d, double sum_d2, size_t dim,
                                                 double *mean, double *variance) {
    const double n = static_cast<double>(dim);
    *mean = mean0 + sum_d / n;
    *variance = biasedVariance(sum_d2 / n, sum_d / n);
}

// The row's statistics from its sums: (mean, rstd), mean 0 where the op does not centre.
struct RowStats {
    double mean, rstd;
};

template <typename T, typename W, typename S>
__device__ __forceinline__ void writeStats(const Args<T, W, S> &args, size_t row, RowStats stats) {
    if (args.mean != nullptr) args.mean[args.mean_rows.offset(row)] = storeAs<S>(stats.mean);
    if (args.stat != nullptr) {
        args.stat[args.stat_rows.offset(row)] = storeAs<S>(args.stat_is_std ? 1.0 / stats.rstd : stats.rstd);
    }
}

__device__ __forceinline__ double rstdOf(double sum_squares, size_t dim, double epsilon) {
    return 1.0 / sqrt(sum_squares / static_cast<double>(dim) + epsilon);
}

// A row's statistics from this thread's values of it: for_each(f) calls f(value, in_row) for each (values past the
// row's end are 0). Centred (LayerNorm): the mean of a first F32 tree sum, then the corrected two-pass moments of
// d = x - that mean; else (RMSNorm) the sum of squares. Every thread of the group gets the same bits.
template <bool kCentres, int G, typename C, typename ForEach>
__device__ __forceinline__ RowStats rowStats(ForEach &&for_each, size_t dim, double epsilon, C *scratch) {
    if constexpr (kCentres) {
        C sum = 0;
        for_each([&](C value, bool) { sum += value; });
        const double mean0 = static_cast<double>(groupSum<G>(sum, scratch)) / static_cast<double>(dim);
        const SplitMean<C> first = SplitMean<C>::of(mean0);
        C sum_d = 0, sum_d2 = 0;
        for_each([&](C value, bool in_row) {
            const C d = in_row ? first.centre(value) : C(0);
            sum_d += d;
            sum_d2 += d * d;
        });
        groupSums<G>(sum_d, sum_d2, scratch);
        RowStats stats;
        double variance;
        correctedMoments(mean0, sum_d, sum_d2, dim, &stats.mean, &variance);
        stats.rstd = 1.0 / sqrt(variance + epsilon);
        return stats;
    } else {
        C squares = 0;
        for_each([&](C value, bool) { squares += value * value; });
        return RowStats{0.0, rstdOf(groupSum<G>(squares, scratch), dim, epsilon)};
    }
}

// Rows in registers (F64, and rows that the packed kernels do not take). CTA threads: G, or kWarpCta for G == 32;
// each group takes rows group, group + groups, ... Thread `lane` holds V-element spans of the row, loaded as one
// vector each where `vectors` (every row 16-byte aligned), else element by element into the same registers.
template <bool kCentres, typename T, typename W, typename S, int G, int V>
__global__ void __launch_bounds__(G == 32 ? kWarpCta : G) rowsInRegistersKernel(Args<T, W, S> args, bool vectors) {
    using C = ComputeOf<T>;
    __shared__ C scratch[66];
    constexpr int kGroups = (G == 32 ? kWarpCta : G) / G;
    const int lane = threadIdx.x % G, group = threadIdx.x / G;
    C w[kItems], b[kItems]; // b: LayerNorm's only (RMSNorm never reads it, and the compiler drops it)
#pragma unroll
    for (int e = 0; e < kItems; ++e) { // this thread's columns, the same in every row
        const size_t col = static_cast<size_t>((e / V) * G + lane) * V + e % V;
        const bool in_row = col < args.dim;
        w[e] = weightAt<C>(args, static_cast<ptrdiff_t>(col), in_row);
        if constexpr (kCentres) b[e] = biasAt<C>(args, static_cast<ptrdiff_t>(col), in_row);
    }
    for (size_t row = static_cast<size_t>(blockIdx.x) * kGroups + group; row < args.rows;
         row += static_cast<size_t>(gridDim.x) * kGroups) {
        // G == 32 groups are warps and never meet at a barrier; larger groups are the whole CTA, whose threads
        // all take the same rows, so every thread reaches groupSum's barriers together.
        C x[kItems];
        const T *x_row = args.x + args.x_rows.offset(row);
#pragma unroll
        for (int k = 0; k < kItems / V; ++k) {
            nvidia::loadSpan<V>(x_row, static_cast<size_t>(k * G + lane) * V, args.dim, x + k * V, vectors);
        }
        const RowStats stats = rowStats<kCentres, G>(
            [&](auto &&f) {
#pragma unroll
                for (int e = 0; e < kItems; ++e) f(x[e], static_cast<size_t>((e / V) * G + lane) * V + e % V < args.dim);
            },
            args.dim, args.epsilon, scratch);
        if (lane == 0) writeStats(args, row, stats);
        const SplitMean<C> mean = SplitMean<C>::of(stats.mean);
        const C r = static_cast<C>(stats.rstd);
#pragma unroll
        for (int e = 0; e < kItems; ++e) x[e] = mean.centre(x[e]) * r; // xhat, in place: fewer live registers
        if (args.xhat != nullptr) {
            T *xhat_row = args.xhat + args.xhat_rows.offset(row);
#pragma unroll
            for (int k = 0; k < kItems / V; ++k) {
                nvidia::storeSpan<V>(xhat_row, static_cast<size_t>(k * G + lane) * V, args.dim, x + k * V, vectors);
            }
        }
#pragma unroll
        for (int e = 0; e < kItems; ++e) {
            if constexpr (kCentres) {
                x[e] = x[e] * w[e] + b[e];
            } else {
                x[e] = x[e] * w[e];
            }
        }
        T *y_row = args.y + args.y_rows.offset(row);
#pragma unroll
        for (int k = 0; k < kItems / V; ++k) {
            nvidia::storeSpan<V>(y_row, static_cast<size_t>(k * G + lane) * V, args.dim, x + k * V, vectors);
        }
    }
}

// Packed rows: F16/BF16/F32 rows of kMinPackedDim..kMaxOneVectorDim elements, of any layout (rowOffset; vector loads
// where `vectors`, every row 16-byte aligned, else element by element into the same registers). A CTA of ceil(D / 8)
// threads (whole warps) takes rows blockIdx.x, + gridDim.x, ...; thread t holds elements [8t, 8t + 8) of a row as
// loaded (nvidia::Packed: one raw 16-byte vector of 16-bit values, or two of F32) and widens them where it
// computes, with its columns of w and b widened in registers once. The CTA's next row is loaded before this row's
// reductions, so it is in flight through them and the stores. A reduction (PackedCtaSum):
// one barrier. RMSNorm makes one a row, LayerNorm two (the first mean, then the sums of d = x - that mean
// and of d^2: the corrected two-pass moments, as the other kernels); the kernel for other rows made two and six
// (F32 LayerNorm ran at 0.43-0.60 of copy on an H200). The sums and statistics are F32 (rstdOfMeanSquare: F64
// only where F32 cannot hold var + eps): every warp computes them, and the backwards' packed kernel (the same form,
// on an H200 2-3.4x their one-pass kernel) lost a quarter of a row's time to F64 there. The mean is kept as its two
// parts (the first mean and the mean of d), so x - mean loses nothing to the mean's rounding.
constexpr size_t kMinPackedDim = 512, kMaxPackedDim = 16384;
constexpr int kMaxPackedThreads = 1024;
constexpr size_t kMaxOneVectorDim = kMaxPackedThreads * nvidia::kPackedItems; // 8192: one vector a thread up to here

// A row's offset in a packed kernel: kFlat where its layout's rows are one stride apart (flatOffset: no division,
// and the registers that the general offset() takes), else offset(), for the rows of any other layout, which then
// sum in the same order as rows one stride apart.
template <bool kFlat>
__device__ __forceinline__ ptrdiff_t rowOffset(const RowLayout &rows, size_t row) {
    if constexpr (kFlat) {
        return flatOffset(rows, row);
    } else {
        return rows.offset(row);
    }
}

// A packed kernel's sums over its CTA (nvidia::CtaSumSlots says how), keeping the slots' parity.
struct PackedCtaSum {
    CtaSumSlots &slots;
    int parity = 0;
    __device__ __forceinline__ float2 operator()(float2 part) {
        const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
        part = nvidia::warpAllSum(part);
        if (lane == 0) slots[parity][warp] = part;
        __syncthreads();
        const float2 total = nvidia::warpAllSum(lane < warps ? slots[parity][lane] : make_float2(0.f, 0.f));
        parity ^= 1;
        return total;
    }
};

// A packed row's statistics, F32: the mean as its two parts (0 where the op does not centre) and rstd.
struct PackedStats {
    float mean_first, mean_rest, rstd;
    __device__ __forceinline__ float xhat(float x) const { return ((x - mean_first) - mean_rest) * rstd; }
};

// The statistics of a row from this thread's elements of it: for_each(f) calls f(value, in_row) for each (values
// past the row's end are 0); row_sum(part) sums a float2 over the row's threads (PackedCtaSum, or a warp's
// butterfly). Centred: the first mean, then the sums of d = x - that mean and of d^2; else the sum of squares. The
// same bits in every thread.
template <bool kCentres, typename ForEach, typename RowSum>
__device__ __forceinline__ PackedStats packedRowStats(ForEach &&for_each, size_t dim, double epsilon,
                                                      RowSum &&row_sum) {
    const float n = static_cast<float>(dim);
    float mean_first = 0.f, mean_rest = 0.f, variance;
    if constexpr (kCentres) {
        float sum = 0.f;
        for_each([&](float value, bool) { sum += value; });
        mean_first = row_sum(make_float2(sum, 0.f)).x / n;
        float sum_d = 0.f, sum_d2 = 0.f;
        for_each([&](float value, bool in_row) {
            const float d = in_row ? value - mean_first : 0.f;
            sum_d += d;
            sum_d2 += d * d;
        });
        const float2 sums = row_sum(make_float2(sum_d, sum_d2));
        mean_rest = sums.x / n;
        variance = sums.y / n - mean_rest * mean_rest;
        variance = variance < 0.f ? 0.f : variance; // NaN stays NaN, as biasedVariance
    } else {
        float squares = 0.f;
        for_each([&](float value, bool) { squares += value * value; });
        variance = row_sum(make_float2(squares, 0.f)).x / n;
    }
    return PackedStats{mean_first, mean_rest, nvidia::rstdOfMeanSquare(variance, epsilon)};
}

// Calls f(value, in_row) for each element of a thread's K vectors of a row as loaded (raw[v]: columns colOf(v) ..).
template <typename T, int K, typename ColOf, typename F>
__device__ __forceinline__ void forEachPacked(const nvidia::Packed<T> (&raw)[K], ColOf colOf, unsigned dim, F &&f) {
#pragma unroll
    for (int v = 0; v < K; ++v) {
        float x[nvidia::kPackedItems];
        nvidia::unpack<T>(raw[v], x);
#pragma unroll
        for (int e = 0; e < nvidia::kPackedItems; ++e) f(x[e], colOf(v) + e < dim);
    }
}

// x = a vector's xhat (raw: as loaded, at columns col ..), also stored into xhat_row where that is wanted.
template <typename T>
__device__ __forceinline__ void packedXhat(nvidia::Packed<T> raw, const PackedStats &stats, T *xhat_row, unsigned col,
                                           unsigned dim, bool vectors, float (&x)[nvidia::kPackedItems]) {
    nvidia::unpack<T>(raw, x);
#pragma unroll
    for (int e = 0; e < nvidia::kPackedItems; ++e) x[e] = stats.xhat(x[e]);
    if (xhat_row != nullptr) nvidia::storePacked(xhat_row, col, dim, vectors, x);
}

template <typename T, typename W, typename S>
__device__ __forceinline__ void writePackedStats(const Args<T, W, S> &args, size_t row, const PackedStats &stats) {
    writeStats(args, row, RowStats{static_cast<double>(stats.mean_first) + static_cast<double>(stats.mean_rest),
                                   static_cast<double>(stats.rstd)});
}

template <bool kCentres, bool kFlat, typename T, typename W, typename S>
__global__ void __launch_bounds__(kMaxPackedThreads, 1) packedRowsKernel(Args<T, W, S> args, bool vectors) {
    using nvidia::kPackedItems;
    __shared__ CtaSumSlots slots;
    PackedCtaSum cta_sum{slots};
    const int t = threadIdx.x;
    const size_t col = static_cast<size_t>(t) * kPackedItems;
    float w[kPackedItems], b[kPackedItems]; // b: LayerNorm's only (RMSNorm never reads it)
#pragma unroll
    for (int e = 0; e < kPackedItems; ++e) {
        const bool in_row = col + e < args.dim;
        const ptrdiff_t c = static_cast<ptrdiff_t>(col + e);
        w[e] = weightAt<float>(args, c, in_row);
        if constexpr (kCentres) b[e] = biasAt<float>(args, c, in_row);
    }
    auto load = [&](size_t row) { return nvidia::loadPacked(args.x + rowOffset<kFlat>(args.x_rows, row), col, args.dim,
                                                            vectors); };
    size_t row = blockIdx.x;
    nvidia::Packed<T> x_raw = {};
    if (row < args.rows) x_raw = load(row);
    for (; row < args.rows; row += gridDim.x) {
        const size_t next = row + gridDim.x;
        nvidia::Packed<T> x_next = {};
        if (next < args.rows) x_next = load(next);
        float x[kPackedItems]; // past the row's end: 0 (loadPacked)
        nvidia::unpack<T>(x_raw, x);
        const PackedStats stats = packedRowStats<kCentres>(
            [&](auto &&f) {
#pragma unroll
                for (int e = 0; e < kPackedItems; ++e) f(x[e], col + e < args.dim);
            },
            args.dim, args.epsilon, cta_sum);
        if (t == 0) writePackedStats(args, row, stats);
#pragma unroll
        for (int e = 0; e < kPackedItems; ++e) x[e] = stats.xhat(x[e]); // in place
        if (args.xhat != nullptr) {
            nvidia::storePacked(args.xhat + rowOffset<kFlat>(args.xhat_rows, row), col, args.dim, vectors, x);
        }
#pragma unroll
        for (int e = 0; e < kPackedItems; ++e) {
            if constexpr (kCentres) {
                x[e] = x[e] * w[e] + b[e];
            } else {
                x[e] = x[e] * w[e];
            }
        }
        nvidia::storePacked(args.y + rowOffset<kFlat>(args.y_rows, row), col, args.dim, vectors, x);
        x_raw = x_next;
    }
}

// Rows of kMaxOneVectorDim < D <= kMaxPackedDim: the packed form with two vectors a thread, vector v of thread t at
// columns 8 (v * 1024 + t) .. so that each warp's loads stay contiguous; always 1024 threads. Two vectors of x and
// the next row's two fill the registers that the one-vector kernel gives w and b (1024 threads may hold 64 each),
// so the thread's columns of w (and b) are in dynamic shared memory, F32, as float4 [v][half][thread]: a quarter
// warp's 128-bit reads are 128 contiguous bytes, no bank conflicts. Each vector is widened where it is used, and
// again after the barriers rather than kept live across them. The old kernel for these rows (rowsInRegistersKernel
// with 1024 threads) spilled 48-144 bytes.
constexpr int kTwoVectors = 2;

template <bool kCentres>
constexpr size_t packedTwoVectorSharedBytes() {
    return static_cast<size_t>(kMaxPackedThreads) * kTwoVectors * nvidia::kPackedItems * sizeof(float) *
           (kCentres ? 2 : 1);
}

template <bool kCentres, bool kFlat, typename T, typename W, typename S>
__global__ void __launch_bounds__(kMaxPackedThreads, 1) packedTwoVectorRowsKernel(Args<T, W, S> args, bool vectors) {
    using nvidia::kPackedItems;
    constexpr int kQuads = kTwoVectors * kPackedItems / 4; // float4s of w a thread
    __shared__ CtaSumSlots slots;
    PackedCtaSum cta_sum{slots};
    const int t = threadIdx.x;
    // Columns and the row's length fit in 32 bits here (D <= kMaxPackedDim): fewer registers than size_t.
    const unsigned dim = static_cast<unsigned>(args.dim);
    auto colOf = [&](int v) { return static_cast<unsigned>(v * kMaxPackedThreads + t) * kPackedItems; };
    float4 *w4 = nvidia::dynamicShared<float4>(), *b4 = w4 + kQuads * kMaxPackedThreads; // [quad][thread]
#pragma unroll 1 // unrolled, the loads of 16-bit w and b ahead of the loop spilled 12 bytes (LayerNorm)
    for (int q = 0; q < kQuads; ++q) {
        float w[4], b[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const unsigned c = colOf(q / 2) + (q % 2) * 4 + i;
            const bool in_row = c < dim;
            w[i] = weightAt<float>(args, static_cast<ptrdiff_t>(c), in_row);
            if constexpr (kCentres) b[i] = biasAt<float>(args, static_cast<ptrdiff_t>(c), in_row);
        }
        w4[q * kMaxPackedThreads + t] = make_float4(w[0], w[1], w[2], w[3]);
        if constexpr (kCentres) b4[q * kMaxPackedThreads + t] = make_float4(b[0], b[1], b[2], b[3]);
    }
    // Each thread reads only its own columns of w and b, so no barrier is needed before their first use.
    auto load = [&](size_t row, nvidia::Packed<T> (&raw)[kTwoVectors]) {
        const T *x_row = args.x + rowOffset<kFlat>(args.x_rows, row);
#pragma unroll
        for (int v = 0; v < kTwoVectors; ++v) raw[v] = nvidia::loadPacked(x_row, colOf(v), dim, vectors);
    };
    size_t row = blockIdx.x;
    nvidia::Packed<T> x_raw[kTwoVectors] = {};
    if (row < args.rows) load(row, x_raw);
    for (; row < args.rows; row += gridDim.x) {
        const size_t next = row + gridDim.x;
        nvidia::Packed<T> x_next[kTwoVectors] = {};
        if (next < args.rows) load(next, x_next);
        const PackedStats stats = packedRowStats<kCentres>(
            [&](auto &&f) { forEachPacked<T>(x_raw, colOf, dim, f); }, args.dim, args.epsilon, cta_sum);
        if (t == 0) writePackedStats(args, row, stats);
        T *y_row = args.y + rowOffset<kFlat>(args.y_rows, row);
        T *xhat_row = args.xhat != nullptr ? args.xhat + rowOffset<kFlat>(args.xhat_rows, row) : nullptr;
#pragma unroll
        for (int v = 0; v < kTwoVectors; ++v) {
            float x[kPackedItems];
            packedXhat(x_raw[v], stats, xhat_row, colOf(v), dim, vectors, x);
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const float4 w = w4[(2 * v + h) * kMaxPackedThreads + t];
                float *x4 = x + 4 * h;
                if constexpr (kCentres) {
                    const float4 b = b4[(2 * v + h) * kMaxPackedThreads + t];
                    x4[0] = x4[0] * w.x + b.x, x4[1] = x4[1] * w.y + b.y;
                    x4[2] = x4[2] * w.z + b.z, x4[3] = x4[3] * w.w + b.w;
                } else {
                    x4[0] *= w.x, x4[1] *= w.y, x4[2] *= w.z, x4[3] *= w.w;
                }
            }
            nvidia::storePacked(y_row, colOf(v), dim, vectors, x);
        }
#pragma unroll
        for (int v = 0; v < kTwoVectors; ++v) x_raw[v] = x_next[v];
    }
}

// Long rows: a CTA of kMaxGroup threads per row, one element per thread per step, the row re-read (from L2 where
// it fits) for the centring sum, the squares and the output.
template <bool kCentres, typename T, typename W, typename S>
__global__ void __launch_bounds__(kMaxGroup) longRowsKernel(Args<T, W, S> args) {
    using C = ComputeOf<T>;
    __shared__ C scratch[66];
    for (size_t row = blockIdx.x; row < args.rows; row += gridDim.x) {
        const T *x_row = args.x + args.x_rows.offset(row);
        const RowStats stats = rowStats<kCentres, kMaxGroup>(
            [&](auto &&f) {
                for (size_t col = threadIdx.x; col < args.dim; col += kMaxGroup) f(nvidia::widen(x_row[col]), true);
            },
            args.dim, args.epsilon, scratch);
        if (threadIdx.x == 0) writeStats(args, row, stats);
        const C r = static_cast<C>(stats.rstd);
        const SplitMean<C> mean = SplitMean<C>::of(stats.mean);
        T *y_row = args.y + args.y_rows.offset(row);
        T *xhat_row = args.xhat != nullptr ? args.xhat + args.xhat_rows.offset(row) : nullptr;
        for (size_t col = threadIdx.x; col < args.dim; col += kMaxGroup) {
            const C xhat = mean.centre(nvidia::widen(x_row[col])) * r;
            const C w = weightAt<C>(args, static_cast<ptrdiff_t>(col), true);
            const C b = kCentres ? biasAt<C>(args, static_cast<ptrdiff_t>(col), true) : C(0);
            y_row[col] = nvidia::narrow<T>(xhat * w + b);
            if (xhat_row != nullptr) xhat_row[col] = nvidia::narrow<T>(xhat);
        }
    }
}

// Zero-length rows: only the statistics (the mean of no elements is 0/0, as the formulas say).
template <typename T, typename W, typename S>
__global__ void emptyRowsKernel(Args<T, W, S> args) {
    for (size_t row = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; row < args.rows;
         row += static_cast<size_t>(gridDim.x) * blockDim.x) {
        const double no_mean = __longlong_as_double(0x7ff8000000000000LL); // NaN: 0 / 0
        writeStats(args, row, RowStats{no_mean, rstdOf(0.0, 0, args.epsilon)});
    }
}

// Short rows: F16/BF16/F32 rows of D < kMinPackedDim, of any layout (rowOffset). A group of G lanes
// of a warp takes a row (G = 4..32, the fewest whose vectors hold it: a warp for D > 128): lane l holds vectors l,
// l + G, .. (K of them) of it as loaded, with its columns of w and b widened in registers once. The CTA's groups take
// neighbouring rows, and each group's next row is loading while it works on this one. A row's sums are a butterfly
// within its group: no shared memory, no barrier. Statistics in F32, as packedRowsKernel. These rows had the
// in-registers kernel, which gives a row a whole warp of 16 widened elements a lane and asks for the next row only
// after this one: a BF16 row of 128 left half its warp idle, and an SM's 64 warps kept at most 64 rows in flight.
constexpr int kShortRowThreads = 256;

template <bool kCentres, bool kFlat, typename T, typename W, typename S, int G, int K>
__global__ void __launch_bounds__(kShortRowThreads) packedShortRowsKernel(Args<T, W, S> args, bool vectors) {
    using nvidia::kPackedItems;
    constexpr int kGroups = kShortRowThreads / G; // rows a CTA takes at a time
    const int lane = threadIdx.x % G, group = threadIdx.x / G;
    const unsigned dim = static_cast<unsigned>(args.dim); // < kMinPackedDim
    auto colOf = [&](int v) { return static_cast<unsigned>(v * G + lane) * kPackedItems; };
    float w[K][kPackedItems], b[K][kPackedItems]; // b: LayerNorm's only (RMSNorm never reads it)
#pragma unroll
    for (int v = 0; v < K; ++v) {
#pragma unroll
        for (int e = 0; e < kPackedItems; ++e) {
            const unsigned c = colOf(v) + e;
            w[v][e] = weightAt<float>(args, static_cast<ptrdiff_t>(c), c < dim);
            if constexpr (kCentres) b[v][e] = biasAt<float>(args, static_cast<ptrdiff_t>(c), c < dim);
        }
    }
    auto load = [&](size_t row, nvidia::Packed<T> (&raw)[K]) {
        const T *x_row = args.x + rowOffset<kFlat>(args.x_rows, row);
#pragma unroll
        for (int v = 0; v < K; ++v) raw[v] = nvidia::loadPacked(x_row, colOf(v), dim, vectors);
    };
    const size_t step = static_cast<size_t>(gridDim.x) * kGroups;
    size_t row = static_cast<size_t>(blockIdx.x) * kGroups + group;
    // The loop runs while the warp's first group has a row, so every lane of the warp meets each butterfly's
    // shuffles (full-warp masks); a group past the last row sums zeros and writes nothing.
    size_t warp_row = row - group % (32 / G);
    nvidia::Packed<T> x_raw[K] = {};
    if (row < args.rows) load(row, x_raw);
    for (; warp_row < args.rows; row += step, warp_row += step) {
        nvidia::Packed<T> x_next[K] = {};
        if (row + step < args.rows) load(row + step, x_next);
        const PackedStats stats = packedRowStats<kCentres>([&](auto &&f) { forEachPacked<T>(x_raw, colOf, dim, f); },
                                                           args.dim, args.epsilon,
                                                           [](float2 part) { return nvidia::warpAllSum<G>(part); });
        if (row < args.rows) {
            if (lane == 0) writePackedStats(args, row, stats);
            T *y_row = args.y + rowOffset<kFlat>(args.y_rows, row);
            T *xhat_row = args.xhat != nullptr ? args.xhat + rowOffset<kFlat>(args.xhat_rows, row) : nullptr;
#pragma unroll
            for (int v = 0; v < K; ++v) {
                float x[kPackedItems];
                packedXhat(x_raw[v], stats, xhat_row, colOf(v), dim, vectors, x);
#pragma unroll
                for (int e = 0; e < kPackedItems; ++e) {
                    if constexpr (kCentres) {
                        x[e] = x[e] * w[v][e] + b[v][e];
                    } else {
                        x[e] = x[e] * w[v][e];
                    }
                }
                nvidia::storePacked(y_row, colOf(v), dim, vectors, x);
            }
        }
#pragma unroll
        for (int v = 0; v < K; ++v) x_raw[v] = x_next[v];
    }
}

// body(std::bool_constant<flat>{}): the packed kernels' kFlat.
template <typename Body>
decltype(auto) withFlatRows(bool flat, Body &&body) {
    return flat ? body(std::true_type{}) : body(std::false_type{});
}

// Calls body(kernel) with the instantiation of packedShortRowsKernel for `groups` and `flat`.
template <bool kCentres, typename T, typename W, typename S, typename Body>
infiniStatus_t withShortRowsKernel(nvidia::LaneGroups groups, bool flat, Body &&body) {
    return withFlatRows(flat, [&](auto flat_tag) {
        return nvidia::withLaneGroups(groups, [&](auto lanes, auto vectors) {
            return body(packedShortRowsKernel<kCentres, decltype(flat_tag)::value, T, W, S, decltype(lanes)::value,
                                              decltype(vectors)::value>);
        });
    });
}

// Calls body(kernel, shared bytes) with the packed kernel for rows of `dim` (packedTwoVectorRowsKernel past
// kMaxOneVectorDim, else packedRowsKernel) and `flat`.
template <bool kCentres, typename T, typename W, typename S, typename Body>
infiniStatus_t withPackedRowsKernel(size_t dim, bool flat, Body &&body) {
    return withFlatRows(flat, [&](auto flat_tag) {
        constexpr bool kFlat = decltype(flat_tag)::value;
        if (dim > kMaxOneVectorDim) {
            return body(packedTwoVectorRowsKernel<kCentres, kFlat, T, W, S>, packedTwoVectorSharedBytes<kCentres>());
        }
        return body(packedRowsKernel<kCentres, kFlat, T, W, S>, size_t{0});
    });
}

// Threads per row for a row of `dim`: the fewest (a power of two, at least a warp) that hold it in registers.
inline int groupFor(size_t dim) {
    int group = 32;
    while (group < kMaxGroup && static_cast<size_t>(group) * kItems < dim) group *= 2;
    return group;
}

// The grid: one CTA per row group, capped at a few waves of resident CTAs (the kernels loop over rows).
inline unsigned gridFor(size_t rows, int rows_per_cta, int multiprocessors) {
    const size_t wanted = (rows + static_cast<size_t>(rows_per_cta) - 1) / static_cast<size_t>(rows_per_cta);
    const size_t cap = static_cast<size_t>(std::max(multiprocessors, 1)) * 32;
    return static_cast<unsigned>(std::max<size_t>(1, std::min(wanted, cap)));
}

template <bool kCentres, typename T, typename W, typename S>
void launchInRegisters(const Args<T, W, S> &args, bool vectors, int group, int multiprocessors, cudaStream_t stream) {
    constexpr int V = nvidia::kVec<T>;
    const int threads = group == 32 ? kWarpCta : group;
    const unsigned grid = gridFor(args.rows, threads / group, multiprocessors);
    switch (group) {
    case 32: rowsInRegistersKernel<kCentres, T, W, S, 32, V><<<grid, threads, 0, stream>>>(args, vectors); break;
    case 64: rowsInRegistersKernel<kCentres, T, W, S, 64, V><<<grid, threads, 0, stream>>>(args, vectors); break;
    case 128: rowsInRegistersKernel<kCentres, T, W, S, 128, V><<<grid, threads, 0, stream>>>(args, vectors); break;
    case 256: rowsInRegistersKernel<kCentres, T, W, S, 256, V><<<grid, threads, 0, stream>>>(args, vectors); break;
    case 512: rowsInRegistersKernel<kCentres, T, W, S, 512, V><<<grid, threads, 0, stream>>>(args, vectors); break;
    default: rowsInRegistersKernel<kCentres, T, W, S, 1024, V><<<grid, threads, 0, stream>>>(args, vectors); break;
    }
}

// What a descriptor decides once, at its creation: the device's SMs, and for rows a packed kernel takes, its
// threads (or the short rows' shape), grid (the CTAs its SMs hold at once) and row offsets.
struct Plan {
    int multiprocessors = 1;
    int packed_threads = 0;   // 0: not packedRowsKernel or packedTwoVectorRowsKernel
    nvidia::LaneGroups short_rows; // vectors 0: not packedShortRowsKernel
    unsigned packed_ctas = 0;
    bool flat_rows = true;      // the packed kernels' kFlat: every row layout one stride apart (flatRows)
    bool vector_strides = true; // every row starts 16 bytes apart from its tensor's first (vectorStrides)
};

// row_layouts: x's, y's and xhat's (an empty RowLayout where a tensor is absent). The kernel and the threads of a
// row depend on its dtype and length alone, so that a row's bits do not depend on the layout, alignment or rows of
// its call; the layouts only pick the offsets (flat_rows) and whether loads may be vectors.
template <bool kCentres, typename T, typename W, typename S>
infiniStatus_t makePlan(size_t rows, size_t dim, std::initializer_list<RowLayout> row_layouts, int device_id,
                        Plan *plan) {
    Plan p;
    p.flat_rows = flatRows(row_layouts);
    p.vector_strides = vectorStrides(sizeof(T), row_layouts);
    const nvidia::DeviceScope device_scope(device_id);
    INFINI_CHECK(device_scope.status());
    INFINI_CHECK(nvidia::multiprocessorCount(device_id, &p.multiprocessors));
    if constexpr (!std::is_same_v<T, double>) { // F64, the reference dtype, keeps the kernels of its sums
        bool two_vectors_fit = true; // the two-vector kernel's w and b: 64-128 KiB of shared memory
        if (dim > kMaxOneVectorDim) {
            INFINI_CHECK(nvidia::sharedFits(device_id, packedTwoVectorSharedBytes<kCentres>(),
                                            sizeof(CtaSumSlots), &two_vectors_fit));
        }
        if (dim > 0 && dim < kMinPackedDim && rows > 0) {
            int per_sm = 1;
            p.short_rows = nvidia::LaneGroups::of(dim);
            INFINI_CHECK((withShortRowsKernel<kCentres, T, W, S>(p.short_rows, p.flat_rows, [&](auto kernel) {
                return nvidia::residentCtas(kernel, kShortRowThreads, &per_sm);
            })));
            const size_t groups = kShortRowThreads / p.short_rows.lanes; // rows a CTA takes at a time
            const size_t ctas = (rows + groups - 1) / groups;
            p.packed_ctas = static_cast<unsigned>(std::min(ctas, static_cast<size_t>(p.multiprocessors) * per_sm));
        }
        if (dim >= kMinPackedDim && dim <= kMaxPackedDim && rows > 0 && two_vectors_fit) {
            int per_sm = 1;
            p.packed_threads = dim > kMaxOneVectorDim ? kMaxPackedThreads : nvidia::packedThreads(dim);
            INFINI_CHECK((withPackedRowsKernel<kCentres, T, W, S>(dim, p.flat_rows, [&](auto kernel, size_t shared) {
                if (shared > 0) { // over 48 KiB of dynamic shared memory a kernel must be allowed it, once
                    CHECK_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                    static_cast<int>(shared)));
                }
                return nvidia::residentCtas(kernel, p.packed_threads, &per_sm, shared);
            })));
            p.packed_ctas = static_cast<unsigned>(std::min(rows, static_cast<size_t>(p.multiprocessors) * per_sm));
        }
    }
    *plan = p;
    return INFINI_STATUS_SUCCESS;
}

// Runs one call: T, W, S the storage types (S: the statistics'), kCentres: LayerNorm (else RMSNorm).
template <bool kCentres, typename T, typename W, typename S>
infiniStatus_t run(const RowCall &call, size_t rows, size_t dim, const Plan &plan, cudaStream_t stream) {
    const int multiprocessors = plan.multiprocessors;
    if (rows == 0) return INFINI_STATUS_SUCCESS;
    Args<T, W, S> args{static_cast<T *>(call.y), static_cast<T *>(call.xhat), static_cast<S *>(call.mean),
                       static_cast<S *>(call.stat), static_cast<const T *>(call.x), static_cast<const W *>(call.w),
                       static_cast<const W *>(call.b), call.y_rows, call.xhat_rows, call.x_rows, call.mean_rows,
                       call.stat_rows, call.w_stride, call.b_stride, rows, dim, call.epsilon, call.stat_is_std};
    if (dim == 0) {
        if (call.mean != nullptr || call.stat != nullptr) {
            emptyRowsKernel<<<gridFor(rows, 256, multiprocessors), 256, 0, stream>>>(args);
        }
        return nvidia::launchStatus();
    }
    if (dim > kMaxRegisterDim) {
        longRowsKernel<kCentres><<<gridFor(rows, 1, multiprocessors), kMaxGroup, 0, stream>>>(args);
        return nvidia::launchStatus();
    }
    // Vector loads and stores where every row of x, y and xhat starts on a 16-byte boundary (the strides were checked
    // at planning; a null xhat counts as aligned); elsewhere the same kernels load and store element by element.
    const bool vectors = plan.vector_strides && nvidia::aligned16(call.x) && nvidia::aligned16(call.y) &&
                         nvidia::aligned16(call.xhat);
    if constexpr (!std::is_same_v<T, double>) {
        if (plan.short_rows.vectors > 0) {
            return withShortRowsKernel<kCentres, T, W, S>(plan.short_rows, plan.flat_rows, [&](auto kernel) {
                kernel<<<plan.packed_ctas, kShortRowThreads, 0, stream>>>(args, vectors);
                return nvidia::launchStatus();
            });
        }
        if (plan.packed_threads > 0) {
            return withPackedRowsKernel<kCentres, T, W, S>(dim, plan.flat_rows, [&](auto kernel, size_t shared) {
                kernel<<<plan.packed_ctas, plan.packed_threads, shared, stream>>>(args, vectors);
                return nvidia::launchStatus();
            });
        }
    }
    launchInRegisters<kCentres>(args, vectors, groupFor(dim), multiprocessors, stream);
    return nvidia::launchStatus();
}

} // namespace op::row_forward

#endif
