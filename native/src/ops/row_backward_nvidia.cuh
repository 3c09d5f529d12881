// CUDA kernels shared by the row-normalizing backward ops (RMSNorm, LayerNorm). Per row, an op reduces two
// sums over the row, turns them into per-row coefficients, writes the row's output and adds per-column terms
// into F32 partials; `Terms` (see rms_norm_backward_nvidia.cu) says which. Two plans:
//  - one pass (D <= kMaxRegisterDim): a warp or a block per row keeps the row in registers between its
//    reduction and its output; each CTA owns a fixed contiguous range of rows and keeps its column partials
//    in registers until the end;
//  - split (long rows, or too few rows to fill the GPU): rows are cut in chunks of kChunk columns; pass 1
//    writes per-chunk sums, a warp per row adds them in order, pass 2 re-reads the row (from L2 when it fits).
// Partials are F32, one row of length D per CTA (or row block), summed in fixed order by sumPartials: no atomics.
#ifndef INFINIOP_OPS_ROW_BACKWARD_NVIDIA_CUH
#define INFINIOP_OPS_ROW_BACKWARD_NVIDIA_CUH

#include "common/status.h"
#include "devices/nvidia/nvidia_reduce.cuh"
#include "devices/nvidia/nvidia_status.h"
#include "devices/nvidia/nvidia_types.cuh"
#include "ops/rows.h"

#include <algorithm>
#include <initializer_list>

