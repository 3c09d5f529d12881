// CUDA kernels shared by the row-normalizing backward ops (RMSNorm, LayerNorm). Per row, an op reduces two
// sums over the row, turns them into per-row coefficients, writes the row's output and adds per-column terms
// into partials; `Terms` (see rms_norm_backward_nvidia.cu) says which. The plans:
//  - one pass (D <= kMaxRegisterDim): a warp or a block per row keeps the row in registers between its
//    reduction and its output; each CTA owns a fixed contiguous range of rows and keeps its column partials
//    in registers until the end;
//  - split (long rows, or too few rows to fill the GPU): rows are cut in chunks of kChunk columns; pass 1
//    writes per-chunk sums, a warp per row adds them in order, pass 2 re-reads the row (from L2 when it fits);
//  - packed (F16/BF16 rows of kMinPackedDim..kMaxPackedDim, in 16-byte vectors): one pass, a CTA a row, each
//    thread one vector of the row kept as raw 16-bit values, the next row's already loading (packedRowsKernel);
//    rows past 8192 elements two vectors a thread (packedTwoVectorRowsKernel);
//  - warp rows (F16/BF16 rows of up to kMaxWarpRowDim, in 16-byte vectors): a warp a row, no CTA barrier per row
//    (packedWarpRowsKernel).
// Partials are in the compute type (F32, F64 for F64 data), one row of length D per CTA (or row block) for each
// per-column output that is wanted, summed in fixed order by sumPartials: no atomics. Types: T the data, W the
// parameters (w and the per-column outputs), C = ComputeOf<T>.
#ifndef INFINIOP_OPS_ROW_BACKWARD_NVIDIA_CUH
#define INFINIOP_OPS_ROW_BACKWARD_NVIDIA_CUH

#include "common/checked.h"
#include "common/status.h"
#include "devices/nvidia/nvidia_packed.cuh"
#include "devices/nvidia/nvidia_reduce.cuh"
#include "devices/nvidia/nvidia_status.h"
#include "devices/nvidia/nvidia_types.cuh"
#include "devices/nvidia/nvidia_workspace.h"
#include "ops/rows.h"

#include <algorithm>
#include <initializer_list>
#include <type_traits>

