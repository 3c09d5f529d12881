// How BatchNorm's forward and backward cut their big tensors among CTAs on NVIDIA GPUs, shared by both. Two
// tilings, as on the CPU: channels-first (N, C, L) with L > 1 tiles each channel's N*L elements, a CTA per (channel,
// tile); rows of channels (channels-last, or L == 1: N*L rows of C contiguous channels) tiles the rows, a CTA per
// (row tile, channel block), its threads spread over (channel group, row lane) so that neighbouring threads read
// neighbouring elements. A thread takes V contiguous elements at a time (16-byte vectors where the tensors allow
// them, else V = 1). Tiles are fixed at creation, so the sums' order, and their bits, never depend on timing.
#ifndef INFINI_OPS_BATCH_NORM_TILES_NVIDIA_CUH
#define INFINI_OPS_BATCH_NORM_TILES_NVIDIA_CUH

#include "common/status.h"
#include "common/tensor.h"
#include "devices/nvidia/nvidia_reduce.cuh"
#include "devices/nvidia/nvidia_status.h"
#include "ops/batch_norm_layout.h"

#include <algorithm>
#include <cstddef>

namespace op::batch_norm_tiles {

constexpr int kThreads = 256;
constexpr size_t kMinTile = 4096; // elements per CTA, so a tile is worth launching
constexpr size_t kTileAlign = 8;  // channels-first tile starts are whole vectors of any width used
constexpr int kFlushRows = 64;    // rows of channels: rows a thread sums in the compute type before adding into F64
// Rows of channels: a CTA's threads span at most a warp of channel groups (512 bytes of a row with 16-byte
// vectors, as coalesced as wider) and take the rest as row lanes; wide C gets more channel blocks instead, so
// that row tiles can stay long.
constexpr unsigned kChannelGroups = 32;
// Rows of channels: a row tile covers at least this many bytes of each channel in each big tensor. Its F64
// partials (16 bytes per channel, written once and read once) then stay under 1/8 of what the sums pass reads:
// with tiles of 4 rows (128 x 2048 channels, 7x7, BF16, 1568 CTAs on an H200) they had outweighed the data.
constexpr size_t kMinTileBytesPerChannel = 64;

inline size_t ceilDiv(size_t a, size_t b) { return (a + b - 1) / b; }

// The big tensors' shape and their tiling: what a kernel's arguments start with.
struct Tiling {
    size_t batch, channels, length;
    size_t tiles;         // channels-first: tiles per channel; rows of channels: row tiles
    size_t tile_elements; // channels-first: elements of a channel per tile (a multiple of kTileAlign); rows of
                          // channels: rows per tile
    bool rows_of_channels; // N*L rows of C channels (channels-last, or L == 1, as the CPU backend decides)

    // The contiguous run a 16-byte vector walks (its length must be a multiple of the vector's elements): a row of
    // channels, or a channel's L.
    size_t run() const { return rows_of_channels ? channels : length; }
};

// Channels-first: walks this thread's vectors of one tile of channel c. The tile covers [begin, end) of the
// channel's (n, l) elements in row-major order; thread t takes vectors t, t + kThreads, ... (V divides L). Calls
// body(offset in elements of the vector's first element). No division inside the loop.
template <int V, typename Body>
__device__ __forceinline__ void forTileVectors(const Tiling &tiling, size_t c, size_t tile, Body &&body) {
    const size_t units_per_row = tiling.length / V;
    const size_t units = tiling.batch * units_per_row;
    const size_t begin = tile * (tiling.tile_elements / V);
    const size_t end = min(begin + tiling.tile_elements / V, units);
    size_t unit = begin + threadIdx.x;
    if (unit >= end) return;
    size_t n = unit / units_per_row, l = unit % units_per_row;
    const size_t step_n = kThreads / units_per_row, step_l = kThreads % units_per_row;
    for (; unit < end; unit += kThreads) {
        body(static_cast<ptrdiff_t>(((n * tiling.channels + c) * units_per_row + l) * V));
        l += step_l;
        n += step_n;
        if (l >= units_per_row) {
            l -= units_per_row;
            ++n;
        }
    }
}

// Rows of channels: a CTA of kThreads threads as (groups, row lanes): thread (g, y) takes channels [g*V, g*V + V)
// of CTA channel block `block` and rows first + y, first + y + row_lanes, ... of its row tile.
struct RowsShape {
    unsigned groups, row_lanes, channel_blocks;

