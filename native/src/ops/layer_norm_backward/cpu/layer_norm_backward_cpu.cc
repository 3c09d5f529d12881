// LayerNorm backward on the CPU. Per row: one pass reduces mean(g) and mean(g*xhat) with g = grad_output*weight,
// a second writes grad_input while the row is still in cache and adds grad_output*xhat and grad_output into
// the row block's F32 partials; the partials are summed in block order at the end.
#include "../layer_norm_backward.h"

#include "devices/cpu/half.h"
#include "devices/cpu/parallel.h"
#include "devices/cpu/reduce.h"

namespace op::layer_norm_backward {
namespace {

constexpr size_t kMaxRowBlocks = 64;

class CpuDescriptor final : public Descriptor {
  public:
    CpuDescriptor(int device_id, const Info &info)
        : Descriptor(INFINI_DEVICE_CPU, device_id, info), blocks_(cpu::Blocks::split(info.rows, kMaxRowBlocks)) {}

    // weight as F32, then per row block one grad_weight and one grad_bias F32 partial of length L.
    size_t workspaceSize() const override { return (1 + 2 * blocks_.count) * info.dim * sizeof(float); }

    infiniStatus_t calculate(void *workspace, void *grad_input, void *grad_weight, void *grad_bias,
                             const void *grad_output, const void *weight, const void *input_standardization,
                             const void *input_std_deviation, void *) const override {
        cpu::withNormFloat(info.dtype, [&](auto tag) {
            using T = decltype(tag);
            run(static_cast<float *>(workspace), static_cast<T *>(grad_input), static_cast<T *>(grad_weight),
                static_cast<T *>(grad_bias), static_cast<const T *>(grad_output), static_cast<const T *>(weight),
                static_cast<const T *>(input_standardization), static_cast<const T *>(input_std_deviation));
            return 0;
        });
        return INFINI_STATUS_SUCCESS;
    }

  private:
    template <typename T>
    void run(float *workspace, T *grad_input, T *grad_weight, T *grad_bias, const T *grad_output, const T *weight,
             const T *xhat, const T *std_deviation) const {
        const size_t dim = info.dim;
        float *weight_f32 = workspace;
        float *weight_partials = workspace + dim;
        float *bias_partials = weight_partials + blocks_.count * dim;
        for (size_t j = 0; j < dim; ++j) {
            weight_f32[j] = cpu::toFloat(weight[static_cast<ptrdiff_t>(j) * info.weight_stride]);
        }

        cpu::parallelFor(blocks_.count, [&](size_t block) {
            float *weight_partial = weight_partials + block * dim;
            float *bias_partial = bias_partials + block * dim;
            for (size_t j = 0; j < dim; ++j) weight_partial[j] = bias_partial[j] = 0.0f;
            for (size_t row = blocks_.begin(block); row < blocks_.end(block, info.rows); ++row) {
                float std_row = cpu::toFloat(std_deviation[info.input_std_deviation.offset(row)]);
                backwardRow(dim, weight_f32, 1.0f / std_row, grad_input + info.grad_input.offset(row),
                            grad_output + info.grad_output.offset(row),
                            xhat + info.input_standardization.offset(row), weight_partial, bias_partial);
            }
        });
        cpu::sumBlockPartials(weight_partials, blocks_.count, dim, grad_weight, info.grad_weight_stride);
        cpu::sumBlockPartials(bias_partials, blocks_.count, dim, grad_bias, info.grad_bias_stride);
    }

    // grad_input may be grad_output itself: each element is read before it is written.
    template <typename T>
    static void backwardRow(size_t dim, const float *weight, float inv_std, T *grad_input, const T *grad_output,
                            const T *xhat, float *weight_partial, float *bias_partial) {
        double sum_g, sum_g_xhat;
        cpu::sumPairs(
            dim,
            [&](size_t j) {
                double g = cpu::toFloat(grad_output[j]) * weight[j];
                return std::pair<double, double>{g, g * cpu::toFloat(xhat[j])};
            },
            sum_g, sum_g_xhat);
        const float mean_g = static_cast<float>(sum_g / static_cast<double>(dim));
        const float mean_g_xhat = static_cast<float>(sum_g_xhat / static_cast<double>(dim));
        for (size_t j = 0; j < dim; ++j) {
            float go = cpu::toFloat(grad_output[j]), xh = cpu::toFloat(xhat[j]);
            weight_partial[j] += go * xh;
            bias_partial[j] += go;
            grad_input[j] = cpu::fromFloat<T>((go * weight[j] - mean_g - xh * mean_g_xhat) * inv_std);
        }
    }

    cpu::Blocks blocks_;
};

} // namespace

infiniStatus_t Backends::cpu(const Info &info, int device_id, Descriptor **desc) {
    *desc = new CpuDescriptor(device_id, info);
    return INFINI_STATUS_SUCCESS;
}

} // namespace op::layer_norm_backward