namespace op::row_backward {

using nvidia::ComputeOf;
using nvidia::CtaSumSlots;
using nvidia::kPackedItems;
using nvidia::loadPacked;
using nvidia::storePacked;
using nvidia::unpack;
using nvidia::warpAllSum;

constexpr int kItems = 16;                         // elements of a row held per thread
constexpr int kMaxGroup = 512;                     // threads per row in the one-pass plan
constexpr size_t kMaxRegisterDim = kMaxGroup * kItems;
constexpr int kSplitThreads = 256;
constexpr size_t kChunk = kSplitThreads * kItems; // columns per CTA in the split plan
constexpr int kFinalizeWidth = 32, kFinalizeDepth = 8;
constexpr int kMaxPartials = 2; // per-column outputs of an op (LayerNorm: grad_weight, grad_bias)

// Threads per CTA for a group (threads per row) of G: small groups share a CTA of 128.
__host__ __device__ constexpr int ctaThreads(int group) { return group < 128 ? 128 : group; }
// Resident threads per SM the kernels ask for (at most 128 registers each): enough loads in flight to stream.
constexpr int kMinThreadsPerSm = 512;

template <typename C>
struct Pair {
    C first, second;
};

// One call, untyped: what an op's calculate fills in. `a`, `b` are the two row inputs, `w` the per-column
// vector (NULL: ones), `scalar` one value per row (LayerNorm's std, of the parameter type; RMSNorm's and
// LayerNorm-from-input's saved rstd, of the compute type; NULL: none). outs[p] NULL: that per-column output is
// not wanted. b_mean: for Terms with kCentersB, one value per row of the scalar's type; the kernels see
// b as (b - b_mean) * scalar, formed in registers.
struct RowCall {
    void *out;
    const void *a, *b, *w, *scalar, *b_mean;
    RowLayout out_rows, a_rows, b_rows, scalar_rows, b_mean_rows;
    ptrdiff_t w_stride;
    void *outs[kMaxPartials];
    ptrdiff_t out_strides[kMaxPartials];
    double epsilon;
};

// Everything a kernel needs, typed. S is the row scalar's type.
template <typename T, typename W, typename S>
struct Args {
    using C = ComputeOf<T>;
    T *out;
    const T *a, *b;
    const W *w;
    const S *scalar;
    RowLayout out_rows, a_rows, b_rows, scalar_rows;
    ptrdiff_t w_stride;
    size_t rows, dim;
    double epsilon;
    C *partials[kMaxPartials]; // [partial count][dim] each; NULL: not wanted
    const S *b_mean;           // Terms::kCentersB only
    RowLayout b_mean_rows;
};

// Terms that read b as (b - mean) * rstd of its row (LayerNorm from the forward's input) say kCentersB.
template <typename Terms, typename = void>
struct CentersB {
    static constexpr bool value = false;
};
template <typename Terms>
struct CentersB<Terms, std::void_t<decltype(Terms::kCentersB)>> {
    static constexpr bool value = Terms::kCentersB;
};

// The row's (mean, rstd) where the Terms center b (LayerNorm from the forward's input); else unused.
template <typename Terms, typename T, typename W, typename S>
__device__ __forceinline__ Pair<ComputeOf<T>> centeringOf(const Args<T, W, S> &args, size_t row) {
    using C = ComputeOf<T>;
    if constexpr (CentersB<Terms>::value) {
        return {static_cast<C>(args.b_mean[args.b_mean_rows.offset(row)]),
                static_cast<C>(args.scalar[args.scalar_rows.offset(row)])};
    } else {
        return {C(0), C(1)};
    }
}

// N values of b as the Terms see them: unchanged, or centred and scaled by the row's (mean, rstd) (zero-padded
// columns become -mean * rstd, but their a is zero, so they add no terms and are never stored).
template <typename Terms, int N, typename C>
__device__ __forceinline__ void centerB(Pair<C> centering, C *b) {
    if constexpr (CentersB<Terms>::value) {
#pragma unroll
        for (int e = 0; e < N; ++e) b[e] = (b[e] - centering.first) * centering.second;
    }
}

// b of this row, as the Terms see it.
template <typename Terms, typename T, typename W, typename S>
__device__ __forceinline__ void prepareB(const Args<T, W, S> &args, size_t row, ComputeOf<T> *b) {
    if constexpr (CentersB<Terms>::value) centerB<Terms, kItems>(centeringOf<Terms>(args, row), b);
}

// The column of element e of a thread's kItems: vector k = e / V of V elements starts at base + (k*G + lane)*V.
template <int G, int V>
__device__ __forceinline__ size_t columnOf(size_t base, int lane, int e) {
    return base + static_cast<size_t>((e / V) * G + lane) * V + e % V;
}

template <int G, int V, typename T>
__device__ __forceinline__ void loadColumns(const T *row, size_t base, int lane, size_t dim, ComputeOf<T> *out) {
#pragma unroll
    for (int k = 0; k < kItems / V; ++k) {
        nvidia::loadSpan<V>(row, base + static_cast<size_t>(k * G + lane) * V, dim, out + k * V);
    }
}

// A thread's columns of w in shared memory, its element i at base[i * kStride] (base: the array plus the thread's
// index): each load of a warp then reads 32 consecutive words, a bank each. Kept a thread's columns together
// (w[t * N + i]), 8 or 16 threads of a warp shared a bank: every read of w, twice a row, took 4-8 times its passes.
template <typename C, int kStride>
struct SharedColumns {
    C *base;
    __device__ __forceinline__ C &operator[](int i) const { return base[i * kStride]; }
    __device__ __forceinline__ SharedColumns operator+(int i) const { return {base + i * kStride}; }
};

// This thread's N columns of w (a pointer or SharedColumns): ones where w is absent, zeros past the end of the row.
template <int G, int V, int N = kItems, typename T, typename W, typename S, typename Weights>
__device__ __forceinline__ void loadWeights(const Args<T, W, S> &args, size_t base, int lane, Weights w) {
    using C = ComputeOf<T>;
#pragma unroll
    for (int e = 0; e < N; ++e) {
        const size_t col = columnOf<G, V>(base, lane, e);
        const bool in_row = col < args.dim; // never read past the end of w; an absent w is ones
        w[e] = in_row && args.w != nullptr ? nvidia::widen(args.w[static_cast<ptrdiff_t>(col) * args.w_stride])
                                           : (in_row ? C(1) : C(0));
    }
}

// The row's coefficients from its two sums, computed in their type A (double; float in the packed plan).
template <typename Terms, typename T, typename W, typename S, typename A>
__device__ __forceinline__ auto rowCoefficients(const Args<T, W, S> &args, size_t row, A sum1, A sum2) {
    const bool has_scalar = args.scalar != nullptr;
    const double scalar = has_scalar ? static_cast<double>(nvidia::widen(args.scalar[args.scalar_rows.offset(row)])) : 0.0;
    return Terms::template row<ComputeOf<T>>(sum1, sum2, args.dim, args.epsilon, has_scalar, scalar);
}

template <typename Terms, typename T, typename W, typename S>
__device__ __forceinline__ auto rowCoefficients(const Args<T, W, S> &args, size_t row, double2 sums) {
    return rowCoefficients<Terms>(args, row, sums.x, sums.y);
}

// The two row sums over a thread's N elements (zero-padded columns contribute zero terms).
template <typename Terms, int N, typename C, typename Weights>
__device__ __forceinline__ Pair<C> elementSums(const C *a, const C *b, Weights w) {
    Pair<C> sums{0, 0};
#pragma unroll
    for (int e = 0; e < N; ++e) {
        const Pair<C> t = Terms::terms(a[e], b[e], w[e]);
        sums.first += t.first;
        sums.second += t.second;
    }
    return sums;
}

template <typename Terms, typename C>
__device__ __forceinline__ double2 threadSums(const C *a, const C *b, const C *w) {
    const Pair<C> sums = elementSums<Terms, kItems>(a, b, w);
    return make_double2(sums.first, sums.second);
}

// The outputs of a thread's N elements, and their partial terms added into `first` and, with two partials, `last`
// (each a register array or SharedColumns; zero-padded columns add zero).
template <typename Terms, int N, typename C, typename Weights, typename Row, typename First, typename Last>
__device__ __forceinline__ void elementOutputs(const C *a, const C *b, Weights w, const Row &k, C *result,
                                               First first, Last last) {
#pragma unroll
    for (int e = 0; e < N; ++e) {
        result[e] = Terms::out(a[e], b[e], w[e], k);
        const Pair<C> t = Terms::partialTerms(a[e], b[e], k);
        first[e] += t.first;
        if constexpr (Terms::kPartials > 1) last[e] += t.second;
    }
}

// Writes the output of this thread's columns of one row and adds its partial terms. In place (out == a) is
// safe: the whole row was read before.
template <typename Terms, int G, int V, typename T, typename Row>
__device__ __forceinline__ void emitColumns(T *out_row, size_t base, int lane, size_t dim, const ComputeOf<T> *a,
                                            const ComputeOf<T> *b, const ComputeOf<T> *w, const Row &k,
                                            ComputeOf<T> (&acc)[Terms::kPartials][kItems]) {
    ComputeOf<T> result[kItems];
    elementOutputs<Terms, kItems>(a, b, w, k, result, acc[0], acc[Terms::kPartials - 1]);
#pragma unroll
    for (int j = 0; j < kItems / V; ++j) {
        nvidia::storeSpan<V>(out_row, base + static_cast<size_t>(j * G + lane) * V, dim, result + j * V);
    }
}

template <typename Terms, typename T, typename W, typename S>
__device__ __forceinline__ bool anyPartials(const Args<T, W, S> &args) {
    bool any = false;
#pragma unroll
    for (int p = 0; p < Terms::kPartials; ++p) any = any || args.partials[p] != nullptr;
    return any;
}

// Stores the wanted partials of this thread's columns into partial row `slot`. Predicated stores, not a branch
// around the loop: the branch cost the split kernel 48 bytes of spills.
template <typename Terms, int G, int V, typename T, typename W, typename S>
__device__ __forceinline__ void storePartials(const Args<T, W, S> &args, size_t slot, size_t base, int lane,
                                              const ComputeOf<T> (&acc)[Terms::kPartials][kItems]) {
#pragma unroll
    for (int p = 0; p < Terms::kPartials; ++p) {
        ComputeOf<T> *partial = args.partials[p];
        const size_t first = slot * args.dim;
#pragma unroll
        for (int e = 0; e < kItems; ++e) {
            const size_t col = columnOf<G, V>(base, lane, e);
            if (partial != nullptr && col < args.dim) partial[first + col] = acc[p][e];
        }
    }
}

// One pass: CTA `blockIdx.x` owns rows [blockIdx.x * rows_per_cta, +rows_per_cta); each group of G threads
// takes every (CTA threads / G)-th of them and holds a whole row (D <= G * kItems) in registers.
template <typename Terms, typename T, typename W, typename S, int G, int V>
__global__ void __launch_bounds__(ctaThreads(G), kMinThreadsPerSm / ctaThreads(G))
    onePassKernel(Args<T, W, S> args, size_t rows_per_cta) {
    using C = ComputeOf<T>;
    constexpr int kGroups = ctaThreads(G) / G;
    __shared__ double2 scratch[G == 32 ? 1 : 33];
    __shared__ C group_acc[kGroups > 1 ? kGroups - 1 : 1][Terms::kPartials][kItems][kGroups > 1 ? G : 1];
    const int lane = threadIdx.x % G, group = threadIdx.x / G;
    const size_t first = blockIdx.x * rows_per_cta;
    const size_t last = min(first + rows_per_cta, args.rows);

    C w[kItems], acc[Terms::kPartials][kItems] = {};
    loadWeights<G, V>(args, 0, lane, w);

    for (size_t row = first + group; row < last; row += kGroups) {
        C a[kItems], b[kItems];
        loadColumns<G, V>(args.a + args.a_rows.offset(row), 0, lane, args.dim, a);
        loadColumns<G, V>(args.b + args.b_rows.offset(row), 0, lane, args.dim, b);
        prepareB<Terms>(args, row, b);
        double2 sums = threadSums<Terms>(a, b, w);
        if constexpr (G == 32) {
            sums = nvidia::warpSum(sums);
        } else {
            sums = nvidia::blockSum(sums, scratch); // the whole CTA is one group here
        }
        const auto k = rowCoefficients<Terms>(args, row, sums);
        emitColumns<Terms, G, V>(args.out + args.out_rows.offset(row), 0, lane, args.dim, a, b, w, k, acc);
    }
    if (!anyPartials<Terms>(args)) return; // the same for every thread of the CTA

    if constexpr (kGroups > 1) { // groups of a CTA own the same columns: add them in group order
        if (group > 0) {
#pragma unroll
            for (int p = 0; p < Terms::kPartials; ++p) {
#pragma unroll
                for (int e = 0; e < kItems; ++e) group_acc[group - 1][p][e][lane] = acc[p][e];
            }
        }
        __syncthreads();
        if (group != 0) return;
        for (int g = 0; g < kGroups - 1; ++g) {
#pragma unroll
            for (int p = 0; p < Terms::kPartials; ++p) {
#pragma unroll
                for (int e = 0; e < kItems; ++e) acc[p][e] += group_acc[g][p][e][lane];
            }
        }
    }
    storePartials<Terms, G, V>(args, blockIdx.x, 0, lane, acc);
}

// Packed rows: F16/BF16 data whose rows start 16-byte vectors apart, 512 <= D <= 8192. A CTA of ceil(D / 8)
// threads (a multiple of 32, at most kThreads) per row; thread t holds elements [8t, 8t + 8) of a and b as one raw
// 16-byte vector each and widens them only where it computes, so a row costs 8 registers a thread where the
// one-pass kernel holds 48 widened values: twice the resident threads, and no spills at 1024 threads. Its columns
// of w sit in shared memory (only the thread itself reads them: no barrier). The next row's vectors are loaded
// before this row's barrier, so they are in flight through its reduction and stores. ONE barrier a row: each warp's
// sums go to slots[row parity][warp], and after the barrier every warp adds all slots in one fixed order; a slot is
// rewritten two rows later, after the next barrier, which every reader of it has passed. (The forwards'
// PackedCtaSum, inline: through it the two-vector kernel spilled 16-40 bytes, ptxas sm_90.) The row sums and
// coefficients are F32 here (F64 in the other plans): each of a CTA's 32 warps computes them, and in F64 their
// divisions and square root took the FP64 pipe about a quarter of a row's time at D = 8192. Partials as in
// the one-pass plan (a row per CTA, summed in fixed order). `vectors`: the base pointers are 16-byte aligned too;
// else the same elements load one by one. On an H200 (scripts/gpu_variants, `cta8p`, docs/performance.md): 2-3.4x
// the one-pass kernel at D 1024-8192, 0.81-0.86 of copy bandwidth.
// Rows of 8192 < D <= 16384 take packedTwoVectorRowsKernel: RMSNorm's on an H200 0.54 of the split plan's time at
// 2048x16384 BF16 and F16 (scripts/gpu_ab.sh, 2026-11-30); LayerNorm's (its partials in shared memory) not
// yet timed (scripts/gpu_ab_pending, `ln2vec`).
constexpr size_t kMinPackedDim = 512, kMaxPackedDim = 16384;
constexpr int kMaxPackedThreads = 1024;
constexpr size_t kMaxOneVectorDim = kMaxPackedThreads * kPackedItems; // 8192: one vector a thread up to here
// Elements of one array of the two-vector kernel's shared memory (w's, and each of LayerNorm's partials): a row.
constexpr int kTwoVectorArray = kMaxPackedThreads * 2 * kPackedItems;

// b of a thread's vector as the Terms see it (centering: the row's, read once a row with centeringOf).
template <typename Terms, typename T>
__device__ __forceinline__ void unpackB(uint4 raw, Pair<ComputeOf<T>> centering, ComputeOf<T> *b) {
    unpack<T>(raw, b);
    centerB<Terms, kPackedItems>(centering, b);
}

template <typename Terms, typename T, typename W, typename S, int kThreads>
__global__ void __launch_bounds__(kThreads, 1024 / kThreads)
    packedRowsKernel(Args<T, W, S> args, size_t rows_per_cta, bool vectors) {
    using C = ComputeOf<T>;
    __shared__ C w_shared[kThreads * kPackedItems];
    __shared__ CtaSumSlots slots;
    const int t = threadIdx.x, lane = t % 32, warp = t / 32, warps = blockDim.x / 32;
    const size_t col = static_cast<size_t>(t) * kPackedItems;
    const size_t first = blockIdx.x * rows_per_cta;
    const size_t last = min(first + rows_per_cta, args.rows);
    const SharedColumns<C, kThreads> w{w_shared + t};
    loadWeights<1, kPackedItems, kPackedItems>(args, 0, t, w); // columns 8t .. 8t + 7
    C acc[Terms::kPartials][kPackedItems] = {};
    uint4 a_raw = {}, b_raw = {};
    if (first < last) {
        a_raw = loadPacked(args.a + flatOffset(args.a_rows, first), col, args.dim, vectors);
        b_raw = loadPacked(args.b + flatOffset(args.b_rows, first), col, args.dim, vectors);
    }
    for (size_t row = first; row < last; ++row) {
        const int parity = static_cast<int>((row - first) & 1);
        uint4 a_next = {}, b_next = {};
        if (row + 1 < last) { // in flight through this row's barrier
            a_next = loadPacked(args.a + flatOffset(args.a_rows, row + 1), col, args.dim, vectors);
            b_next = loadPacked(args.b + flatOffset(args.b_rows, row + 1), col, args.dim, vectors);
        }
        const Pair<C> centering = centeringOf<Terms>(args, row);
        C a[kPackedItems], b[kPackedItems];
        unpack<T>(a_raw, a);
        unpackB<Terms, T>(b_raw, centering, b);
        const Pair<C> thread_sums = elementSums<Terms, kPackedItems>(a, b, w);
        const float2 part = warpAllSum(make_float2(thread_sums.first, thread_sums.second));
        if (lane == 0) slots[parity][warp] = part;
        __syncthreads();
        const float2 sums = warpAllSum(lane < warps ? slots[parity][lane] : make_float2(0.f, 0.f));
        const auto k = rowCoefficients<Terms>(args, row, sums.x, sums.y);
        unpack<T>(a_raw, a); // widened again rather than kept live across the barrier
        unpackB<Terms, T>(b_raw, centering, b);
        C result[kPackedItems];
        elementOutputs<Terms, kPackedItems>(a, b, w, k, result, acc[0], acc[Terms::kPartials - 1]);
        storePacked(args.out + flatOffset(args.out_rows, row), col, args.dim, vectors, result);
        a_raw = a_next;
        b_raw = b_next;
    }
#pragma unroll
    for (int p = 0; p < Terms::kPartials; ++p) {
        C *partial = args.partials[p];
#pragma unroll
        for (int e = 0; e < kPackedItems; ++e) {
            if (partial != nullptr && col + e < args.dim) partial[blockIdx.x * args.dim + col + e] = acc[p][e];
        }
    }
}

// A thread's K vectors of one row of a and of b, for kernels that hold several (colOf(v): the first column of
// vector v).
template <int K, typename T, typename ColOf>
__device__ __forceinline__ void loadPackedVectors(const T *a_row, const T *b_row, ColOf colOf, size_t dim,
                                                  bool vectors, uint4 (&a_raw)[K], uint4 (&b_raw)[K]) {
#pragma unroll
    for (int v = 0; v < K; ++v) {
        a_raw[v] = loadPacked(a_row, colOf(v), dim, vectors);
        b_raw[v] = loadPacked(b_row, colOf(v), dim, vectors);
    }
}

// The two row sums over a thread's K vectors (w[8v + e]: the column of element e of vector v).
template <typename Terms, typename T, int K, typename Weights>
__device__ __forceinline__ Pair<ComputeOf<T>> packedVectorSums(const uint4 (&a_raw)[K], const uint4 (&b_raw)[K],
                                                               Pair<ComputeOf<T>> centering, Weights w) {
    using C = ComputeOf<T>;
    Pair<C> thread_sums{0, 0};
#pragma unroll
    for (int v = 0; v < K; ++v) {
        C a[kPackedItems], b[kPackedItems];
        unpack<T>(a_raw[v], a);
        unpackB<Terms, T>(b_raw[v], centering, b);
        const Pair<C> sums = elementSums<Terms, kPackedItems>(a, b, w + v * kPackedItems);
        thread_sums.first += sums.first;
        thread_sums.second += sums.second;
    }
    return thread_sums;
}

// Writes the outputs of a thread's K vectors (each widened again where it is used) and adds their partial terms
// into `first` and `last` as elementOutputs does (element e of vector v at [8v + e], as w's).
template <typename Terms, typename T, int K, typename ColOf, typename Weights, typename Row, typename First,
          typename Last>
__device__ __forceinline__ void packedVectorOutputs(T *out_row, ColOf colOf, size_t dim, bool vectors,
                                                    const uint4 (&a_raw)[K], const uint4 (&b_raw)[K],
                                                    Pair<ComputeOf<T>> centering, Weights w, const Row &k,
                                                    First first, Last last) {
    using C = ComputeOf<T>;
#pragma unroll
    for (int v = 0; v < K; ++v) {
        C a[kPackedItems], b[kPackedItems], result[kPackedItems];
        unpack<T>(a_raw[v], a);
        unpackB<Terms, T>(b_raw[v], centering, b);
        elementOutputs<Terms, kPackedItems>(a, b, w + v * kPackedItems, k, result, first + v * kPackedItems,
                                            last + v * kPackedItems);
        storePacked(out_row, colOf(v), dim, vectors, result);
    }
}

// Stores one partial of a thread's K vectors (element e of vector v at acc[8v + e]) into partial row `slot`, where
// that partial is wanted.
template <int K, typename T, typename W, typename S, typename ColOf, typename Partial>
__device__ __forceinline__ void storePackedPartial(const Args<T, W, S> &args, ComputeOf<T> *partial, size_t slot,
                                                   ColOf colOf, Partial acc) {
#pragma unroll
    for (int v = 0; v < K; ++v) {
#pragma unroll
        for (int e = 0; e < kPackedItems; ++e) {
            const size_t col = colOf(v) + e;
            if (partial != nullptr && col < args.dim) partial[slot * args.dim + col] = acc[v * kPackedItems + e];
        }
    }
}

// Stores the wanted partials of a thread's K vectors (`first`, `last` as packedVectorOutputs adds them).
template <typename Terms, int K, typename T, typename W, typename S, typename ColOf, typename First, typename Last>
__device__ __forceinline__ void storePackedPartials(const Args<T, W, S> &args, size_t slot, ColOf colOf, First first,
                                                    Last last) {
    storePackedPartial<K>(args, args.partials[0], slot, colOf, first);
    if constexpr (Terms::kPartials > 1)
        storePackedPartial<K>(args, args.partials[Terms::kPartials - 1], slot, colOf, last);
}

// Rows of kMaxOneVectorDim < D <= kMaxPackedDim: the packed form with two vectors a thread, vector v of thread t
// at columns 8 (v * 1024 + t) .. so that each warp's loads stay contiguous; always 1024 threads, and no prefetch
// (two vectors and the next row's two would pass the 64 registers each of 1024 threads may hold). The thread's
// columns of w are dynamic shared memory (64 KiB in F32). RMSNorm's partial is in registers; LayerNorm's two are
// in shared memory too, by columns after w (192 KiB in all): in registers they spilled 100-250 bytes (ptxas sm_90),
// so LayerNorm took the split plan, and with grad_b's alone in shared memory 48-84 bytes; with both, none but 20
// in one form, for two reads and two writes of shared memory per element and row, conflict-free. A kernel of its
// own: sharing the one-vector kernel's template moved that kernel's registers (LayerNorm from the input, BF16: 0 to
// 32 bytes of spills, 1.05x the time on an H200).
template <typename Terms, typename T>
constexpr size_t packedTwoVectorSharedBytes() {
    constexpr size_t arrays = Terms::kPartials == 1 ? 1 : 1 + Terms::kPartials; // w, and LayerNorm's partials
    return arrays * kTwoVectorArray * sizeof(ComputeOf<T>);
}

// Where the two-vector kernel adds partial P: with one partial (RMSNorm), `registers`; with two (LayerNorm),
// this thread's columns of the P-th array of shared memory after w's (`after_w`), zeroed here.
template <typename Terms, int P, typename C>
__device__ __forceinline__ auto twoVectorPartial(C *registers, C *after_w) {
    if constexpr (Terms::kPartials == 1) {
        return registers;
    } else {
        const SharedColumns<C, kMaxPackedThreads> partial{after_w + P * kTwoVectorArray + threadIdx.x};
#pragma unroll
        for (int i = 0; i < 2 * kPackedItems; ++i) partial[i] = C(0);
        return partial;
    }
}

template <typename Terms, typename T, typename W, typename S>
__global__ void __launch_bounds__(kMaxPackedThreads, 1)
    packedTwoVectorRowsKernel(Args<T, W, S> args, size_t rows_per_cta, bool vectors) {
    using C = ComputeOf<T>;
    constexpr int kVecs = 2;
    __shared__ CtaSumSlots slots;
    const int t = threadIdx.x, lane = t % 32, warp = t / 32, warps = blockDim.x / 32;
    auto colOf = [&](int v) { return static_cast<size_t>(v * kMaxPackedThreads + t) * kPackedItems; };
    const size_t first = blockIdx.x * rows_per_cta;
    const size_t last = min(first + rows_per_cta, args.rows);
    C *const shared = nvidia::dynamicShared<C>();
    const SharedColumns<C, kMaxPackedThreads> w{shared + t};
    loadWeights<kMaxPackedThreads, kPackedItems, kVecs * kPackedItems>(args, 0, t, w); // w[8v + e]: colOf(v) + e
    C registers[Terms::kPartials == 1 ? kVecs * kPackedItems : 1] = {}; // RMSNorm's partial, [8v + e] as w's
    C *const after_w = shared + kTwoVectorArray;
    const auto partial0 = twoVectorPartial<Terms, 0>(registers, after_w);
    const auto partial1 = twoVectorPartial<Terms, Terms::kPartials - 1>(registers, after_w); // partial0's with one
    for (size_t row = first; row < last; ++row) {
        const int parity = static_cast<int>((row - first) & 1);
        uint4 a_raw[kVecs], b_raw[kVecs];
        loadPackedVectors(args.a + flatOffset(args.a_rows, row), args.b + flatOffset(args.b_rows, row), colOf, args.dim,
                          vectors, a_raw, b_raw);
        // Each vector is widened where it is used, and again after the barrier rather than kept live across it.
        const Pair<C> centering = centeringOf<Terms>(args, row);
        const Pair<C> thread_sums = packedVectorSums<Terms, T>(a_raw, b_raw, centering, w);
        const float2 part = warpAllSum(make_float2(thread_sums.first, thread_sums.second));
        if (lane == 0) slots[parity][warp] = part;
        __syncthreads();
        const float2 sums = warpAllSum(lane < warps ? slots[parity][lane] : make_float2(0.f, 0.f));
        const auto k = rowCoefficients<Terms>(args, row, sums.x, sums.y);
        packedVectorOutputs<Terms>(args.out + flatOffset(args.out_rows, row), colOf, args.dim, vectors, a_raw, b_raw,
                                   centering, w, k, partial0, partial1);
    }
    storePackedPartials<Terms, kVecs>(args, blockIdx.x, colOf, partial0, partial1);
}

// Warp rows: F16/BF16 rows of at most kMaxWarpRowDim elements whose rows start 16-byte vectors apart. A CTA of
// kWarpRowThreads threads takes a contiguous range of rows, a group of G lanes of a warp a row at a time (G = 4..32,
// the fewest whose vectors hold the row: a warp past 128 elements), each group every kGroups-th row: lane l holds
// vectors l, l + G, .. (K of them) of a and b as raw 16-bit values and w's columns of those vectors widened in
// registers, so a row needs no CTA barrier (the group's butterfly is its whole reduction). The row sums and
// coefficients are F32, as in packedRowsKernel. At the end a warp's groups add their partials by a butterfly across
// groups, the warps add theirs in warp order through shared memory (the CTA's one barrier), and the CTA writes one
// partial row. On an H200 the warp-a-row form (scripts/gpu_variants `warp16`, `warp32`) took 0.78-0.91 of copy at
// D 512 and 1024, 0.031 ms against the CTA-a-row form's 0.035 at 32768x512; shorter rows had the one-pass kernel (a
// warp a row too, but 16 widened elements a lane and F64 sums). At D 1024 the two forms were level, and K = 4 holds
// 64 partials a lane for LayerNorm: D 1024 stays with the packed plan. Groups under a warp (rows of 128 and less,
// where a warp a row left lanes idle) are not yet timed on a GPU.
constexpr size_t kMaxWarpRowDim = 512;
constexpr int kWarpRowThreads = 256;

template <typename Terms, typename T, typename W, typename S, int G, int K>
__global__ void __launch_bounds__(kWarpRowThreads, kMinThreadsPerSm / kWarpRowThreads)
    packedWarpRowsKernel(Args<T, W, S> args, size_t rows_per_cta, bool vectors) {
    using C = ComputeOf<T>;
    constexpr int kWarps = kWarpRowThreads / 32, kGroupsPerWarp = 32 / G, kGroups = kWarpRowThreads / G;
    __shared__ C warp_acc[kWarps - 1][Terms::kPartials][K * kPackedItems][G];
    const int lane = threadIdx.x % G, warp = threadIdx.x / 32;
    auto colOf = [&](int v) { return static_cast<size_t>(v * G + lane) * kPackedItems; };
    const size_t first = blockIdx.x * rows_per_cta;
    const size_t last = min(first + rows_per_cta, args.rows);
    C w[K * kPackedItems]; // w[8v + e]: column colOf(v) + e
    loadWeights<G, kPackedItems, K * kPackedItems>(args, 0, lane, w);
    C acc[Terms::kPartials][K * kPackedItems] = {}; // acc[p][8v + e], as w
    // The loop runs while the warp's first group has a row, so every lane of the warp meets each butterfly's
    // shuffles (full-warp masks); a group past the CTA's last row sums zeros and writes nothing.
    const size_t group_in_warp = (threadIdx.x / G) % kGroupsPerWarp;
    for (size_t warp_row = first + static_cast<size_t>(warp) * kGroupsPerWarp; warp_row < last; warp_row += kGroups) {
        const size_t row = warp_row + group_in_warp;
        const bool in_range = row < last;
        uint4 a_raw[K] = {}, b_raw[K] = {};
        Pair<C> centering{C(0), C(1)};
        if (in_range) {
            loadPackedVectors(args.a + flatOffset(args.a_rows, row), args.b + flatOffset(args.b_rows, row), colOf,
                              args.dim, vectors, a_raw, b_raw);
            centering = centeringOf<Terms>(args, row);
        }
        const Pair<C> thread_sums = packedVectorSums<Terms, T>(a_raw, b_raw, centering, w);
        const float2 sums = nvidia::warpAllSum<G>(make_float2(thread_sums.first, thread_sums.second));
        if (in_range) {
            const auto k = rowCoefficients<Terms>(args, row, sums.x, sums.y);
            packedVectorOutputs<Terms>(args.out + flatOffset(args.out_rows, row), colOf, args.dim, vectors, a_raw,
                                       b_raw, centering, w, k, acc[0], acc[Terms::kPartials - 1]);
        }
    }
    if (!anyPartials<Terms>(args)) return; // the same for every thread of the CTA

#pragma unroll
    for (int mask = 16; mask >= G; mask /= 2) { // the warp's groups, the same columns each: none where G == 32
#pragma unroll
        for (int p = 0; p < Terms::kPartials; ++p) {
#pragma unroll
            for (int i = 0; i < K * kPackedItems; ++i) acc[p][i] += __shfl_xor_sync(0xffffffffu, acc[p][i], mask);
        }
    }
    const bool first_group = threadIdx.x % 32 < G; // holds its warp's sums (as does every group of the warp)
    if (warp > 0 && first_group) {
#pragma unroll
        for (int p = 0; p < Terms::kPartials; ++p) {
#pragma unroll
            for (int i = 0; i < K * kPackedItems; ++i) warp_acc[warp - 1][p][i][lane] = acc[p][i];
        }
    }
    __syncthreads();
    if (warp != 0 || !first_group) return;
    for (int g = 0; g < kWarps - 1; ++g) {
#pragma unroll
        for (int p = 0; p < Terms::kPartials; ++p) {
#pragma unroll
            for (int i = 0; i < K * kPackedItems; ++i) acc[p][i] += warp_acc[g][p][i][lane];
        }
    }
    storePackedPartials<Terms, K>(args, blockIdx.x, colOf, acc[0], acc[Terms::kPartials - 1]);
}

// Split pass 1: the two sums of each (row, chunk), in row-major order.
template <typename Terms, typename T, typename W, typename S, int V>
__global__ void __launch_bounds__(kSplitThreads) chunkSumsKernel(Args<T, W, S> args, size_t chunks,
                                                                 double2 *chunk_sums) {
    using C = ComputeOf<T>;
    __shared__ double2 scratch[33];
    const int lane = threadIdx.x;
    for (size_t item = blockIdx.x; item < args.rows * chunks; item += gridDim.x) {
        const size_t row = item / chunks, base = (item % chunks) * kChunk;
        C a[kItems], b[kItems], w[kItems];
        loadColumns<kSplitThreads, V>(args.a + args.a_rows.offset(row), base, lane, args.dim, a);
        loadColumns<kSplitThreads, V>(args.b + args.b_rows.offset(row), base, lane, args.dim, b);
        prepareB<Terms>(args, row, b);
        loadWeights<kSplitThreads, V>(args, base, lane, w);
        double2 sums = nvidia::blockSum(threadSums<Terms>(a, b, w), scratch);
        if (lane == 0) chunk_sums[item] = sums;
    }
}

// Split: a warp per row adds its chunk sums (lane l takes chunks l, l+32, ...; then a fixed tree).
// static: this header is compiled into several files, each keeping its own copy.
static __global__ void __launch_bounds__(256) rowSumsKernel(const double2 *chunk_sums, size_t rows, size_t chunks,
                                                            double2 *row_sums) {
    const int lane = threadIdx.x % 32;
    const size_t warps = static_cast<size_t>(gridDim.x) * (blockDim.x / 32);
    for (size_t row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32; row < rows; row += warps) {
        double2 sum = make_double2(0.0, 0.0);
        for (size_t chunk = lane; chunk < chunks; chunk += 32) sum = nvidia::add(sum, chunk_sums[row * chunks + chunk]);
        sum = nvidia::warpSumToLane0(sum);
        if (lane == 0) row_sums[row] = sum;
    }
}

// Split pass 2: CTA (row block, chunk) writes the output of its chunk for its rows and keeps its columns'
// partials in registers.
template <typename Terms, typename T, typename W, typename S, int V>
__global__ void __launch_bounds__(kSplitThreads, kMinThreadsPerSm / kSplitThreads)
    splitOutputKernel(Args<T, W, S> args, size_t chunks, size_t rows_per_block, const double2 *row_sums) {
    using C = ComputeOf<T>;
    const int lane = threadIdx.x;
    const size_t row_block = blockIdx.x / chunks, base = (blockIdx.x % chunks) * kChunk;
    const size_t first = row_block * rows_per_block, last = min(first + rows_per_block, args.rows);
    C w[kItems], acc[Terms::kPartials][kItems] = {};
    loadWeights<kSplitThreads, V>(args, base, lane, w);
    for (size_t row = first; row < last; ++row) {
        C a[kItems], b[kItems];
        loadColumns<kSplitThreads, V>(args.a + args.a_rows.offset(row), base, lane, args.dim, a);
        loadColumns<kSplitThreads, V>(args.b + args.b_rows.offset(row), base, lane, args.dim, b);
        prepareB<Terms>(args, row, b);
        const auto k = rowCoefficients<Terms>(args, row, row_sums[row]);
        emitColumns<Terms, kSplitThreads, V>(args.out + args.out_rows.offset(row), base, lane, args.dim, a, b, w, k,
                                             acc);
    }
    storePartials<Terms, kSplitThreads, V>(args, row_block, base, lane, acc);
}

// out[j * out_stride] = sum of partials[p * dim + j] over p in [0, count): each column's partials are split
// among kFinalizeDepth threads in a fixed interleave, then added in thread order. count == 0 writes zeros.
template <typename C, typename W>
__global__ void __launch_bounds__(kFinalizeWidth *kFinalizeDepth)
    sumPartialsKernel(const C *partials, size_t count, size_t dim, W *out, ptrdiff_t out_stride) {
    __shared__ double lanes[kFinalizeDepth][kFinalizeWidth];
    const size_t col = static_cast<size_t>(blockIdx.x) * kFinalizeWidth + threadIdx.x;
    double sum = 0.0;
    if (col < dim) {
        for (size_t p = threadIdx.y; p < count; p += kFinalizeDepth) sum += partials[p * dim + col];
    }
    lanes[threadIdx.y][threadIdx.x] = sum;
    __syncthreads();
    if (threadIdx.y == 0 && col < dim) {
        double total = 0.0;
        for (int y = 0; y < kFinalizeDepth; ++y) total += lanes[y][threadIdx.x];
        out[static_cast<ptrdiff_t>(col) * out_stride] = nvidia::narrow<W>(static_cast<ComputeOf<W>>(total));
    }
}

inline size_t ceilDiv(size_t a, size_t b) { return (a + b - 1) / b; }

// Fixed at descriptor creation from the shape, the wanted outputs and the device, so the partial layout (and
// thus every sum's order) is the same on every call.
struct Plan {
    bool split = false;
    int packed_threads = 0;      // packed plan: threads per CTA (a row each); 0: another plan
    nvidia::LaneGroups warp_rows; // warp rows plan: G and K of packedWarpRowsKernel; vectors 0: another plan
    int group = 32;              // one pass: threads per row
    size_t ctas = 0;             // one pass and packed: CTAs = partial rows
    size_t rows_per_cta = 1;     // one pass and packed
    size_t chunks = 1;           // split
    size_t row_blocks = 0;       // split: partial rows
    size_t rows_per_block = 1;   // split
    size_t chunk_sum_ctas = 1;   // split pass 1 grid
    size_t rows = 0, dim = 0;
    int partial_arrays = 0;      // wanted per-column outputs
    size_t compute_size = 4;     // bytes of a partial

