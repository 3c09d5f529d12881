// BatchNorm forward on NVIDIA GPUs, in up to three launches on the caller's stream:
//  1. (training) sums: each CTA takes one fixed tile of one channel's elements (channels-first) or of the rows of
//     a block of 32 channels (rows of channels: channels-last, or L == 1) and adds the shifted sums
//     sum(x - r), sum((x - r)^2) into an F64 partial per channel, r the channel's first element, so a channel
//     whose mean is large against its spread loses nothing to cancellation (the CPU backend's method);
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

#include <algorithm>

namespace op::batch_norm {
namespace {

using nvidia::ComputeOf;

constexpr int kThreads = 256;
constexpr int kChannelLanes = 32;                         // rows of channels: channels per CTA
constexpr int kRowLanes = kThreads / kChannelLanes;       // rows of channels: rows a CTA takes at once
constexpr size_t kMinTile = 4096;                         // elements per CTA, so a tile is worth launching
constexpr size_t kAlign = 256;

// y = (x - reference) * scale + shift, per channel, in the compute type.
template <typename C>
struct ChannelTerms {
    C reference, scale, shift;
};

// The big tensors and their tiling.
template <typename T>
struct Args {
    T *y;
    const T *x;
    size_t batch, channels, length;
    size_t tiles;         // channels-first: tiles per channel; rows of channels: row tiles
    size_t tile_elements; // channels-first: elements of a channel per tile; rows of channels: rows per tile
};

// The channel's first element: the reference its shifted sums are taken about.
template <typename T>
__device__ __forceinline__ ComputeOf<T> referenceOf(const Args<T> &args, size_t c, bool rows_of_channels) {
    return nvidia::widen(args.x[rows_of_channels ? c : c * args.length]);
}

// ---------------------------------------------------------------- channels-first (N, C, L), L > 1

// Calls body(offset) for this thread's elements of tile `tile` of channel c: the tile covers [begin, end) of the
// channel's (n, l) elements in row-major order, thread t takes t, t + kThreads, ... No division in the loop.
template <typename T, typename Body>
__device__ __forceinline__ void forTileElements(const Args<T> &args, size_t c, size_t tile, Body &&body) {
    const size_t units = args.batch * args.length;
    const size_t begin = tile * args.tile_elements, end = min(begin + args.tile_elements, units);
    size_t unit = begin + threadIdx.x;
    if (unit >= end) return;
    size_t n = unit / args.length, l = unit % args.length;
    const size_t step_n = kThreads / args.length, step_l = kThreads % args.length;
    for (; unit < end; unit += kThreads) {
        body(static_cast<ptrdiff_t>((n * args.channels + c) * args.length + l));
        l += step_l;
        n += step_n;
        if (l >= args.length) {
            l -= args.length;
            ++n;
        }
    }
}

template <typename T>
__global__ void __launch_bounds__(kThreads) tileSumsKernel(Args<T> args, double2 *partials) {
    using C = ComputeOf<T>;
    __shared__ double2 scratch[33];
    const size_t c = blockIdx.x / args.tiles, tile = blockIdx.x % args.tiles;
    const C reference = referenceOf(args, c, false);
    double sum = 0, sum_squares = 0;
    forTileElements(args, c, tile, [&](ptrdiff_t offset) {
        const C d = nvidia::widen(args.x[offset]) - reference;
        sum += d;
        sum_squares += static_cast<double>(d) * d;
    });
    const double2 sums = nvidia::blockSum(make_double2(sum, sum_squares), scratch);
    if (threadIdx.x == 0) partials[blockIdx.x] = sums;
}

// y may be x itself: each element is read before it is written, by the same thread.
template <typename T>
__global__ void __launch_bounds__(kThreads) tileOutputKernel(Args<T> args, const ChannelTerms<ComputeOf<T>> *terms) {
    using C = ComputeOf<T>;
    const size_t c = blockIdx.x / args.tiles, tile = blockIdx.x % args.tiles;
    const ChannelTerms<C> k = terms[c];
    forTileElements(args, c, tile, [&](ptrdiff_t offset) {
        args.y[offset] = nvidia::narrow<T>((nvidia::widen(args.x[offset]) - k.reference) * k.scale + k.shift);
    });
}

// ---------------------------------------------------------------- rows of channels (N*L rows of C)

// CTA (tile, block): thread (x, y) takes channel block * 32 + x and rows first + y, first + y + kRowLanes, ... of
// its row tile.
struct RowsThread {
    size_t channel, first, last;
    bool active;
};

template <typename T>
__device__ __forceinline__ RowsThread rowsThread(const Args<T> &args) {
    const size_t blocks = (args.channels + kChannelLanes - 1) / kChannelLanes;
    const size_t tile = blockIdx.x / blocks, block = blockIdx.x % blocks;
    const size_t rows = args.batch * args.length;
    RowsThread t;
    t.channel = block * kChannelLanes + threadIdx.x;
    t.active = t.channel < args.channels;
    t.first = min(tile * args.tile_elements, rows);
    t.last = min(t.first + args.tile_elements, rows);
    return t;
}

template <typename T>
__global__ void __launch_bounds__(kThreads) rowsSumsKernel(Args<T> args, double2 *partials) {
    using C = ComputeOf<T>;
    __shared__ double2 lanes[kRowLanes][kChannelLanes];
    const RowsThread t = rowsThread(args);
    double sum = 0, sum_squares = 0;
    if (t.active) {
        const C reference = referenceOf(args, t.channel, true);
        for (size_t row = t.first + threadIdx.y; row < t.last; row += kRowLanes) {
            const C d = nvidia::widen(args.x[row * args.channels + t.channel]) - reference;
            sum += d;
            sum_squares += static_cast<double>(d) * d;
        }
    }
    lanes[threadIdx.y][threadIdx.x] = make_double2(sum, sum_squares);
    __syncthreads();
    if (threadIdx.y == 0 && t.active) {
        double2 total = make_double2(0.0, 0.0);
        for (int y = 0; y < kRowLanes; ++y) total = nvidia::add(total, lanes[y][threadIdx.x]); // lane order
        const size_t blocks = (args.channels + kChannelLanes - 1) / kChannelLanes;
        partials[t.channel * args.tiles + blockIdx.x / blocks] = total;
    }
}

template <typename T>
__global__ void __launch_bounds__(kThreads) rowsOutputKernel(Args<T> args, const ChannelTerms<ComputeOf<T>> *terms) {
    using C = ComputeOf<T>;
    const RowsThread t = rowsThread(args);
    if (!t.active) return;
    const ChannelTerms<C> k = terms[t.channel];
    for (size_t row = t.first + threadIdx.y; row < t.last; row += kRowLanes) {
        const size_t offset = row * args.channels + t.channel;
        args.y[offset] = nvidia::narrow<T>((nvidia::widen(args.x[offset]) - k.reference) * k.scale + k.shift);
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
                                                     ChannelTerms<ComputeOf<T>> *terms, bool rows_of_channels) {
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
    const C reference = referenceOf(data, c, rows_of_channels);
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

size_t alignUp(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }
size_t ceilDiv(size_t a, size_t b) { return (a + b - 1) / b; }

// Whether the big tensors are N*L rows of C channels (channels-last, or L == 1), as the CPU backend decides.
bool rowsOfChannels(const Info &info) { return info.layout == Layout::channels_last || info.length == 1; }
size_t channelBlocks(const Info &info) { return ceilDiv(info.channels, kChannelLanes); }

class NvidiaDescriptor final : public Descriptor {
  public:
    NvidiaDescriptor(int device_id, const Info &info, size_t tiles, size_t tile_elements)
        : Descriptor(INFINI_DEVICE_NVIDIA, device_id, info), tiles_(tiles), tile_elements_(tile_elements) {
        if (info.channels == 0) return;
        const size_t term_size = info.dtype == INFINI_DTYPE_F64 ? sizeof(ChannelTerms<double>) : sizeof(ChannelTerms<float>);
        // + kAlign: the caller's pointer is aligned up before use.
        workspace_ = infini::CheckedSize(kAlign) +
                     (info.training ? infini::CheckedSize(info.channels) * tiles_ * sizeof(double2) + kAlign : 0) +
                     infini::CheckedSize(info.channels) * term_size;
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
        char *base = reinterpret_cast<char *>((reinterpret_cast<uintptr_t>(workspace) + kAlign - 1) / kAlign * kAlign);
        const size_t partial_bytes = info.training ? alignUp(info.channels * tiles_ * sizeof(double2)) : 0;
        auto *partials = reinterpret_cast<double2 *>(base);
        const auto cuda_stream = static_cast<cudaStream_t>(stream);
        const bool any_elements = info.batch * info.length > 0;
        const bool rows = rowsOfChannels(info);

        return nvidia::withDataAndParameterTypes(info.dtype, info.parameter_dtype, [&](auto data_tag, auto parameter_tag) {
            using T = decltype(data_tag);
            using W = decltype(parameter_tag);
            using C = ComputeOf<T>;
            auto *terms = reinterpret_cast<ChannelTerms<C> *>(base + partial_bytes);
            const Args<T> args{static_cast<T *>(y), static_cast<const T *>(x), info.batch, info.channels, info.length,
                               tiles_, tile_elements_};
            const unsigned grid = static_cast<unsigned>(rows ? tiles_ * channelBlocks(info) : info.channels * tiles_);
            const dim3 block = rows ? dim3(kChannelLanes, kRowLanes) : dim3(kThreads);
            if (info.training && any_elements) {
                if (rows) {
                    rowsSumsKernel<T><<<grid, block, 0, cuda_stream>>>(args, partials);
                } else {
                    tileSumsKernel<T><<<grid, block, 0, cuda_stream>>>(args, partials);
                }
                INFINI_CHECK(nvidia::launchStatus());
            }
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
                                                 tiles_,
                                                 static_cast<double>(info.batch * info.length),
                                                 info.momentum,
                                                 info.epsilon,
                                                 info.training};
            channelKernel<T, W, C><<<static_cast<unsigned>(ceilDiv(info.channels, 8)), 256, 0, cuda_stream>>>(
                channel_args, args, partials, terms, rows);
            INFINI_CHECK(nvidia::launchStatus());
            if (!any_elements) return INFINI_STATUS_SUCCESS;
            if (rows) {
                rowsOutputKernel<T><<<grid, block, 0, cuda_stream>>>(args, terms);
            } else {
                tileOutputKernel<T><<<grid, block, 0, cuda_stream>>>(args, terms);
            }
            return nvidia::launchStatus();
        });
    }

  private:
    size_t tiles_, tile_elements_;
    infini::CheckedSize workspace_;
};

// Tiles for about two waves of CTAs, each at least kMinTile elements; the grid must fit.
infiniStatus_t planTiles(const Info &info, int device_id, size_t *tiles, size_t *tile_elements) {
    const size_t elements_per_channel = info.batch * info.length;
    *tiles = 1;
    *tile_elements = std::max<size_t>(elements_per_channel, 1);
    if (info.channels == 0 || elements_per_channel == 0) return INFINI_STATUS_SUCCESS;
    const nvidia::DeviceScope device_scope(device_id);
    INFINI_CHECK(device_scope.status());
    int sms = 1, per_sm = 1;
    INFINI_CHECK(nvidia::multiprocessorCount(device_id, &sms));
    INFINI_CHECK(nvidia::residentCtas(tileSumsKernel<float>, kThreads, &per_sm));
    const size_t waves = 2 * static_cast<size_t>(sms) * per_sm;
    // Channels-first: CTAs per channel; rows of channels: row tiles per channel block (rows per tile >= kRowLanes).
    const size_t ctas_per_tile = rowsOfChannels(info) ? channelBlocks(info) : info.channels;
    const size_t per_cta = rowsOfChannels(info) ? std::max<size_t>(1, kMinTile / std::min<size_t>(info.channels, kChannelLanes))
                                                : kMinTile;
    const size_t wanted = std::max<size_t>(1, ceilDiv(waves, ctas_per_tile));
    *tiles = std::max<size_t>(1, std::min(wanted, ceilDiv(elements_per_channel, per_cta)));
    *tile_elements = ceilDiv(elements_per_channel, *tiles);
    *tiles = ceilDiv(elements_per_channel, *tile_elements);
    return *tiles * ctas_per_tile > 0x7fffffffu ? INFINI_STATUS_BAD_TENSOR_SHAPE : INFINI_STATUS_SUCCESS;
}

} // namespace

infiniStatus_t Backends::nvidia(const Info &info, int device_id, Descriptor **desc) {
    size_t tiles = 1, tile_elements = 1;
    INFINI_CHECK(planTiles(info, device_id, &tiles, &tile_elements));
    *desc = new NvidiaDescriptor(device_id, info, tiles, tile_elements);
    return INFINI_STATUS_SUCCESS;
}

} // namespace op::batch_norm
