// BatchNorm backward on the CPU, in two passes over fixed tiles of (batch block, length chunk):
// pass 1 sums grad_output and grad_output*(x - mean) per channel into each tile's F64 partials, which are
// then added in tile order; pass 2 writes grad_input = a*grad_output + b*(x - mean) + c per channel.
#include "../batch_norm_backward.h"

#include "batch_norm_backward_simd.h"
#include "devices/cpu/half.h"
#include "devices/cpu/parallel.h"
#include "devices/cpu/workspace.h"

#include <algorithm>
#include <cmath>

namespace op::batch_norm_backward {
namespace {

constexpr size_t kMaxTiles = 64;
constexpr size_t kMinChunk = 4096; // elements of a row per tile, so tiles stay worth a task

class CpuDescriptor final : public Descriptor {
  public:
    CpuDescriptor(int device_id, const Info &info)
        : Descriptor(INFINI_DEVICE_CPU, device_id, info),
          batch_blocks_(cpu::Blocks::split(info.batch, kMaxTiles)),
          length_chunks_(cpu::Blocks::split(
              info.length, std::max<size_t>(1, std::min(kMaxTiles / std::max<size_t>(1, batch_blocks_.count),
                                                        (info.length + kMinChunk - 1) / kMinChunk)))) {}

    // Per tile: F64 sums and F32 lane scratch for every channel; then the per-channel coefficients.
    size_t workspaceSize() const override {
        return cpu::withAlignmentSlack(
            tiles() * info.channels * (2 * sizeof(double) + kChannelScratchFloats * sizeof(float)) +
            info.channels * sizeof(ChannelCoefficients));
    }

    infiniStatus_t calculate(void *workspace, void *grad_input, void *grad_weight, void *grad_bias,
                             const void *input, const void *grad_output, const void *weight,
                             const void *running_mean, const void *running_var, void *) const override {
        cpu::withNormFloat(info.dtype, [&](auto tag) {
            using T = decltype(tag);
            run(cpu::alignedWorkspace(workspace), static_cast<T *>(grad_input), static_cast<T *>(grad_weight),
                static_cast<T *>(grad_bias), static_cast<const T *>(input), static_cast<const T *>(grad_output),
                static_cast<const T *>(weight), static_cast<const T *>(running_mean),
                static_cast<const T *>(running_var));
            return 0;
        });
        return INFINI_STATUS_SUCCESS;
    }

  private:
    size_t tiles() const { return batch_blocks_.count * length_chunks_.count; }

    Tile tile(size_t index) const {
        size_t batch_block = index / length_chunks_.count, chunk = index % length_chunks_.count;
        return Tile{batch_blocks_.begin(batch_block), batch_blocks_.end(batch_block, info.batch),
                    info.channels,                    info.length,
                    length_chunks_.begin(chunk),      length_chunks_.end(chunk, info.length)};
    }

    template <typename T>
    void run(void *workspace, T *grad_input, T *grad_weight, T *grad_bias, const T *input, const T *grad_output,
             const T *weight, const T *running_mean, const T *running_var) const {
        const size_t channels = info.channels;
        double *sums = static_cast<double *>(workspace); // [tile][channel][2]
        float *scratch = reinterpret_cast<float *>(sums + tiles() * channels * 2);
        auto *coefficients = reinterpret_cast<ChannelCoefficients *>(scratch + tiles() * channels * kChannelScratchFloats);
        auto channelValue = [](const T *vector, ptrdiff_t stride, size_t c) {
            return cpu::toFloat(vector[static_cast<ptrdiff_t>(c) * stride]);
        };
        for (size_t c = 0; c < channels; ++c) {
            coefficients[c].mean = channelValue(running_mean, info.running_mean_stride, c);
        }
        const Kernels<T> &kernels = cpu::selectedTable<Kernels<T>>();

        cpu::parallelFor(tiles(), [&](size_t t) {
            double *tile_sums = sums + t * channels * 2;
            std::fill(tile_sums, tile_sums + channels * 2, 0.0);
            kernels.sums(tile(t), grad_output, input, coefficients, scratch + t * channels * kChannelScratchFloats,
                         tile_sums);
        });

        const double count = static_cast<double>(info.batch * info.length);
        for (size_t c = 0; c < channels; ++c) {
            double sum_grad = 0.0, sum_grad_centered = 0.0;
            for (size_t t = 0; t < tiles(); ++t) {
                sum_grad += sums[(t * channels + c) * 2];
                sum_grad_centered += sums[(t * channels + c) * 2 + 1];
            }
            const double inv_std = 1.0 / std::sqrt(static_cast<double>(channelValue(running_var, info.running_var_stride, c)));
            const double scale = channelValue(weight, info.weight_stride, c) * inv_std;
            grad_bias[static_cast<ptrdiff_t>(c) * info.grad_bias_stride] = cpu::fromFloat<T>(static_cast<float>(sum_grad));
            grad_weight[static_cast<ptrdiff_t>(c) * info.grad_weight_stride] =
                cpu::fromFloat<T>(count > 0 ? static_cast<float>(sum_grad_centered * inv_std) : 0.0f);
            if (count > 0) {
                coefficients[c].scale_grad = static_cast<float>(scale);
                coefficients[c].scale_centered = static_cast<float>(-scale * inv_std * inv_std * sum_grad_centered / count);
                coefficients[c].shift = static_cast<float>(-scale * sum_grad / count);
            }
        }

        cpu::parallelFor(tiles(), [&](size_t t) { kernels.apply(tile(t), grad_output, input, coefficients, grad_input); });
    }

    cpu::Blocks batch_blocks_;
    cpu::Blocks length_chunks_;
};

} // namespace

infiniStatus_t Backends::cpu(const Info &info, int device_id, Descriptor **desc) {
    *desc = new CpuDescriptor(device_id, info);
    return INFINI_STATUS_SUCCESS;
}

} // namespace op::batch_norm_backward