namespace op::row_backward {

using nvidia::RowOffsets;

constexpr int kItems = 16;                         // elements of a row held per thread
constexpr int kMaxGroup = 512;                     // threads per row in the one-pass plan
constexpr size_t kMaxRegisterDim = kMaxGroup * kItems;
constexpr int kSplitThreads = 256;
constexpr size_t kChunk = kSplitThreads * kItems; // columns per CTA in the split plan
constexpr int kFinalizeWidth = 32, kFinalizeDepth = 8;
constexpr size_t kAlign = 256; // of every workspace region

// Threads per CTA for a group (threads per row) of G: small groups share a CTA of 128.
__host__ __device__ constexpr int ctaThreads(int group) { return group < 128 ? 128 : group; }
// Resident threads per SM the kernels ask for (at most 128 registers each): enough loads in flight to stream.
constexpr int kMinThreadsPerSm = 512;

inline RowOffsets offsetsOf(const RowLayout &layout) {
    const RowLayout::TwoLevel two = layout.twoLevel();
    return RowOffsets{two.inner, two.outer_stride, two.inner_stride};
}

// Everything a kernel needs; `a`, `b` are the two row inputs, `w` the per-column vector, `scalar` one value
// per row (LayerNorm's std; unused by RMSNorm).
template <typename T>
struct Args {
    T *out;
    const T *a, *b, *w, *scalar;
    RowOffsets out_rows, a_rows, b_rows, scalar_rows;
    ptrdiff_t w_stride;
    size_t rows, dim;
    float *partials;       // [kPartials][partial count][dim]
    size_t partial_stride; // partial count * dim
};

// Loads this thread's kItems columns of a row: vector k of V elements starts at column base + (k*G + lane)*V.
template <int G, int V, typename T>
__device__ __forceinline__ void loadColumns(const T *row, size_t base, int lane, size_t dim, float *out) {
#pragma unroll
    for (int k = 0; k < kItems / V; ++k) {
        nvidia::loadSpan<V>(row, base + static_cast<size_t>(k * G + lane) * V, dim, out + k * V);
    }
}

template <typename Terms, typename T>
__device__ __forceinline__ float rowScalar(const Args<T> &args, size_t row) {
    if constexpr (Terms::kRowScalar) {
        return nvidia::toFloat(args.scalar[args.scalar_rows(row)]);
    } else {
        return 0.0f;
    }
}

// The thread's share of the two row sums (zero-padded columns contribute zero terms).
template <typename Terms>
__device__ __forceinline__ double2 threadSums(const float *a, const float *b, const float *w) {
    float s1 = 0.0f, s2 = 0.0f;
#pragma unroll
    for (int e = 0; e < kItems; ++e) {
        float2 t = Terms::terms(a[e], b[e], w[e]);
        s1 += t.x;
        s2 += t.y;
    }
    return make_double2(s1, s2);
}

// Writes the output of this thread's columns of one row and adds its partial terms. In place (out == a) is
// safe: the whole row was read before.
template <typename Terms, int G, int V, typename T>
__device__ __forceinline__ void emitColumns(T *out_row, size_t base, int lane, size_t dim, const float *a,
                                            const float *b, const float *w, const typename Terms::Row &k,
                                            float (&acc)[Terms::kPartials][kItems]) {
    float result[kItems];
#pragma unroll
    for (int e = 0; e < kItems; ++e) {
        result[e] = Terms::out(a[e], b[e], w[e], k);
        const float2 t = Terms::partialTerms(a[e], b[e], k); // zero-padded columns add zero
        acc[0][e] += t.x;
        if constexpr (Terms::kPartials > 1) acc[Terms::kPartials - 1][e] += t.y;
    }
#pragma unroll
    for (int j = 0; j < kItems / V; ++j) {
        nvidia::storeSpan<V>(out_row, base + static_cast<size_t>(j * G + lane) * V, dim, result + j * V);
    }
}

template <typename Terms, int G, int V, typename T>
__device__ __forceinline__ void storePartials(const Args<T> &args, size_t slot, size_t base, int lane,
                                              const float (&acc)[Terms::kPartials][kItems]) {
#pragma unroll
    for (int p = 0; p < Terms::kPartials; ++p) {
        float *partial = args.partials + p * args.partial_stride + slot * args.dim;
#pragma unroll
        for (int e = 0; e < kItems; ++e) {
            size_t col = base + static_cast<size_t>((e / V) * G + lane) * V + e % V;
            if (col < args.dim) partial[col] = acc[p][e];
        }
    }
}

// One pass: CTA `blockIdx.x` owns rows [blockIdx.x * rows_per_cta, +rows_per_cta); each group of G threads
// takes every (CTA threads / G)-th of them and holds a whole row (D <= G * kItems) in registers.
template <typename Terms, typename T, int G, int V>
__global__ void __launch_bounds__(ctaThreads(G), kMinThreadsPerSm / ctaThreads(G)) onePassKernel(Args<T> args, size_t rows_per_cta) {
    constexpr int kGroups = ctaThreads(G) / G;
    __shared__ double2 scratch[G == 32 ? 1 : 33];
    __shared__ float group_acc[kGroups > 1 ? kGroups - 1 : 1][Terms::kPartials][kItems][kGroups > 1 ? G : 1];
    const int lane = threadIdx.x % G, group = threadIdx.x / G;
    const size_t first = blockIdx.x * rows_per_cta;
    const size_t last = min(first + rows_per_cta, args.rows);

    float w[kItems], acc[Terms::kPartials][kItems] = {};
#pragma unroll
    for (int e = 0; e < kItems; ++e) {
        size_t col = static_cast<size_t>((e / V) * G + lane) * V + e % V;
        w[e] = col < args.dim ? nvidia::toFloat(args.w[static_cast<ptrdiff_t>(col) * args.w_stride]) : 0.0f;
    }

    for (size_t row = first + group; row < last; row += kGroups) {
        float a[kItems], b[kItems];
        loadColumns<G, V>(args.a + args.a_rows(row), 0, lane, args.dim, a);
        loadColumns<G, V>(args.b + args.b_rows(row), 0, lane, args.dim, b);
        double2 sums = threadSums<Terms>(a, b, w);
        if constexpr (G == 32) {
            sums = nvidia::warpSum(sums);
        } else {
            sums = nvidia::blockSum(sums, scratch); // the whole CTA is one group here
        }
        const auto k = Terms::row(sums.x, sums.y, args.dim, rowScalar<Terms>(args, row));
        emitColumns<Terms, G, V>(args.out + args.out_rows(row), 0, lane, args.dim, a, b, w, k, acc);
    }

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

// Split pass 1: the two sums of each (row, chunk), in row-major order.
template <typename Terms, typename T, int V>
__global__ void __launch_bounds__(kSplitThreads) chunkSumsKernel(Args<T> args, size_t chunks, double2 *chunk_sums) {
    __shared__ double2 scratch[33];
    const int lane = threadIdx.x;
    for (size_t item = blockIdx.x; item < args.rows * chunks; item += gridDim.x) {
        const size_t row = item / chunks, base = (item % chunks) * kChunk;
        float a[kItems], b[kItems], w[kItems];
        loadColumns<kSplitThreads, V>(args.a + args.a_rows(row), base, lane, args.dim, a);
        loadColumns<kSplitThreads, V>(args.b + args.b_rows(row), base, lane, args.dim, b);
#pragma unroll
        for (int e = 0; e < kItems; ++e) {
            size_t col = base + static_cast<size_t>((e / V) * kSplitThreads + lane) * V + e % V;
            w[e] = col < args.dim ? nvidia::toFloat(args.w[static_cast<ptrdiff_t>(col) * args.w_stride]) : 0.0f;
        }
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
template <typename Terms, typename T, int V>
__global__ void __launch_bounds__(kSplitThreads, kMinThreadsPerSm / kSplitThreads) splitOutputKernel(Args<T> args, size_t chunks, size_t rows_per_block,
                                                                   const double2 *row_sums) {
    const int lane = threadIdx.x;
    const size_t row_block = blockIdx.x / chunks, base = (blockIdx.x % chunks) * kChunk;
    const size_t first = row_block * rows_per_block, last = min(first + rows_per_block, args.rows);
    float w[kItems], acc[Terms::kPartials][kItems] = {};
#pragma unroll
    for (int e = 0; e < kItems; ++e) {
        size_t col = base + static_cast<size_t>((e / V) * kSplitThreads + lane) * V + e % V;
        w[e] = col < args.dim ? nvidia::toFloat(args.w[static_cast<ptrdiff_t>(col) * args.w_stride]) : 0.0f;
    }
    for (size_t row = first; row < last; ++row) {
        float a[kItems], b[kItems];
        loadColumns<kSplitThreads, V>(args.a + args.a_rows(row), base, lane, args.dim, a);
        loadColumns<kSplitThreads, V>(args.b + args.b_rows(row), base, lane, args.dim, b);
        const double2 sums = row_sums[row];
        const auto k = Terms::row(sums.x, sums.y, args.dim, rowScalar<Terms>(args, row));
        emitColumns<Terms, kSplitThreads, V>(args.out + args.out_rows(row), base, lane, args.dim, a, b, w, k, acc);
    }
    storePartials<Terms, kSplitThreads, V>(args, row_block, base, lane, acc);
}

// out[j * out_stride] = sum of partials[p * dim + j] over p in [0, count): each column's partials are split
// among kFinalizeDepth threads in a fixed interleave, then added in thread order. count == 0 writes zeros.
template <typename T>
__global__ void __launch_bounds__(kFinalizeWidth *kFinalizeDepth)
    sumPartialsKernel(const float *partials, size_t count, size_t dim, T *out, ptrdiff_t out_stride) {
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
        out[static_cast<ptrdiff_t>(col) * out_stride] = nvidia::fromFloat<T>(static_cast<float>(total));
    }
}

inline size_t alignUp(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }
inline size_t ceilDiv(size_t a, size_t b) { return (a + b - 1) / b; }

// Fixed at descriptor creation from the shape and the device, so the partial layout (and thus every sum's
// order) is the same on every call.
struct Plan {
    bool split = false;
    int group = 32;              // one pass: threads per row
    size_t ctas = 0;             // one pass: CTAs = partial rows
    size_t rows_per_cta = 1;     // one pass
    size_t chunks = 1;           // split
    size_t row_blocks = 0;       // split: partial rows
    size_t rows_per_block = 1;   // split
    size_t chunk_sum_ctas = 1;   // split pass 1 grid
    size_t rows = 0, dim = 0;
    int partial_arrays = 1;

    size_t partialCount() const { return split ? row_blocks : ctas; }
    size_t partialBytes() const { return alignUp(partial_arrays * partialCount() * dim * sizeof(float)); }
    size_t chunkSumBytes() const { return split ? alignUp(rows * chunks * sizeof(double2)) : 0; }
    size_t rowSumBytes() const { return split ? alignUp(rows * sizeof(double2)) : 0; }
    // + kAlign: the caller's workspace pointer is aligned up before use.
    size_t workspaceBytes() const { return dim == 0 ? 0 : kAlign + partialBytes() + chunkSumBytes() + rowSumBytes(); }
};

template <typename Terms, typename T>
infiniStatus_t occupancyOf(int group, int *ctas_per_sm) {
    constexpr int V = nvidia::kVec<T>;
    switch (group) {
    case 32: return nvidia::residentCtas(onePassKernel<Terms, T, 32, V>, ctaThreads(32), ctas_per_sm);
    case 128: return nvidia::residentCtas(onePassKernel<Terms, T, 128, V>, 128, ctas_per_sm);
    case 256: return nvidia::residentCtas(onePassKernel<Terms, T, 256, V>, 256, ctas_per_sm);
    default: return nvidia::residentCtas(onePassKernel<Terms, T, 512, V>, 512, ctas_per_sm);
    }
}

template <typename Terms, typename T>
infiniStatus_t makePlanFor(size_t rows, size_t dim, int device_id, Plan *plan) {
    Plan p;
    p.rows = rows;
    p.dim = dim;
    p.partial_arrays = Terms::kPartials;
    if (dim == 0) {
        *plan = p;
        return INFINI_STATUS_SUCCESS;
    }
    INFINI_CHECK(nvidia::useDevice(device_id));
    int sms = 1;
    INFINI_CHECK(nvidia::multiprocessorCount(device_id, &sms));

    p.group = 32;
    while (static_cast<size_t>(p.group) * kItems < dim && p.group < kMaxGroup) p.group = p.group == 32 ? 128 : p.group * 2;
    const size_t groups_per_cta = ctaThreads(p.group) / p.group;
    const size_t chunks = ceilDiv(dim, kChunk);
    // Long rows do not fit in registers; rows too few to give each SM a CTA are better cut in chunks.
    p.split = dim > kMaxRegisterDim || (chunks >= 2 && ceilDiv(rows, groups_per_cta) < static_cast<size_t>(sms));

    if (!p.split) {
        int per_sm = 1;
        const infiniStatus_t occupancy = occupancyOf<Terms, T>(p.group, &per_sm);
        INFINI_CHECK(occupancy);
        const size_t resident = static_cast<size_t>(sms) * per_sm;
        p.ctas = std::min(ceilDiv(rows, groups_per_cta), resident);
        if (p.ctas > 0) {
            p.rows_per_cta = ceilDiv(rows, p.ctas);
            p.ctas = ceilDiv(rows, p.rows_per_cta);
        }
    } else {
        int per_sm = 1;
        constexpr int V = nvidia::kVec<T>;
        const infiniStatus_t occupancy = nvidia::residentCtas(splitOutputKernel<Terms, T, V>, kSplitThreads, &per_sm);
        INFINI_CHECK(occupancy);
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

template <typename Terms>
infiniStatus_t makePlan(infiniDtype_t dtype, size_t rows, size_t dim, int device_id, Plan *plan) {
    return nvidia::withNormFloat(dtype, [&](auto tag) { return makePlanFor<Terms, decltype(tag)>(rows, dim, device_id, plan); });
}

template <typename Terms, typename T, int V>
infiniStatus_t launchOnePass(const Plan &plan, const Args<T> &args, cudaStream_t stream) {
    const dim3 grid(static_cast<unsigned>(plan.ctas));
    switch (plan.group) {
    case 32: onePassKernel<Terms, T, 32, V><<<grid, ctaThreads(32), 0, stream>>>(args, plan.rows_per_cta); break;
    case 128: onePassKernel<Terms, T, 128, V><<<grid, 128, 0, stream>>>(args, plan.rows_per_cta); break;
    case 256: onePassKernel<Terms, T, 256, V><<<grid, 256, 0, stream>>>(args, plan.rows_per_cta); break;
    default: onePassKernel<Terms, T, 512, V><<<grid, 512, 0, stream>>>(args, plan.rows_per_cta); break;
    }
    return nvidia::launchStatus();
}

template <typename Terms, typename T, int V>
infiniStatus_t launchSplit(const Plan &plan, const Args<T> &args, double2 *chunk_sums, double2 *row_sums,
                           cudaStream_t stream) {
    chunkSumsKernel<Terms, T, V><<<static_cast<unsigned>(plan.chunk_sum_ctas), kSplitThreads, 0, stream>>>(
        args, plan.chunks, chunk_sums);
    INFINI_CHECK(nvidia::launchStatus());
    const size_t row_sum_ctas = std::min<size_t>(ceilDiv(plan.rows, 8), 65535);
    rowSumsKernel<<<static_cast<unsigned>(row_sum_ctas), 256, 0, stream>>>(chunk_sums, plan.rows, plan.chunks, row_sums);
    INFINI_CHECK(nvidia::launchStatus());
    splitOutputKernel<Terms, T, V><<<static_cast<unsigned>(plan.row_blocks * plan.chunks), kSplitThreads, 0, stream>>>(
        args, plan.chunks, plan.rows_per_block, row_sums);
    return nvidia::launchStatus();
}

template <typename T>
infiniStatus_t launchSumPartials(const float *partials, size_t count, size_t dim, T *out, ptrdiff_t out_stride,
                                 cudaStream_t stream) {
    const dim3 block(kFinalizeWidth, kFinalizeDepth);
    sumPartialsKernel<T><<<static_cast<unsigned>(ceilDiv(dim, kFinalizeWidth)), block, 0, stream>>>(
        partials, count, dim, out, out_stride);
    return nvidia::launchStatus();
}

// Runs a planned row backward. `outs` are the kPartials per-column outputs (grad_w, or grad_weight and
// grad_bias) with their strides; `vector_ok` says whether all row strides are multiples of the vector width.
template <typename Terms, typename T>
infiniStatus_t run(const Plan &plan, bool vector_ok, Args<T> args, void *workspace, T *const *outs,
                   const ptrdiff_t *out_strides, cudaStream_t stream) {
    if (plan.dim == 0) return INFINI_STATUS_SUCCESS;
    char *base = reinterpret_cast<char *>((reinterpret_cast<uintptr_t>(workspace) + kAlign - 1) / kAlign * kAlign);
    args.partials = reinterpret_cast<float *>(base);
    args.partial_stride = plan.partialCount() * plan.dim;
    auto *chunk_sums = reinterpret_cast<double2 *>(base + plan.partialBytes());
    auto *row_sums = reinterpret_cast<double2 *>(base + plan.partialBytes() + plan.chunkSumBytes());

    if (plan.partialCount() > 0) {
        const bool vectors = vector_ok && nvidia::aligned16(args.out) && nvidia::aligned16(args.a) &&
                             nvidia::aligned16(args.b);
        constexpr int V = nvidia::kVec<T>;
        infiniStatus_t status;
        if (plan.split) {
            status = vectors ? launchSplit<Terms, T, V>(plan, args, chunk_sums, row_sums, stream)
                             : launchSplit<Terms, T, 1>(plan, args, chunk_sums, row_sums, stream);
        } else {
            status = vectors ? launchOnePass<Terms, T, V>(plan, args, stream) : launchOnePass<Terms, T, 1>(plan, args, stream);
        }
        INFINI_CHECK(status);
    }
    for (int p = 0; p < Terms::kPartials; ++p) {
        INFINI_CHECK(launchSumPartials(args.partials + p * args.partial_stride, plan.partialCount(), plan.dim, outs[p],
                                       out_strides[p], stream));
    }
    return INFINI_STATUS_SUCCESS;
}

// Whether every row of these layouts starts a 16-byte vector apart from the first, for elements of `size` bytes.
inline bool vectorStrides(size_t element_size, std::initializer_list<RowLayout> layouts) {
    const ptrdiff_t vec = static_cast<ptrdiff_t>(16 / element_size);
    for (const RowLayout &layout : layouts) {
        const RowLayout::TwoLevel l = layout.twoLevel();
        if (l.outer_stride % vec != 0 || l.inner_stride % vec != 0) return false;
    }
    return true;
}

} // namespace op::row_backward

#endif
