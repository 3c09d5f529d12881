// BatchNorm backward CPU leaf kernels over one tile (a block of the batch x a chunk of the length), per ISA.
#ifndef INFINIOP_SRC_OPS_BATCH_NORM_BACKWARD_CPU_SIMD_H
#define INFINIOP_SRC_OPS_BATCH_NORM_BACKWARD_CPU_SIMD_H

#include "devices/cpu/half.h"
#include "devices/cpu/isa.h"

#include <cstddef>

namespace op::batch_norm_backward {

// Elements [begin, end) of the length dim, for batches [batch_begin, batch_end), all channels.
struct Tile {
    size_t batch_begin, batch_end, channels, length, begin, end;
};

// grad_input = scale_grad * grad_output + scale_centered * (x - mean) + shift, per channel.
struct ChannelCoefficients {
    float mean, scale_grad, scale_centered, shift;
};

// Per-channel F32 lane accumulators a tile's sums pass keeps in the workspace.
constexpr size_t kChannelScratchFloats = 48;

template <typename T>
struct Kernels {
    // sums[2c] += sum of grad_output, sums[2c+1] += sum of grad_output*(x - mean_c) over the tile, F32 lanes
    // flushed into F64 every 4096 elements of a channel. scratch: kChannelScratchFloats per channel.
    void (*sums)(const Tile &tile, const T *grad_output, const T *input, const ChannelCoefficients *coefficients,
                 float *scratch, double *sums);
    // grad_input over the tile from the per-channel coefficients; grad_input may be grad_output.
    void (*apply)(const Tile &tile, const T *grad_output, const T *input, const ChannelCoefficients *coefficients,
                  T *grad_input);
};

} // namespace op::batch_norm_backward

#endif