    size_t partialCount() const { return split ? row_blocks : ctas; }
    size_t partialBytes() const { return nvidia::alignUp(partial_arrays * partialCount() * dim * compute_size); }
    size_t chunkSumBytes() const { return split ? nvidia::alignUp(rows * chunks * sizeof(double2)) : 0; }
    size_t rowSumBytes() const { return split ? nvidia::alignUp(rows * sizeof(double2)) : 0; }
    // + kWorkspaceAlign: the caller's workspace pointer is aligned up before use. None when nothing is kept.
    size_t workspaceBytes() const {
        const size_t used = partialBytes() + chunkSumBytes() + rowSumBytes();
        return dim == 0 || used == 0 ? 0 : nvidia::kWorkspaceAlign + used;
    }
    // Whether those sums overflow size_t (a shape too large for any workspace): the descriptor is refused.
    bool workspaceOverflows() const {
        using infini::CheckedSize;
        const CheckedSize used = CheckedSize(partial_arrays) * partialCount() * dim * compute_size +
                                 (split ? CheckedSize(rows) * chunks * sizeof(double2) : CheckedSize(0)) +
                                 (split ? CheckedSize(rows) * sizeof(double2) : CheckedSize(0)) +
                                 CheckedSize(4) * nvidia::kWorkspaceAlign;
        return used.overflowed();
    }
};

// The row scalar's type for these data and parameter types.
template <typename Terms, typename T, typename W>
using ScalarOf = typename Terms::template Scalar<T, W>;

template <typename Terms, typename T, typename W>
infiniStatus_t occupancyOf(int group, int *ctas_per_sm) {
    using S = ScalarOf<Terms, T, W>;
    constexpr int V = nvidia::kVec<T>;
    switch (group) {
    case 32: return nvidia::residentCtas(onePassKernel<Terms, T, W, S, 32, V>, ctaThreads(32), ctas_per_sm);
    case 128: return nvidia::residentCtas(onePassKernel<Terms, T, W, S, 128, V>, 128, ctas_per_sm);
    case 256: return nvidia::residentCtas(onePassKernel<Terms, T, W, S, 256, V>, 256, ctas_per_sm);
    default: return nvidia::residentCtas(onePassKernel<Terms, T, W, S, 512, V>, 512, ctas_per_sm);
    }
}

// The packed kernel's form for rows of `dim`: its CTA size class for `threads` threads a row (its static shared w
// is sized by the class), or two vectors a thread past kMaxOneVectorDim; body(kernel, dynamic shared bytes).
template <typename Terms, typename T, typename W, typename Body>
infiniStatus_t withPackedKernel(size_t dim, int threads, Body &&body) {
    using S = ScalarOf<Terms, T, W>;
    if (dim > kMaxOneVectorDim) {
        return body(packedTwoVectorRowsKernel<Terms, T, W, S>, packedTwoVectorSharedBytes<Terms, T>());
    }
    if (threads <= 128) return body(packedRowsKernel<Terms, T, W, S, 128>, size_t(0));
    if (threads <= 256) return body(packedRowsKernel<Terms, T, W, S, 256>, size_t(0));
    if (threads <= 512) return body(packedRowsKernel<Terms, T, W, S, 512>, size_t(0));
    return body(packedRowsKernel<Terms, T, W, S, 1024>, size_t(0));
}

// The warp rows kernel for `groups` (G lanes a row, K vectors a lane): body(kernel).
template <typename Terms, typename T, typename W, typename Body>
infiniStatus_t withWarpRowsKernel(nvidia::LaneGroups groups, Body &&body) {
    using S = ScalarOf<Terms, T, W>;
    return nvidia::withLaneGroups(groups, [&](auto lanes, auto vectors) {
        return body(packedWarpRowsKernel<Terms, T, W, S, decltype(lanes)::value, decltype(vectors)::value>);
    });
}

// Threads a row of the packed plan: one per vector, in whole warps; kMaxPackedThreads past kMaxOneVectorDim.
inline int packedThreadsOf(size_t dim) {
    return dim > kMaxOneVectorDim ? kMaxPackedThreads : nvidia::packedThreads(dim);
}

// packable_rows: the rows of out, a and b are one stride apart, a multiple of 16 bytes (the packed plan's rows).
template <typename Terms, typename T, typename W>
infiniStatus_t makePlanFor(size_t rows, size_t dim, int partial_arrays, bool packable_rows, int device_id,
                           Plan *plan) {
    Plan p;
    p.rows = rows;
    p.dim = dim;
    p.partial_arrays = partial_arrays;
    p.compute_size = sizeof(ComputeOf<T>);
    if (dim == 0) {
        *plan = p;
        return INFINI_STATUS_SUCCESS;
    }
    const nvidia::DeviceScope device_scope(device_id);
    INFINI_CHECK(device_scope.status());
    int sms = 1;
    INFINI_CHECK(nvidia::multiprocessorCount(device_id, &sms));

    p.group = 32;
    while (static_cast<size_t>(p.group) * kItems < dim && p.group < kMaxGroup) p.group = p.group == 32 ? 128 : p.group * 2;
    const size_t groups_per_cta = ctaThreads(p.group) / p.group;
    const size_t chunks = ceilDiv(dim, kChunk);
    // The packed kernel exists for 16-bit data alone.
    // Two vectors a thread (past kMaxOneVectorDim) where the device gives a CTA the kernel's shared memory (w's
    // 64 KiB; LayerNorm's 192 with its partials': an H100/H200, not an A100).
    bool two_vectors_fit = false;
    if (dim > kMaxOneVectorDim) {
        INFINI_CHECK(nvidia::sharedFits(device_id, packedTwoVectorSharedBytes<Terms, T>(), sizeof(CtaSumSlots),
                                        &two_vectors_fit));
    }
    const size_t max_packed = two_vectors_fit ? kMaxPackedDim : kMaxOneVectorDim;
    const bool packable = sizeof(T) == 2 && packable_rows;
    const bool warp_rows = packable && dim <= kMaxWarpRowDim;
    const bool packs = packable && !warp_rows && dim >= kMinPackedDim && dim <= max_packed;
    // Long rows do not fit in registers (but packed); rows too few to give each SM a CTA are better cut in chunks.
    p.split = (dim > kMaxRegisterDim && !packs) ||
              (chunks >= 2 && ceilDiv(rows, groups_per_cta) < static_cast<size_t>(sms));

    if (!p.split) {
        int per_sm = 1;
        size_t rows_at_once = groups_per_cta; // rows a CTA holds at a time
        if constexpr (sizeof(T) == 2) {
            if (warp_rows) {
                p.warp_rows = nvidia::LaneGroups::of(dim);
                rows_at_once = kWarpRowThreads / p.warp_rows.lanes;
                INFINI_CHECK((withWarpRowsKernel<Terms, T, W>(p.warp_rows, [&](auto kernel) {
                    return nvidia::residentCtas(kernel, kWarpRowThreads, &per_sm);
                })));
            }
            if (packs) {
                p.packed_threads = packedThreadsOf(dim);
                rows_at_once = 1;
                INFINI_CHECK((withPackedKernel<Terms, T, W>(dim, p.packed_threads, [&](auto kernel, size_t shared) {
                    // Over 48 KiB of dynamic shared memory a kernel must be allowed it (once; here, at planning).
                    if (shared > 0) CHECK_CUDA(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                                    static_cast<int>(shared)));
                    return nvidia::residentCtas(kernel, p.packed_threads, &per_sm, shared);
                })));
            }
        }
        if (p.packed_threads == 0 && p.warp_rows.vectors == 0) INFINI_CHECK((occupancyOf<Terms, T, W>(p.group, &per_sm)));
        const size_t resident = static_cast<size_t>(sms) * per_sm;
        p.ctas = std::min(ceilDiv(rows, rows_at_once), resident);
        if (p.ctas > 0) {
            p.rows_per_cta = ceilDiv(rows, p.ctas);
            p.ctas = ceilDiv(rows, p.rows_per_cta);
        }
    } else {
        int per_sm = 1;
        constexpr int V = nvidia::kVec<T>;
        INFINI_CHECK(nvidia::residentCtas(splitOutputKernel<Terms, T, W, ScalarOf<Terms, T, W>, V>, kSplitThreads,
                                          &per_sm));
        const size_t resident = static_cast<size_t>(sms) * per_sm;
        p.chunks = chunks;
        p.row_blocks = std::min(rows, std::max<size_t>(1, ceilDiv(resident, chunks)));
        if (p.row_blocks > 0) {
            p.rows_per_block = ceilDiv(rows, p.row_blocks);
            p.row_blocks = ceilDiv(rows, p.rows_per_block);
        }
        p.chunk_sum_ctas = std::max<size_t>(1, std::min(rows * chunks, resident * 4));
    }
    *plan = p;
    return INFINI_STATUS_SUCCESS;
}

