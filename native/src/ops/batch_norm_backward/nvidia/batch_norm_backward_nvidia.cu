// BatchNorm backward on NVIDIA GPUs, in three launches on the caller's stream:
//  1. each CTA sums grad_output and grad_output*(x - mean) over one fixed tile of one channel's N*L elements
//     into an F64 partial;
//  2. a warp per channel adds its tiles' partials in a fixed order, writes grad_weight and grad_bias and the
//     channel's coefficients;
//  3. grad_input = scale_grad * grad_output + scale_centered * (x - mean) + shift, over the same tiles.
// The formulas and F32/F64 choices are the CPU backend's. Tiles are fixed at creation: deterministic.
#include "../batch_norm_backward.h"

#include "devices/nvidia/nvidia_reduce.cuh"
#include "devices/nvidia/nvidia_status.h"
#include "devices/nvidia/nvidia_types.cuh"

#include <algorithm>

namespace op::batch_norm_backward {
namespace {

constexpr int kThreads = 256;
constexpr size_t kMinTile = 4096; // elements of one channel per CTA, so a tile is worth launching
constexpr size_t kTileAlign = 8;  // tile starts are whole vectors of any width used
constexpr size_t kAlign = 256;

struct ChannelCoefficients {
    float mean, scale_grad, scale_centered, shift;
};

template <typename T>
struct Args {
    T *grad_input;
    const T *input, *grad_output;
    size_t batch, channels, length;
    size_t tiles, tile_elements; // per channel
};

// Walks this thread's vectors of one tile of channel c: the tile covers [begin, end) of the channel's
// (n, l) elements in row-major order; thread t takes vectors t, t + kThreads, ... Calls body(offset in
// elements of the vector's first element). No division inside the loop.
template <int V, typename T, typename Body>
__device__ __forceinline__ void forTileVectors(const Args<T> &args, size_t c, size_t tile, Body &&body) {
    const size_t units_per_row = args.length / V;
    const size_t units = args.batch * units_per_row;
    const size_t begin = tile * (args.tile_elements / V);
    const size_t end = min(begin + args.tile_elements / V, units);
    size_t unit = begin + threadIdx.x;
    if (unit >= end) return;
    size_t n = unit / units_per_row, l = unit % units_per_row;
    const size_t step_n = kThreads / units_per_row, step_l = kThreads % units_per_row;
    for (; unit < end; unit += kThreads) {
        body(static_cast<ptrdiff_t>(((n * args.channels + c) * units_per_row + l) * V));
        l += step_l;
        n += step_n;
        if (l >= units_per_row) {
            l -= units_per_row;
            ++n;
        }
    }
}

template <typename T, int V>
__global__ void __launch_bounds__(kThreads) tileSumsKernel(Args<T> args, const T *running_mean, ptrdiff_t mean_stride,
                                                           double2 *partials) {
    __shared__ double2 scratch[33];
    const size_t c = blockIdx.x / args.tiles, tile = blockIdx.x % args.tiles;
    const float mean = nvidia::toFloat(running_mean[static_cast<ptrdiff_t>(c) * mean_stride]);
    float sum_grad = 0.0f, sum_grad_centered = 0.0f;
    forTileVectors<V>(args, c, tile, [&](ptrdiff_t offset) {
        float go[V], x[V];
        nvidia::loadFloats<V>(args.grad_output + offset, go);
        nvidia::loadFloats<V>(args.input + offset, x);
#pragma unroll
        for (int v = 0; v < V; ++v) {
            sum_grad += go[v];
            sum_grad_centered += go[v] * (x[v] - mean);
        }
    });
    const double2 sums = nvidia::blockSum(make_double2(sum_grad, sum_grad_centered), scratch);
    if (threadIdx.x == 0) partials[blockIdx.x] = sums;
}

template <typename T>
struct ChannelArgs {
    T *grad_weight, *grad_bias;
    const T *weight, *running_mean, *running_var;
    ptrdiff_t grad_weight_stride, grad_bias_stride, weight_stride, mean_stride, var_stride;
    size_t channels, tiles;
    double count; // N * L
};

template <typename T>
__global__ void __launch_bounds__(256) channelKernel(ChannelArgs<T> args, const double2 *partials,
                                                     ChannelCoefficients *coefficients) {
    const int lane = threadIdx.x % 32;
    const size_t c = static_cast<size_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
    if (c >= args.channels) return; // whole warps leave together
    double2 sums = make_double2(0.0, 0.0);
    for (size_t tile = lane; tile < args.tiles; tile += 32) sums = nvidia::add(sums, partials[c * args.tiles + tile]);
    sums = nvidia::warpSumToLane0(sums);
    if (lane != 0) return;
    auto value = [](const T *vector, ptrdiff_t stride, size_t i) {
        return nvidia::toFloat(vector[static_cast<ptrdiff_t>(i) * stride]);
    };
    const double sum_grad = sums.x, sum_grad_centered = sums.y, count = args.count;
    const double inv_std = 1.0 / sqrt(static_cast<double>(value(args.running_var, args.var_stride, c)));
    const double scale = value(args.weight, args.weight_stride, c) * inv_std;
    args.grad_bias[static_cast<ptrdiff_t>(c) * args.grad_bias_stride] = nvidia::fromFloat<T>(static_cast<float>(sum_grad));
    args.grad_weight[static_cast<ptrdiff_t>(c) * args.grad_weight_stride] =
        nvidia::fromFloat<T>(count > 0 ? static_cast<float>(sum_grad_centered * inv_std) : 0.0f);
    ChannelCoefficients k{value(args.running_mean, args.mean_stride, c), 0.0f, 0.0f, 0.0f};
    if (count > 0) {
        k.scale_grad = static_cast<float>(scale);
        k.scale_centered = static_cast<float>(-scale * inv_std * inv_std * sum_grad_centered / count);
        k.shift = static_cast<float>(-scale * sum_grad / count);
    }
    coefficients[c] = k;
}

// grad_input may be grad_output itself: each element is read before it is written, by the same thread.
template <typename T, int V>
__global__ void __launch_bounds__(kThreads) gradInputKernel(Args<T> args, const ChannelCoefficients *coefficients) {
    const size_t c = blockIdx.x / args.tiles, tile = blockIdx.x % args.tiles;
    const ChannelCoefficients k = coefficients[c];
    forTileVectors<V>(args, c, tile, [&](ptrdiff_t offset) {
        float go[V], x[V], out[V];
        nvidia::loadFloats<V>(args.grad_output + offset, go);
        nvidia::loadFloats<V>(args.input + offset, x);
#pragma unroll
        for (int v = 0; v < V; ++v) out[v] = k.scale_grad * go[v] + k.scale_centered * (x[v] - k.mean) + k.shift;
        nvidia::storeFloats<V>(args.grad_input + offset, out);
    });
}

size_t alignUp(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }
size_t ceilDiv(size_t a, size_t b) { return (a + b - 1) / b; }

class NvidiaDescriptor final : public Descriptor {
  public:
    NvidiaDescriptor(int device_id, const Info &info, size_t tiles, size_t tile_elements)
        : Descriptor(INFINI_DEVICE_NVIDIA, device_id, info), tiles_(tiles), tile_elements_(tile_elements) {}

