// BatchNorm backward on NVIDIA GPUs, in up to three launches on the caller's stream (the reduce phase stops after
// the second, the elementwise phase skips the first and reads the given totals):
//  1. sums: each CTA sums grad_output and grad_output*(x - mean) over one fixed tile of the data into an F64
//     partial per channel (skipped in eval when neither weight gradient is wanted);
//  2. a warp per channel adds its tiles' partials in a fixed order, writes grad_weight and grad_bias (those
//     wanted) and the channel's coefficients;
//  3. grad_input = scale_grad * grad_output + scale_centered * (x - mean) + shift (eval: scale_grad *
//     grad_output, x unread), over the same tiles.
// Two tilings of the big tensors, as on the CPU: channels-first (N, C, L) with L > 1 tiles each channel's N*L
// elements; rows of channels (channels-last, or L == 1: N*L rows of C contiguous channels) tiles the rows, a
// CTA's threads spread over (channel, row) so that neighbouring threads read neighbouring elements.
// The formulas and F32/F64 choices are the CPU backend's. Tiles are fixed at creation: deterministic.
#include "../batch_norm_backward.h"

#include "devices/nvidia/nvidia_reduce.cuh"
#include "devices/nvidia/nvidia_status.h"
#include "devices/nvidia/nvidia_types.cuh"
#include "devices/nvidia/nvidia_workspace.h"
#include "ops/batch_norm_tiles_nvidia.cuh"
#include "common/checked.h"

#include <algorithm>

namespace op::batch_norm_backward {
namespace {

using nvidia::ComputeOf;

using namespace batch_norm_tiles; // kThreads, Tiling, forTileVectors, RowsShape, rowsThread, launchTiles ...
using nvidia::alignUp;
using nvidia::kWorkspaceAlign;

template <typename C>
struct ChannelCoefficients {
    C mean, scale_grad, scale_centered, shift;
};

// Where each channel's mean, invstd and weight come from (info.h: saved statistics in training when given,
// else the running ones; an absent weight is ones). Pointers of tensors not used are NULL.
template <typename W>
struct ChannelStatistics {
    using C = ComputeOf<W>;
    const W *weight, *running_mean, *running_var;
    const C *save_mean, *save_invstd;
    ptrdiff_t weight_stride, running_mean_stride, running_var_stride, save_mean_stride, save_invstd_stride;
    double epsilon;