template <typename Terms, typename T, typename W, typename S, int V>
infiniStatus_t launchOnePass(const Plan &plan, const Args<T, W, S> &args, cudaStream_t stream) {
    const dim3 grid(static_cast<unsigned>(plan.ctas));
    switch (plan.group) {
    case 32: onePassKernel<Terms, T, W, S, 32, V><<<grid, ctaThreads(32), 0, stream>>>(args, plan.rows_per_cta); break;
    case 128: onePassKernel<Terms, T, W, S, 128, V><<<grid, 128, 0, stream>>>(args, plan.rows_per_cta); break;
    case 256: onePassKernel<Terms, T, W, S, 256, V><<<grid, 256, 0, stream>>>(args, plan.rows_per_cta); break;
    default: onePassKernel<Terms, T, W, S, 512, V><<<grid, 512, 0, stream>>>(args, plan.rows_per_cta); break;
    }
    return nvidia::launchStatus();
}

// The kernel of the size class whose occupancy planned the grid (withPackedKernel, in both).
template <typename Terms, typename T, typename W, typename S>
infiniStatus_t launchPacked(const Plan &plan, const Args<T, W, S> &args, bool vectors, cudaStream_t stream) {
    const dim3 grid(static_cast<unsigned>(plan.ctas));
    const int threads = plan.packed_threads;
    const size_t rows_per_cta = plan.rows_per_cta;
    return withPackedKernel<Terms, T, W>(plan.dim, threads, [&](auto kernel, size_t shared) {
        kernel<<<grid, threads, shared, stream>>>(args, rows_per_cta, vectors);
        return nvidia::launchStatus();
    });
}

