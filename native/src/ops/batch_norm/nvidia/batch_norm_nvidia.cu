// BatchNorm forward on NVIDIA GPUs, in up to three launches on the caller's stream, over the backward's tiles
// (ops/batch_norm_tiles_nvidia.cuh: channels-first tiles of a channel, or row tiles of rows of channels; 16-byte
// vectors where the tensors allow them):
//  1. (training) sums: each CTA adds the shifted sums sum(x - r), sum((x - r)^2) of its tile into an F64 partial
//     per channel, r the channel's first element, so a channel whose mean is large against its spread loses
//     nothing to cancellation (the CPU backend's method). A thread sums in the compute type for at most
//     kFlushRows steps of V elements, then adds into F64;
//  2. a warp per channel adds its tiles' partials in a fixed order, writes save_mean / save_invstd, updates the
//     running statistics as PyTorch does (unbiased running variance) and the channel's terms; eval takes the
//     running statistics instead;
//  3. y = (x - r) * scale + shift over the same tiles.
// x is read twice and y written once. Tiles are fixed at creation: results do not depend on timing.
#include "../batch_norm.h"

#include "common/checked.h"
#include "common/moments.h"
#include "devices/nvidia/nvidia_reduce.cuh"
#include "devices/nvidia/nvidia_status.h"
#include "devices/nvidia/nvidia_types.cuh"
#include "devices/nvidia/nvidia_workspace.h"
#include "ops/batch_norm_tiles_nvidia.cuh"

#include <algorithm>

namespace op::batch_norm {
namespace {

using namespace batch_norm_tiles; // kThreads, Tiling, forTileVectors, RowsShape, rowsThread, launchTiles ...
using nvidia::ComputeOf;
using nvidia::alignUp;
using nvidia::kWorkspaceAlign;

// y = (x - reference) * scale + shift, per channel, in the compute type.
template <typename C>
struct ChannelTerms {
    C reference, scale, shift;
};

// The big tensors and their tiling.
template <typename T>
struct Args : Tiling {
    T *y;
    const T *x;
};

// The channel's first element: the reference its shifted sums are taken about.
template <typename T>
__device__ __forceinline__ ComputeOf<T> referenceOf(const Args<T> &args, size_t c, bool rows_of_channels) {
    return nvidia::widen(args.x[rows_of_channels ? c : c * args.length]);
}

// A thread's shifted sums of one channel, in the compute type for at most kFlushRows steps of the thread (its
// caller counts them), then added into F64: F32 sums of up to 64 * 8 values lose about 1e-5 of their value at worst,
// and the F64 total nothing more.
template <typename C>
struct ShiftedSums {
    C sum = 0, squares = 0;
    double2 total = make_double2(0.0, 0.0);