    __device__ double mean(size_t c) const {
        const ptrdiff_t i = static_cast<ptrdiff_t>(c);
        return save_mean != nullptr ? save_mean[i * save_mean_stride] : nvidia::widen(running_mean[i * running_mean_stride]);
    }
    __device__ double invstd(size_t c) const {
        const ptrdiff_t i = static_cast<ptrdiff_t>(c);
        if (save_invstd != nullptr) return save_invstd[i * save_invstd_stride];
        return 1.0 / sqrt(static_cast<double>(nvidia::widen(running_var[i * running_var_stride])) + epsilon);
    }
    __device__ double weight_of(size_t c) const {
        return weight != nullptr ? nvidia::widen(weight[static_cast<ptrdiff_t>(c) * weight_stride]) : 1.0;
    }
};

// The big tensors and their tiling.
template <typename T>
struct Args : Tiling {
    T *grad_input;
    const T *input, *grad_output;
    bool training;
};

// ---------------------------------------------------------------- channels-first (N, C, L), L > 1

// CTA c * tiles + tile: the channel's two sums over the tile into partials[c * tiles + tile].
template <typename T, typename W, int V>
__global__ void __launch_bounds__(kThreads) tileSumsKernel(Args<T> args, ChannelStatistics<W> statistics,
                                                           double2 *partials) {
    using C = ComputeOf<T>;
    __shared__ double2 scratch[33];
    const size_t c = blockIdx.x / args.tiles, tile = blockIdx.x % args.tiles;
    const C mean = static_cast<C>(statistics.mean(c));
    C sum_grad = 0, sum_grad_centered = 0;
    forTileVectors<V>(args, c, tile, [&](ptrdiff_t offset) {
        C go[V], x[V];
        nvidia::loadValues<V>(args.grad_output + offset, go);
        nvidia::loadValues<V>(args.input + offset, x);
#pragma unroll
        for (int v = 0; v < V; ++v) {
            sum_grad += go[v];
            sum_grad_centered += go[v] * (x[v] - mean);
        }
    });
    const double2 sums = nvidia::blockSum(make_double2(sum_grad, sum_grad_centered), scratch);
    if (threadIdx.x == 0) partials[blockIdx.x] = sums;
}

template <typename C>
__device__ __forceinline__ C gradInputOf(const ChannelCoefficients<C> &k, C go, C x, bool training) {
    return training ? k.scale_grad * go + k.scale_centered * (x - k.mean) + k.shift : k.scale_grad * go;
}

// grad_input may be grad_output itself: each element is read before it is written, by the same thread.
template <typename T, int V>
__global__ void __launch_bounds__(kThreads) gradInputKernel(Args<T> args,
                                                            const ChannelCoefficients<ComputeOf<T>> *coefficients) {
    using C = ComputeOf<T>;
    const size_t c = blockIdx.x / args.tiles, tile = blockIdx.x % args.tiles;
    const ChannelCoefficients<C> k = coefficients[c];
    forTileVectors<V>(args, c, tile, [&](ptrdiff_t offset) {
        C go[V], x[V] = {}, out[V];
        nvidia::loadValues<V>(args.grad_output + offset, go);
        if (args.training) nvidia::loadValues<V>(args.input + offset, x); // eval never reads x
#pragma unroll
        for (int v = 0; v < V; ++v) out[v] = gradInputOf(k, go[v], x[v], args.training);
        nvidia::storeValues<V>(args.grad_input + offset, out);
    });
}

// ---------------------------------------------------------------- rows of channels (N*L rows of C)

// Partials of every channel of the CTA's block for its row tile: per thread, F32 sums (F64 for F64) flushed into
// F64 every kFlushRows rows; then the row lanes are added in lane order.
template <typename T, typename W, int V>
__global__ void __launch_bounds__(kThreads) rowsSumsKernel(Args<T> args, RowsShape shape,
                                                           ChannelStatistics<W> statistics, double2 *partials) {
    using C = ComputeOf<T>;
    __shared__ double2 lanes[kThreads];
    const RowsThread t = rowsThread<V>(args, shape);
    C mean[V];
    double2 total[V];
#pragma unroll
    for (int v = 0; v < V; ++v) {
        mean[v] = t.active ? static_cast<C>(statistics.mean(t.channel + v)) : C(0);
        total[v] = make_double2(0.0, 0.0);
    }
    if (t.active) {
        C sum_grad[V] = {}, sum_grad_centered[V] = {};
        int pending = 0;
        for (size_t row = t.first + threadIdx.y; row < t.last; row += shape.row_lanes) {
            const size_t offset = row * args.channels + t.channel;
            C go[V], x[V];
            nvidia::loadValues<V>(args.grad_output + offset, go);
            nvidia::loadValues<V>(args.input + offset, x);
#pragma unroll
            for (int v = 0; v < V; ++v) {
                sum_grad[v] += go[v];
                sum_grad_centered[v] += go[v] * (x[v] - mean[v]);
            }
            if (++pending == kFlushRows || row + shape.row_lanes >= t.last) {
#pragma unroll
                for (int v = 0; v < V; ++v) {
                    total[v] = nvidia::add(total[v], make_double2(sum_grad[v], sum_grad_centered[v]));
                    sum_grad[v] = sum_grad_centered[v] = 0;
                }
                pending = 0;
            }
        }
    }
    writeRowsPartials<V>(args, shape, t, total, lanes, partials);
}

// grad_input may be grad_output itself: each element is read before it is written, by the same thread.
template <typename T, int V>
__global__ void __launch_bounds__(kThreads) rowsGradInputKernel(Args<T> args, RowsShape shape,
                                                                const ChannelCoefficients<ComputeOf<T>> *coefficients) {
    using C = ComputeOf<T>;
    const RowsThread t = rowsThread<V>(args, shape);
    if (!t.active) return;
    ChannelCoefficients<C> k[V];
#pragma unroll
    for (int v = 0; v < V; ++v) k[v] = coefficients[t.channel + v];
    for (size_t row = t.first + threadIdx.y; row < t.last; row += shape.row_lanes) {
        const size_t offset = row * args.channels + t.channel;
        C go[V], x[V] = {}, out[V];
        nvidia::loadValues<V>(args.grad_output + offset, go);
        if (args.training) nvidia::loadValues<V>(args.input + offset, x); // eval never reads x
#pragma unroll
        for (int v = 0; v < V; ++v) out[v] = gradInputOf(k[v], go[v], x[v], args.training);
        nvidia::storeValues<V>(args.grad_input + offset, out);
    }
}

// ---------------------------------------------------------------- per channel

template <typename W>
struct ChannelArgs {
    using C = ComputeOf<W>; // the statistics type, of the sums the phases exchange
    W *grad_weight, *grad_bias; // NULL: not wanted
    ptrdiff_t grad_weight_stride, grad_bias_stride;
    ChannelStatistics<W> statistics;
    size_t channels, tiles; // tiles 0: no sums were taken (eval without weight gradients, or no elements)
    double local_count;     // N * L
    double count;           // elements the sums cover: N * L, or the elementwise phase's total_count
    bool training;
    C *sums_out, *centered_sums_out;             // reduce phase: this process's sums (else NULL)
    const C *sums_in, *centered_sums_in;         // elementwise phase: the totals of all processes (else NULL)
};

template <typename W>
__global__ void __launch_bounds__(256) channelKernel(ChannelArgs<W> args, const double2 *partials,
                                                     ChannelCoefficients<ComputeOf<W>> *coefficients) {
    using C = ComputeOf<W>;
    const int lane = threadIdx.x % 32;
    const size_t c = static_cast<size_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
    if (c >= args.channels) return; // whole warps leave together
    double2 sums = make_double2(0.0, 0.0);
    for (size_t tile = lane; tile < args.tiles; tile += 32) sums = nvidia::add(sums, partials[c * args.tiles + tile]);
    sums = nvidia::warpSumToLane0(sums);
    if (lane != 0) return;
    double sum_grad = sums.x, sum_grad_centered = sums.y;
    const double count = args.count;
    const double invstd = args.statistics.invstd(c);
    const double scale = args.statistics.weight_of(c) * invstd;
    const ptrdiff_t i = static_cast<ptrdiff_t>(c);
    if (args.sums_in != nullptr) {
        sum_grad = args.sums_in[i];
        sum_grad_centered = args.centered_sums_in[i];
    } else {
        if (args.grad_bias != nullptr) args.grad_bias[i * args.grad_bias_stride] = nvidia::narrow<W>(static_cast<C>(sum_grad));
        if (args.grad_weight != nullptr) {
            // 0 for an empty channel even when invstd is inf (no samples, nothing to scale).
            args.grad_weight[i * args.grad_weight_stride] =
                nvidia::narrow<W>(args.local_count > 0 ? static_cast<C>(sum_grad_centered * invstd) : C(0));
        }
        if (args.sums_out != nullptr) {
            args.sums_out[i] = static_cast<C>(sum_grad);
            args.centered_sums_out[i] = static_cast<C>(sum_grad_centered);
            return;
        }
        // The sums as the reduce phase hands them to the elementwise one: reduce + elementwise = the whole run.
        sum_grad = static_cast<C>(sum_grad);
        sum_grad_centered = static_cast<C>(sum_grad_centered);
    }
    ChannelCoefficients<C> k{static_cast<C>(args.statistics.mean(c)), static_cast<C>(scale), C(0), C(0)};
    if (args.training && count > 0) { // eval: the statistics are constants
        k.scale_centered = static_cast<C>(-scale * invstd * invstd * sum_grad_centered / count);
        k.shift = static_cast<C>(-scale * sum_grad / count);
    }
    if (coefficients != nullptr) coefficients[c] = k; // NULL: an empty batch has no grad_input to write
}

// training's grad_input needs the sums; eval only for grad_weight / grad_bias.
bool needsSums(const Info &info) { return info.training || info.has_grad_weight || info.has_grad_bias; }

class NvidiaDescriptor final : public Descriptor {
  public:
    NvidiaDescriptor(int device_id, const Info &info, const Tiling &tiling)
        : Descriptor(INFINI_DEVICE_NVIDIA, device_id, info), tiling_(tiling) {
        // + kWorkspaceAlign: the caller's pointer is aligned up before use. An empty batch needs none.
        if (info.channels == 0 || info.batch * info.length == 0) return;
        const size_t coefficient_size = info.dtype == INFINI_DTYPE_F64 ? sizeof(ChannelCoefficients<double>)
                                                                       : sizeof(ChannelCoefficients<float>);
        const infini::CheckedSize partials = needsSums(info) ? infini::CheckedSize(info.channels) * tiling_.tiles *
                                                                       sizeof(double2) + kWorkspaceAlign
                                                                 : 0;
        workspace_ = infini::CheckedSize(kWorkspaceAlign) + partials +
                     infini::CheckedSize(info.channels) * coefficient_size + kWorkspaceAlign;
    }