template <typename Terms, typename T, typename W, typename S>
infiniStatus_t launchWarpRows(const Plan &plan, const Args<T, W, S> &args, bool vectors, cudaStream_t stream) {
    const dim3 grid(static_cast<unsigned>(plan.ctas));
    const size_t rows_per_cta = plan.rows_per_cta;
    return withWarpRowsKernel<Terms, T, W>(plan.warp_rows, [&](auto kernel) {
        kernel<<<grid, kWarpRowThreads, 0, stream>>>(args, rows_per_cta, vectors);
        return nvidia::launchStatus();
    });
}

template <typename Terms, typename T, typename W, typename S, int V>
infiniStatus_t launchSplit(const Plan &plan, const Args<T, W, S> &args, double2 *chunk_sums, double2 *row_sums,
                           cudaStream_t stream) {
    chunkSumsKernel<Terms, T, W, S, V><<<static_cast<unsigned>(plan.chunk_sum_ctas), kSplitThreads, 0, stream>>>(
        args, plan.chunks, chunk_sums);
    INFINI_CHECK(nvidia::launchStatus());
    const size_t row_sum_ctas = std::min<size_t>(ceilDiv(plan.rows, 8), 65535);
    rowSumsKernel<<<static_cast<unsigned>(row_sum_ctas), 256, 0, stream>>>(chunk_sums, plan.rows, plan.chunks, row_sums);
    INFINI_CHECK(nvidia::launchStatus());
    splitOutputKernel<Terms, T, W, S, V><<<static_cast<unsigned>(plan.row_blocks * plan.chunks), kSplitThreads, 0,
                                           stream>>>(args, plan.chunks, plan.rows_per_block, row_sums);
    return nvidia::launchStatus();
}

