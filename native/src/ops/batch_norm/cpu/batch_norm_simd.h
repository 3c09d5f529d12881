// BatchNorm forward CPU leaf kernels, per ISA, over the backward's tiles (batch_norm_backward/cpu/
// batch_norm_tiling.h): a statistics pass taking shifted sums of x per channel, and the pass writing
// y = (x - reference) * scale + shift per channel.
#ifndef INFINIOP_SRC_OPS_BATCH_NORM_CPU_SIMD_H
#define INFINIOP_SRC_OPS_BATCH_NORM_CPU_SIMD_H

#include "ops/batch_norm_backward/cpu/batch_norm_backward_simd.h"

namespace op::batch_norm {

using batch_norm_backward::RowTile;
using batch_norm_backward::Tile;

// Per position (channels-first tiles: per channel) F32 terms of y = (x - reference) * scale + shift.
struct Coefficients {
    const float *reference, *scale, *shift;
};

template <typename T>
struct Kernels {
    // sums[2c] += sum(x - reference[c]), sums[2c+1] += sum((x - reference[c])^2) over the tile's channels, as the
    // backward's sums pass takes its sums (F32 lanes flushed into F64; scratch: kChannelScratchFloats per channel).
    void (*sums)(const Tile &tile, const T *x, const float *reference, float *scratch, double *sums);
    // y over the tile; y may be x. stream_output: write it past the caches (the same bits either way).
    void (*apply)(const Tile &tile, const T *x, const Coefficients &coefficients, T *y, bool stream_output);
};

template <typename T>
struct RowKernels {
    // As Kernels, over periodic rows: `reference` holds period values, scratch 2 * period floats.
    void (*sums)(const RowTile &tile, const T *x, const float *reference, float *scratch, double *sums);
    void (*apply)(const RowTile &tile, const T *x, const Coefficients &coefficients, T *y, bool stream_output);
};

} // namespace op::batch_norm

#endif