    static RowsShape of(size_t channels, int V) {
        const size_t channel_groups = (channels + V - 1) / V;
        const unsigned groups = static_cast<unsigned>(std::min<size_t>(channel_groups, kChannelGroups));
        return RowsShape{groups, kThreads / groups, static_cast<unsigned>((channel_groups + groups - 1) / groups)};
    }
    unsigned grid(const Tiling &tiling) const { return static_cast<unsigned>(tiling.tiles * channel_blocks); }
};

// This thread's first channel (of V), whether it has any, and its row tile's rows [first, last).
struct RowsThread {
    size_t channel, first, last;
    bool active;
};

template <int V>
__device__ __forceinline__ RowsThread rowsThread(const Tiling &tiling, const RowsShape &shape) {
    const size_t tile = blockIdx.x / shape.channel_blocks, block = blockIdx.x % shape.channel_blocks;
    const size_t rows = tiling.batch * tiling.length;
    RowsThread t;
    t.channel = (block * shape.groups + threadIdx.x) * V;
    t.active = t.channel < tiling.channels; // V > 1 only when V divides C: a group is all in or all out
    t.first = min(tile * tiling.tile_elements, rows);
    t.last = min(t.first + tiling.tile_elements, rows);
    return t;
}

// Rows of channels: the CTA's partial of each of its channels over its row tile, from each thread's totals of its V
// channels, the row lanes added in lane order through `lanes` (kThreads entries of shared memory), into
// partials[channel * tiles + tile]. Every thread of the CTA calls it: the barriers are the CTA's.
template <int V>
__device__ __forceinline__ void writeRowsPartials(const Tiling &tiling, const RowsShape &shape, const RowsThread &t,
                                                  const double2 (&totals)[V], double2 *lanes, double2 *partials) {
    const size_t tile = blockIdx.x / shape.channel_blocks;
    for (int v = 0; v < V; ++v) {
        lanes[threadIdx.y * shape.groups + threadIdx.x] = totals[v];
        __syncthreads();
        if (threadIdx.y == 0 && t.active) {
            double2 sum = make_double2(0.0, 0.0);
            for (unsigned y = 0; y < shape.row_lanes; ++y) sum = nvidia::add(sum, lanes[y * shape.groups + threadIdx.x]);
            partials[(t.channel + v) * tiling.tiles + tile] = sum;
        }
        __syncthreads();
    }
}

// Launches one pass over the big tensors with V-element vectors: rows_kernel(args, shape, rest...) on a CTA of
// (groups, row lanes) per (row tile, channel block) for rows of channels, else tile_kernel(args, rest...) on a CTA
// of kThreads per (channel, tile).
template <int V, typename Args, typename RowsKernel, typename TileKernel, typename... Rest>
infiniStatus_t launchTiles(const Args &args, RowsKernel rows_kernel, TileKernel tile_kernel, cudaStream_t stream,
                           const Rest &...rest) {
    if (args.rows_of_channels) {
        const RowsShape shape = RowsShape::of(args.channels, V);
        rows_kernel<<<shape.grid(args), dim3(shape.groups, shape.row_lanes), 0, stream>>>(args, shape, rest...);
    } else {
        tile_kernel<<<static_cast<unsigned>(args.channels * args.tiles), kThreads, 0, stream>>>(args, rest...);
    }
    return nvidia::launchStatus();
}

// The tiling of info's (N, C, L) tensors: tiles for about two waves of CTAs of `sums_kernel` (kThreads threads),
// each at least kMinTile elements (rows of channels: and at least kMinTileBytesPerChannel of each channel); the
// grid must fit. Info is the forward's or the backward's.
template <typename Info, typename Kernel>
infiniStatus_t planTiles(const Info &info, int device_id, Kernel sums_kernel, Tiling *tiling) {
    const size_t batch = info.batch, channels = info.channels, length = info.length;
    const size_t rows = batch * length, element_size = infini::dtypeSize(info.dtype);
    const bool rows_of_channels = info.layout == BatchNormLayout::channels_last || length == 1;
    *tiling = Tiling{batch, channels, length, 1, rows_of_channels ? std::max<size_t>(rows, 1) : kTileAlign,
                     rows_of_channels};
    if (channels == 0 || rows == 0) return INFINI_STATUS_SUCCESS;
    const nvidia::DeviceScope device_scope(device_id);
    INFINI_CHECK(device_scope.status());
    int sms = 1, per_sm = 1;
    INFINI_CHECK(nvidia::multiprocessorCount(device_id, &sms));
    INFINI_CHECK(nvidia::residentCtas(sums_kernel, kThreads, &per_sm));
    const size_t waves = 2 * static_cast<size_t>(sms) * per_sm;
    size_t &tiles = tiling->tiles, &tile_elements = tiling->tile_elements;
    if (rows_of_channels) {
        // Channel blocks as with vectors of the widest kind that divides C; rows split so the CTAs fill `waves`.
        const int vec = static_cast<int>(16 / element_size);
        const size_t blocks = RowsShape::of(channels, channels % vec == 0 ? vec : 1).channel_blocks;
        const size_t wanted = std::max<size_t>(1, ceilDiv(waves, blocks));
        const size_t min_rows = ceilDiv(kMinTileBytesPerChannel, element_size);
        tiles = std::max<size_t>(1, std::min({wanted, ceilDiv(rows * channels, kMinTile), rows / min_rows}));
        tile_elements = ceilDiv(rows, tiles); // rows per tile
        tiles = ceilDiv(rows, tile_elements);
        return tiles * RowsShape::of(channels, 1).channel_blocks > 0x7fffffffu ? INFINI_STATUS_BAD_TENSOR_SHAPE
                                                                               : INFINI_STATUS_SUCCESS;
    }
    const size_t wanted = ceilDiv(waves, channels);
    tiles = std::max<size_t>(1, std::min(wanted, ceilDiv(rows, kMinTile)));
    tile_elements = ceilDiv(ceilDiv(rows, tiles), kTileAlign) * kTileAlign;
    tiles = ceilDiv(rows, tile_elements);
    return channels * tiles > 0x7fffffffu ? INFINI_STATUS_BAD_TENSOR_SHAPE : INFINI_STATUS_SUCCESS;
}

} // namespace op::batch_norm_tiles

#endif