template <typename C, typename W>
infiniStatus_t launchSumPartials(const C *partials, size_t count, size_t dim, W *out, ptrdiff_t out_stride,
                                 cudaStream_t stream) {
    const dim3 block(kFinalizeWidth, kFinalizeDepth);
    sumPartialsKernel<C, W><<<static_cast<unsigned>(ceilDiv(dim, kFinalizeWidth)), block, 0, stream>>>(
        partials, count, dim, out, out_stride);
    return nvidia::launchStatus();
}

// A row backward for one op (its Terms), planned at descriptor creation and run on each calculate.
template <typename Terms>
class Driver {
  public:
    // wanted[p]: whether per-column output p will be computed (its partials get workspace).
    // row_layouts: those of out, a and b (whether rows may use 16-byte vectors).
    static infiniStatus_t make(infiniDtype_t dtype, infiniDtype_t parameter_dtype, size_t rows, size_t dim,
                               const bool (&wanted)[Terms::kPartials], std::initializer_list<RowLayout> row_layouts,
                               int device_id, Driver *driver) {
        driver->dtype_ = dtype;
        driver->parameter_dtype_ = parameter_dtype;
        driver->vector_ok_ = vectorStrides(infini::dtypeSize(dtype), row_layouts);
        int partial_arrays = 0;
        for (int p = 0; p < Terms::kPartials; ++p) {
            driver->wanted_[p] = wanted[p];
            partial_arrays += wanted[p] ? 1 : 0;
        }
        INFINI_CHECK(nvidia::withDataAndParameterTypes(dtype, parameter_dtype, [&](auto data_tag, auto parameter_tag) {
            return makePlanFor<Terms, decltype(data_tag), decltype(parameter_tag)>(
                rows, dim, partial_arrays, driver->vector_ok_ && flatRows(row_layouts), device_id, &driver->plan_);
        }));
        return driver->plan_.workspaceOverflows() ? INFINI_STATUS_BAD_TENSOR_SHAPE : INFINI_STATUS_SUCCESS;
    }