    __device__ __forceinline__ void add(C d) {
        sum += d;
        squares += d * d;
    }
    __device__ __forceinline__ void flush() {
        total = nvidia::add(total, make_double2(sum, squares));
        sum = squares = 0;
    }
};

template <typename C>
__device__ __forceinline__ C outputOf(const ChannelTerms<C> &k, C x) {
    return (x - k.reference) * k.scale + k.shift;
}

// ---------------------------------------------------------------- channels-first (N, C, L), L > 1

template <typename T, int V>
__global__ void __launch_bounds__(kThreads) tileSumsKernel(Args<T> args, double2 *partials) {
    using C = ComputeOf<T>;
    __shared__ double2 scratch[33];
    const size_t c = blockIdx.x / args.tiles, tile = blockIdx.x % args.tiles;
    const C reference = referenceOf(args, c, false);
    ShiftedSums<C> sums;
    int pending = 0;
    forTileVectors<V>(args, c, tile, [&](ptrdiff_t offset) {
        C x[V];
        nvidia::loadValues<V>(args.x + offset, x);
#pragma unroll
        for (int v = 0; v < V; ++v) sums.add(x[v] - reference);
        if (++pending == kFlushRows) {
            sums.flush();
            pending = 0;
        }
    });
    sums.flush();
    const double2 total = nvidia::blockSum(sums.total, scratch);
    if (threadIdx.x == 0) partials[blockIdx.x] = total;
}

// y may be x itself: each element is read before it is written, by the same thread.
template <typename T, int V>
__global__ void __launch_bounds__(kThreads) tileOutputKernel(Args<T> args, const ChannelTerms<ComputeOf<T>> *terms) {
    using C = ComputeOf<T>;
    const size_t c = blockIdx.x / args.tiles, tile = blockIdx.x % args.tiles;
    const ChannelTerms<C> k = terms[c];
    forTileVectors<V>(args, c, tile, [&](ptrdiff_t offset) {
        C x[V];
        nvidia::loadValues<V>(args.x + offset, x);
#pragma unroll
        for (int v = 0; v < V; ++v) x[v] = outputOf(k, x[v]);
        nvidia::storeValues<V>(args.y + offset, x);
    });
}

// ---------------------------------------------------------------- rows of channels (N*L rows of C)

// Partials of every channel of the CTA's block for its row tile; the row lanes are added in lane order.
template <typename T, int V>
__global__ void __launch_bounds__(kThreads) rowsSumsKernel(Args<T> args, RowsShape shape, double2 *partials) {
    using C = ComputeOf<T>;
    __shared__ double2 lanes[kThreads];
    const RowsThread t = rowsThread<V>(args, shape);
    ShiftedSums<C> sums[V];
    if (t.active) {
        C reference[V];
#pragma unroll
        for (int v = 0; v < V; ++v) reference[v] = referenceOf(args, t.channel + v, true);
        int pending = 0;
        for (size_t row = t.first + threadIdx.y; row < t.last; row += shape.row_lanes) {
            C x[V];
            nvidia::loadValues<V>(args.x + row * args.channels + t.channel, x);
#pragma unroll
            for (int v = 0; v < V; ++v) sums[v].add(x[v] - reference[v]);
            if (++pending == kFlushRows) {
#pragma unroll
                for (int v = 0; v < V; ++v) sums[v].flush();
                pending = 0;
            }
        }
#pragma unroll
        for (int v = 0; v < V; ++v) sums[v].flush();
    }
    double2 totals[V];
#pragma unroll
    for (int v = 0; v < V; ++v) totals[v] = sums[v].total;
    writeRowsPartials<V>(args, shape, t, totals, lanes, partials);
}

// y may be x itself: each element is read before it is written, by the same thread.
template <typename T, int V>
__global__ void __launch_bounds__(kThreads) rowsOutputKernel(Args<T> args, RowsShape shape,
                                                            const ChannelTerms<ComputeOf<T>> *terms) {
    using C = ComputeOf<T>;
    const RowsThread t = rowsThread<V>(args, shape);
    if (!t.active) return;
    ChannelTerms<C> k[V];
#pragma unroll
    for (int v = 0; v < V; ++v) k[v] = terms[t.channel + v];
    for (size_t row = t.first + threadIdx.y; row < t.last; row += shape.row_lanes) {
        const size_t offset = row * args.channels + t.channel;
        C x[V];
        nvidia::loadValues<V>(args.x + offset, x);
#pragma unroll
        for (int v = 0; v < V; ++v) x[v] = outputOf(k[v], x[v]);
        nvidia::storeValues<V>(args.y + offset, x);
    }
}

// ---------------------------------------------------------------- per channel

// The caller's per-channel vectors (NULL where absent), typed: W the parameters', S the saved statistics'.
template <typename W, typename S>
struct ChannelArgs {
    S *save_mean, *save_invstd;
    W *running_mean, *running_var;
    const W *weight, *bias;
    ptrdiff_t save_mean_stride, save_invstd_stride, running_mean_stride, running_var_stride, weight_stride,
        bias_stride;
    size_t channels, tiles;
    double count; // N * L
    double momentum, epsilon;
    bool training;
};

template <typename W>
__device__ __forceinline__ double vectorAt(const W *vector, ptrdiff_t stride, size_t c, double absent) {
    return vector != nullptr ? static_cast<double>(nvidia::widen(vector[static_cast<ptrdiff_t>(c) * stride])) : absent;
}

template <typename V>
__device__ __forceinline__ void storeAt(V *vector, ptrdiff_t stride, size_t c, double value) {
    if (vector == nullptr) return;
    if constexpr (std::is_same_v<V, float> || std::is_same_v<V, double>) {
        vector[static_cast<ptrdiff_t>(c) * stride] = static_cast<V>(value);
    } else {
        vector[static_cast<ptrdiff_t>(c) * stride] = nvidia::narrow<V>(static_cast<float>(value));
    }
}

// A warp per channel. references: the channels' reference values (training), read from x by the sums' CTAs' rule.
template <typename T, typename W, typename S>
__global__ void __launch_bounds__(256) channelKernel(ChannelArgs<W, S> args, Args<T> data, const double2 *partials,
                                                     ChannelTerms<ComputeOf<T>> *terms) {
    using C = ComputeOf<T>;
    const int lane = threadIdx.x % 32;
    const size_t c = static_cast<size_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
    if (c >= args.channels) return; // whole warps leave together
    double2 sums = make_double2(0.0, 0.0);
    if (args.training) {
        for (size_t tile = lane; tile < args.tiles; tile += 32) sums = nvidia::add(sums, partials[c * args.tiles + tile]);
        sums = nvidia::warpSumToLane0(sums);
    }
    if (lane != 0) return;
    const double weight = vectorAt(args.weight, args.weight_stride, c, 1.0);
    const double bias = vectorAt(args.bias, args.bias_stride, c, 0.0);
    if (!args.training) {
        const double mean = vectorAt(args.running_mean, args.running_mean_stride, c, 0.0);
        const double var = vectorAt(args.running_var, args.running_var_stride, c, 1.0);
        if (terms != nullptr) terms[c] = ChannelTerms<C>{static_cast<C>(mean), static_cast<C>(weight / sqrt(var + args.epsilon)),
                                                         static_cast<C>(bias)};
        return;
    }
    if (args.count == 0) { // an empty batch: no statistics; the running ones stay as they are, as in PyTorch
        storeAt(args.save_mean, args.save_mean_stride, c, 0.0);
        storeAt(args.save_invstd, args.save_invstd_stride, c, 1.0 / sqrt(args.epsilon));
        return;
    }
    const C reference = referenceOf(data, c, data.rows_of_channels);
    const double offset = sums.x / args.count; // mean - reference
    const double mean = static_cast<double>(reference) + offset;
    const double var = biasedVariance(sums.y / args.count, offset);
    const double invstd = 1.0 / sqrt(var + args.epsilon);
    storeAt(args.save_mean, args.save_mean_stride, c, mean);
    storeAt(args.save_invstd, args.save_invstd_stride, c, invstd);
    if (args.running_mean != nullptr) {
        const double m = args.momentum;
        const double old_mean = vectorAt(args.running_mean, args.running_mean_stride, c, 0.0);
        const double old_var = vectorAt(args.running_var, args.running_var_stride, c, 0.0);
        storeAt(args.running_mean, args.running_mean_stride, c, (1.0 - m) * old_mean + m * mean);
        storeAt(args.running_var, args.running_var_stride, c, (1.0 - m) * old_var + m * var * args.count / (args.count - 1.0));
    }
    const double scale = weight * invstd;
    terms[c] = ChannelTerms<C>{reference, static_cast<C>(scale), static_cast<C>(bias - offset * scale)};
}

class NvidiaDescriptor final : public Descriptor {
  public:
    NvidiaDescriptor(int device_id, const Info &info, const Tiling &tiling)
        : Descriptor(INFINI_DEVICE_NVIDIA, device_id, info), tiling_(tiling) {
        if (info.channels == 0) return;
        const size_t term_size = info.dtype == INFINI_DTYPE_F64 ? sizeof(ChannelTerms<double>) : sizeof(ChannelTerms<float>);
        // + kWorkspaceAlign: the caller's pointer is aligned up before use.
        const infini::CheckedSize partials =
            info.training ? infini::CheckedSize(info.channels) * tiling_.tiles * sizeof(double2) + kWorkspaceAlign : 0;
        workspace_ = infini::CheckedSize(kWorkspaceAlign) + partials + infini::CheckedSize(info.channels) * term_size;
    }