    size_t workspaceSize() const override { return workspace_.value(); }
    bool workspaceOverflows() const override { return workspace_.overflowed(); }

    infiniStatus_t calculate(const Phase &phase, void *workspace, void *grad_input, void *grad_weight,
                             void *grad_bias, const void *input, const void *grad_output, const void *weight,
                             const void *running_mean, const void *running_var, const void *save_mean,
                             const void *save_invstd, void *stream) const override {
        const bool any_elements = info.batch * info.length > 0;
        const bool writes_vectors = phase.kind == Phase::reduce || grad_weight != nullptr || grad_bias != nullptr;
        if (info.channels == 0 || (!any_elements && (phase.kind == Phase::elementwise || !writes_vectors))) {
            return INFINI_STATUS_SUCCESS; // nothing to write (the channels may be a broadcast vector's 2^61)
        }
        if (ceilDiv(info.channels, 8) > 0x7fffffffu) return INFINI_STATUS_BAD_TENSOR_SHAPE; // channelKernel's grid
        const nvidia::DeviceScope device_scope(device_id);
        INFINI_CHECK(device_scope.status());
        char *base = nvidia::alignedBase(workspace);
        auto *partials = reinterpret_cast<double2 *>(base);
        auto cuda_stream = static_cast<cudaStream_t>(stream);

        return nvidia::withDataAndParameterTypes(info.dtype, info.parameter_dtype, [&](auto data_tag, auto parameter_tag) {
            using T = decltype(data_tag);
            using W = decltype(parameter_tag);
            using C = ComputeOf<T>;
            auto *coefficients =
                any_elements ? reinterpret_cast<ChannelCoefficients<C> *>(base + partialBytes()) : nullptr;
            const bool saved = !info.usesRunning();
            const ChannelStatistics<W> statistics{info.has_weight ? static_cast<const W *>(weight) : nullptr,
                                                  saved ? nullptr : static_cast<const W *>(running_mean),
                                                  saved ? nullptr : static_cast<const W *>(running_var),
                                                  saved ? static_cast<const C *>(save_mean) : nullptr,
                                                  saved ? static_cast<const C *>(save_invstd) : nullptr,
                                                  info.weight_stride,
                                                  info.running_mean_stride,
                                                  info.running_var_stride,
                                                  info.save_mean_stride,
                                                  info.save_invstd_stride,
                                                  info.epsilon};
            const Args<T> args{tiling_,
                               static_cast<T *>(grad_input),
                               static_cast<const T *>(input),
                               static_cast<const T *>(grad_output),
                               info.training};
            const bool sums = any_elements && needsSums(info) && phase.kind != Phase::elementwise;

            if (sums) INFINI_CHECK((this->template launchSums<T, W>(args, statistics, partials, cuda_stream)));
            const ChannelArgs<W> channel_args{info.has_grad_weight ? static_cast<W *>(grad_weight) : nullptr,
                                              info.has_grad_bias ? static_cast<W *>(grad_bias) : nullptr,
                                              info.grad_weight_stride,
                                              info.grad_bias_stride,
                                              statistics,
                                              info.channels,
                                              sums ? tiling_.tiles : 0,
                                              static_cast<double>(info.batch * info.length),
                                              phase.count,
                                              info.training,
                                              phase.kind == Phase::reduce ? static_cast<C *>(phase.sum_grad) : nullptr,
                                              phase.kind == Phase::reduce ? static_cast<C *>(phase.sum_grad_centered) : nullptr,
                                              phase.kind == Phase::elementwise ? static_cast<const C *>(phase.sum_grad) : nullptr,
                                              phase.kind == Phase::elementwise ? static_cast<const C *>(phase.sum_grad_centered) : nullptr};
            channelKernel<W><<<static_cast<unsigned>(ceilDiv(info.channels, 8)), 256, 0, cuda_stream>>>(
                channel_args, partials, coefficients);
            INFINI_CHECK(nvidia::launchStatus());
            if (any_elements && phase.kind != Phase::reduce) {
                INFINI_CHECK(this->template launchGradInput<T>(args, coefficients, cuda_stream));
            }
            return INFINI_STATUS_SUCCESS;
        });
    }