    size_t workspaceBytes() const { return plan_.workspaceBytes(); }

    infiniStatus_t run(const RowCall &call, void *workspace, cudaStream_t stream) const {
        return nvidia::withDataAndParameterTypes(dtype_, parameter_dtype_, [&](auto data_tag, auto parameter_tag) {
            return runTyped<decltype(data_tag), decltype(parameter_tag)>(call, workspace, stream);
        });
    }

  private:
    template <typename T, typename W>
    infiniStatus_t runTyped(const RowCall &call, void *workspace, cudaStream_t stream) const {
        using C = ComputeOf<T>;
        using S = ScalarOf<Terms, T, W>;
        if (plan_.dim == 0) return INFINI_STATUS_SUCCESS;
        Args<T, W, S> args{static_cast<T *>(call.out),
                           static_cast<const T *>(call.a),
                           static_cast<const T *>(call.b),
                           static_cast<const W *>(call.w),
                           static_cast<const S *>(call.scalar),
                           call.out_rows,
                           call.a_rows,
                           call.b_rows,
                           call.scalar_rows,
                           call.w_stride,
                           plan_.rows,
                           plan_.dim,
                           call.epsilon,
                           {},
                           static_cast<const S *>(call.b_mean),
                           call.b_mean_rows};
        // Workspace regions, in order: the wanted partial arrays, then (split) chunk sums and row sums.
        char *base = nvidia::alignedBase(workspace);
        const size_t partial_elements = plan_.partialCount() * plan_.dim;
        size_t next = 0;
        for (int p = 0; p < Terms::kPartials; ++p) {
            if (!wanted_[p]) continue;
            args.partials[p] = reinterpret_cast<C *>(base) + next * partial_elements;
            ++next;
        }
        auto *chunk_sums = reinterpret_cast<double2 *>(base + plan_.partialBytes());
        auto *row_sums = reinterpret_cast<double2 *>(base + plan_.partialBytes() + plan_.chunkSumBytes());

        if (plan_.partialCount() > 0) {
            const bool vectors = vector_ok_ && nvidia::aligned16(args.out) && nvidia::aligned16(args.a) &&
                                 nvidia::aligned16(args.b);
            INFINI_CHECK(launchRows(args, vectors, chunk_sums, row_sums, stream));
        }
        for (int p = 0; p < Terms::kPartials; ++p) {
            if (!wanted_[p]) continue;
            INFINI_CHECK(launchSumPartials(args.partials[p], plan_.partialCount(), plan_.dim,
                                           static_cast<W *>(call.outs[p]), call.out_strides[p], stream));
        }
        return INFINI_STATUS_SUCCESS;
    }