    // + kAlign: the caller's pointer is aligned up before use.
    size_t workspaceSize() const override {
        if (info.channels == 0) return 0;
        return kAlign + partialBytes() + alignUp(info.channels * sizeof(ChannelCoefficients));
    }

    infiniStatus_t calculate(void *workspace, void *grad_input, void *grad_weight, void *grad_bias,
                             const void *input, const void *grad_output, const void *weight,
                             const void *running_mean, const void *running_var, const void * /*save_mean*/,
                             const void * /*save_invstd: seedFeatures only*/, void *stream) const override {
        if (info.channels == 0) return INFINI_STATUS_SUCCESS;
        INFINI_CHECK(nvidia::useDevice(device_id));
        char *base = reinterpret_cast<char *>((reinterpret_cast<uintptr_t>(workspace) + kAlign - 1) / kAlign * kAlign);
        auto *partials = reinterpret_cast<double2 *>(base);
        auto *coefficients = reinterpret_cast<ChannelCoefficients *>(base + partialBytes());
        auto cuda_stream = static_cast<cudaStream_t>(stream);

        return nvidia::withNormFloat(info.dtype, [&](auto tag) {
            using T = decltype(tag);
            constexpr int V = nvidia::kVec<T>;
            const Args<T> args{static_cast<T *>(grad_input),
                               static_cast<const T *>(input),
                               static_cast<const T *>(grad_output),
                               info.batch,
                               info.channels,
                               info.length,
                               tiles_,
                               tile_elements_};
            const bool vectors = info.length % V == 0 && nvidia::aligned16(grad_input) && nvidia::aligned16(input) &&
                                 nvidia::aligned16(grad_output);
            const unsigned grid = static_cast<unsigned>(info.channels * tiles_);
            const bool any_elements = info.batch * info.length > 0;

            if (any_elements) {
                if (vectors) {
                    tileSumsKernel<T, V><<<grid, kThreads, 0, cuda_stream>>>(
                        args, static_cast<const T *>(running_mean), info.running_mean_stride, partials);
                } else {
                    tileSumsKernel<T, 1><<<grid, kThreads, 0, cuda_stream>>>(
                        args, static_cast<const T *>(running_mean), info.running_mean_stride, partials);
                }
                INFINI_CHECK(nvidia::launchStatus());
            }

            const ChannelArgs<T> channel_args{static_cast<T *>(grad_weight),
                                              static_cast<T *>(grad_bias),
                                              static_cast<const T *>(weight),
                                              static_cast<const T *>(running_mean),
                                              static_cast<const T *>(running_var),
                                              info.grad_weight_stride,
                                              info.grad_bias_stride,
                                              info.weight_stride,
                                              info.running_mean_stride,
                                              info.running_var_stride,
                                              info.channels,
                                              any_elements ? tiles_ : 0,
                                              static_cast<double>(info.batch * info.length)};
            channelKernel<T><<<static_cast<unsigned>(ceilDiv(info.channels, 8)), 256, 0, cuda_stream>>>(
                channel_args, partials, coefficients);
            INFINI_CHECK(nvidia::launchStatus());

            if (any_elements) {
                if (vectors) {
                    gradInputKernel<T, V><<<grid, kThreads, 0, cuda_stream>>>(args, coefficients);
                } else {
                    gradInputKernel<T, 1><<<grid, kThreads, 0, cuda_stream>>>(args, coefficients);
                }
                INFINI_CHECK(nvidia::launchStatus());
            }
            return INFINI_STATUS_SUCCESS;
        });
    }