  private:
    size_t partialBytes() const {
        return needsSums(info) ? alignUp(info.channels * tiling_.tiles * sizeof(double2)) : 0;
    }

    // 16-byte vectors when every tensor allows them: channels-first along L, rows of channels along C.
    template <typename T>
    bool vectors(const Args<T> &args) const {
        return tiling_.run() % nvidia::kVec<T> == 0 && nvidia::aligned16(args.grad_input) &&
               nvidia::aligned16(args.input) && nvidia::aligned16(args.grad_output);
    }

    template <typename T, typename W>
    infiniStatus_t launchSums(const Args<T> &args, const ChannelStatistics<W> &statistics, double2 *partials,
                              cudaStream_t stream) const {
        constexpr int V = nvidia::kVec<T>;
        if (vectors(args)) {
            return launchTiles<V>(args, rowsSumsKernel<T, W, V>, tileSumsKernel<T, W, V>, stream, statistics,
                                  partials);
        }
        return launchTiles<1>(args, rowsSumsKernel<T, W, 1>, tileSumsKernel<T, W, 1>, stream, statistics, partials);
    }

    template <typename T>
    infiniStatus_t launchGradInput(const Args<T> &args, const ChannelCoefficients<ComputeOf<T>> *coefficients,
                                   cudaStream_t stream) const {
        constexpr int V = nvidia::kVec<T>;
        if (vectors(args)) {
            return launchTiles<V>(args, rowsGradInputKernel<T, V>, gradInputKernel<T, V>, stream, coefficients);
        }
        return launchTiles<1>(args, rowsGradInputKernel<T, 1>, gradInputKernel<T, 1>, stream, coefficients);
    }

    Tiling tiling_;
    infini::CheckedSize workspace_;
};

} // namespace

infiniStatus_t Backends::nvidia(const Info &info, int device_id, Descriptor **desc) {
    Tiling tiling{};
    INFINI_CHECK(planTiles(info, device_id, tileSumsKernel<float, float, 4>, &tiling));
    *desc = new NvidiaDescriptor(device_id, info, tiling);
    return INFINI_STATUS_SUCCESS;
}

} // namespace op::batch_norm_backward