    // The plan's row kernels (partials and outputs; the partials' sums follow in runTyped).
    template <typename T, typename W, typename S>
    infiniStatus_t launchRows(const Args<T, W, S> &args, bool vectors, double2 *chunk_sums, double2 *row_sums,
                              cudaStream_t stream) const {
        constexpr int V = nvidia::kVec<T>;
        if constexpr (sizeof(T) == 2) { // the packed kernel exists for 16-bit data alone
            if (plan_.warp_rows.vectors > 0) return launchWarpRows<Terms>(plan_, args, vectors, stream);
            if (plan_.packed_threads > 0) return launchPacked<Terms>(plan_, args, vectors, stream);
        }
        if (plan_.split) {
            return vectors ? launchSplit<Terms, T, W, S, V>(plan_, args, chunk_sums, row_sums, stream)
                           : launchSplit<Terms, T, W, S, 1>(plan_, args, chunk_sums, row_sums, stream);
        }
        return vectors ? launchOnePass<Terms, T, W, S, V>(plan_, args, stream)
                       : launchOnePass<Terms, T, W, S, 1>(plan_, args, stream);
    }

    Plan plan_;
    infiniDtype_t dtype_ = INFINI_DTYPE_F32, parameter_dtype_ = INFINI_DTYPE_F32;
    bool vector_ok_ = false;
    bool wanted_[Terms::kPartials] = {};
};

} // namespace op::row_backward

#endif