    size_t workspaceSize() const override { return workspace_.value(); }
    bool workspaceOverflows() const override { return workspace_.overflowed(); }

    infiniStatus_t calculate(void *workspace, void *y, void *save_mean, void *save_invstd, void *running_mean,
                             void *running_var, const void *x, const void *weight, const void *bias,
                             void *stream) const override {
        if (info.channels == 0) return INFINI_STATUS_SUCCESS;
        if (ceilDiv(info.channels, 8) > 0x7fffffffu) return INFINI_STATUS_BAD_TENSOR_SHAPE; // channelKernel's grid
        const nvidia::DeviceScope device_scope(device_id);
        INFINI_CHECK(device_scope.status());
        char *base = nvidia::alignedBase(workspace);
        const size_t partial_bytes = info.training ? alignUp(info.channels * tiling_.tiles * sizeof(double2)) : 0;
        auto *partials = reinterpret_cast<double2 *>(base);
        const auto cuda_stream = static_cast<cudaStream_t>(stream);
        const bool any_elements = info.batch * info.length > 0;

        return nvidia::withDataAndParameterTypes(info.dtype, info.parameter_dtype, [&](auto data_tag, auto parameter_tag) {
            using T = decltype(data_tag);
            using W = decltype(parameter_tag);
            using C = ComputeOf<T>;
            auto *terms = reinterpret_cast<ChannelTerms<C> *>(base + partial_bytes);
            const Args<T> args{tiling_, static_cast<T *>(y), static_cast<const T *>(x)};
            if (info.training && any_elements) INFINI_CHECK(this->template launchSums<T>(args, partials, cuda_stream));
            const ChannelArgs<W, C> channel_args{static_cast<C *>(save_mean),
                                                 static_cast<C *>(save_invstd),
                                                 static_cast<W *>(running_mean),
                                                 static_cast<W *>(running_var),
                                                 static_cast<const W *>(weight),
                                                 static_cast<const W *>(bias),
                                                 info.save_mean_stride,
                                                 info.save_invstd_stride,
                                                 info.running_mean_stride,
                                                 info.running_var_stride,
                                                 info.weight_stride,
                                                 info.bias_stride,
                                                 info.channels,
                                                 tiling_.tiles,
                                                 static_cast<double>(info.batch * info.length),
                                                 info.momentum,
                                                 info.epsilon,
                                                 info.training};
            channelKernel<T, W, C><<<static_cast<unsigned>(ceilDiv(info.channels, 8)), 256, 0, cuda_stream>>>(
                channel_args, args, partials, terms);
            INFINI_CHECK(nvidia::launchStatus());
            if (!any_elements) return INFINI_STATUS_SUCCESS;
            return this->template launchOutput<T>(args, terms, cuda_stream);
        });
    }

