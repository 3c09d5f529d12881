// LayerNorm backward on the CPU. Per row: one pass reduces mean(g) and mean(g*xhat) with g = grad_output*weight,
// a second writes grad_input while the row is still in cache and adds grad_output*xhat and grad_output into
// the row block's F32 partials; the partials are summed in block order at the end
// (devices/cpu/row_driver.h has the schedule).
#include "../layer_norm_backward.h"

#include "devices/cpu/half.h"
#include "devices/cpu/row_driver.h"
#include "devices/cpu/workspace.h"
#include "layer_norm_backward_simd.h"

namespace op::layer_norm_backward {
namespace {

class CpuDescriptor final : public Descriptor {
  public:
    CpuDescriptor(int device_id, const Info &info)
        : Descriptor(INFINI_DEVICE_CPU, device_id, info), plan_(info.rows, info.dim) {}

    // Chunk sums, weight as F32, then per row block one grad_weight and one grad_bias F32 partial of length L.
    size_t workspaceSize() const override {
        return cpu::withAlignmentSlack(plan_.scratchBytes() +
                                       (1 + 2 * plan_.blocks.count) * info.dim * sizeof(float));
    }

    infiniStatus_t calculate(void *workspace, void *grad_input, void *grad_weight, void *grad_bias,
                             const void *grad_output, const void *weight, const void *input_standardization,
                             const void *input_std_deviation, void *) const override {
        cpu::withNormFloat(info.dtype, [&](auto tag) {
            using T = decltype(tag);
            run(cpu::alignedWorkspace(workspace), static_cast<T *>(grad_input), static_cast<T *>(grad_weight),
                static_cast<T *>(grad_bias), static_cast<const T *>(grad_output), static_cast<const T *>(weight),
                static_cast<const T *>(input_standardization), static_cast<const T *>(input_std_deviation));
            return 0;
        });
        return INFINI_STATUS_SUCCESS;
    }

  private:
    template <typename T>
    void run(void *workspace, T *grad_input, T *grad_weight, T *grad_bias, const T *grad_output, const T *weight,
             const T *xhat, const T *std_deviation) const {
        const size_t dim = info.dim, blocks = plan_.blocks.count;
        auto *chunk_sums = static_cast<cpu::PairSums *>(workspace);
        float *weight_f32 = reinterpret_cast<float *>(chunk_sums + plan_.chunks.count);
        float *weight_partials = weight_f32 + dim;
        float *bias_partials = weight_partials + blocks * dim;
        cpu::selectedTable<cpu::Conversions<T>>().widen(dim, weight, info.weight_stride, weight_f32);
        cpu::zeroFloats(weight_partials, 2 * blocks * dim);
        const Kernels<T> &kernels = cpu::selectedTable<Kernels<T>>();

        cpu::runRows(
            plan_, chunk_sums,
            [&](size_t row, size_t begin, size_t n) {
                return kernels.sums(n, grad_output + info.grad_output.offset(row) + begin,
                                    xhat + info.input_standardization.offset(row) + begin, weight_f32 + begin);
            },
            [&](size_t block, size_t row, const cpu::PairSums &total, size_t begin, size_t n) {
                const float inv_std = 1.0f / cpu::toFloat(std_deviation[info.input_std_deviation.offset(row)]);
                kernels.apply(n, inv_std, static_cast<float>(total.first / static_cast<double>(dim)),
                              static_cast<float>(total.second / static_cast<double>(dim)),
                              grad_output + info.grad_output.offset(row) + begin,
                              xhat + info.input_standardization.offset(row) + begin, weight_f32 + begin,
                              grad_input + info.grad_input.offset(row) + begin,
                              weight_partials + block * dim + begin, bias_partials + block * dim + begin);
            });
        // weight_f32 is free again: it holds each F32 gradient before narrowing.
        cpu::sumBlockPartials(weight_partials, blocks, dim, weight_f32, grad_weight, info.grad_weight_stride);
        cpu::sumBlockPartials(bias_partials, blocks, dim, weight_f32, grad_bias, info.grad_bias_stride);
    }

    cpu::RowPlan plan_;
};

} // namespace

infiniStatus_t Backends::cpu(const Info &info, int device_id, Descriptor **desc) {
    *desc = new CpuDescriptor(device_id, info);
    return INFINI_STATUS_SUCCESS;
}

} // namespace op::layer_norm_backward