  private:
    size_t partialBytes() const { return alignUp(info.channels * tiles_ * sizeof(double2)); }

    size_t tiles_, tile_elements_;
};

} // namespace

infiniStatus_t Backends::nvidia(const Info &info, int device_id, Descriptor **desc) {
    if (!info.seedFeatures()) return INFINI_STATUS_NOT_IMPLEMENTED;
    size_t tiles = 1, tile_elements = kTileAlign;
    const size_t per_channel = info.batch * info.length;
    if (info.channels > 0 && per_channel > 0) {
        INFINI_CHECK(nvidia::useDevice(device_id));
        int sms = 1, per_sm = 1;
        INFINI_CHECK(nvidia::multiprocessorCount(device_id, &sms));
        INFINI_CHECK(nvidia::residentCtas(tileSumsKernel<float, 4>, kThreads, &per_sm));
        // About two waves of CTAs over all channels, each tile at least kMinTile elements.
        const size_t wanted = ceilDiv(2 * static_cast<size_t>(sms) * per_sm, info.channels);
        tiles = std::max<size_t>(1, std::min(wanted, ceilDiv(per_channel, kMinTile)));
        tile_elements = ceilDiv(ceilDiv(per_channel, tiles), kTileAlign) * kTileAlign;
        tiles = ceilDiv(per_channel, tile_elements);
    }
    if (info.channels * tiles > 0x7fffffffu) return INFINI_STATUS_BAD_TENSOR_SHAPE; // beyond one grid
    *desc = new NvidiaDescriptor(device_id, info, tiles, tile_elements);
    return INFINI_STATUS_SUCCESS;
}

} // namespace op::batch_norm_backward