  private:
    // 16-byte vectors where both tensors allow them: channels-first along L, rows of channels along C.
    template <typename T>
    bool vectors(const Args<T> &args) const {
        return tiling_.run() % nvidia::kVec<T> == 0 && nvidia::aligned16(args.y) && nvidia::aligned16(args.x);
    }

    template <typename T>
    infiniStatus_t launchSums(const Args<T> &args, double2 *partials, cudaStream_t stream) const {
        constexpr int V = nvidia::kVec<T>;
        if (vectors(args)) return launchTiles<V>(args, rowsSumsKernel<T, V>, tileSumsKernel<T, V>, stream, partials);
        return launchTiles<1>(args, rowsSumsKernel<T, 1>, tileSumsKernel<T, 1>, stream, partials);
    }

    template <typename T>
    infiniStatus_t launchOutput(const Args<T> &args, const ChannelTerms<ComputeOf<T>> *terms,
                                cudaStream_t stream) const {
        constexpr int V = nvidia::kVec<T>;
        if (vectors(args)) return launchTiles<V>(args, rowsOutputKernel<T, V>, tileOutputKernel<T, V>, stream, terms);
        return launchTiles<1>(args, rowsOutputKernel<T, 1>, tileOutputKernel<T, 1>, stream, terms);
    }

    Tiling tiling_;
    infini::CheckedSize workspace_;
};

} // namespace

infiniStatus_t Backends::nvidia(const Info &info, int device_id, Descriptor **desc) {
    Tiling tiling{};
    INFINI_CHECK(planTiles(info, device_id, tileSumsKernel<float, 4>, &tiling));
    *desc = new NvidiaDescriptor(device_id, info, tiling);
    return INFINI_STATUS_SUCCESS;
}

} // namespace op::batch_norm
