// RMSNorm backward on the CPU. Per row: one pass reduces sum(x^2) and sum(grad_y*w*x), a second writes grad_x
// while the row is still in cache and adds grad_y*x*r into its row block's F32 grad_w partial; the partials
// are summed in block order at the end (devices/cpu/row_driver.h has the schedule).
#include "../rms_norm_backward.h"

#include "devices/cpu/half.h"
#include "devices/cpu/row_driver.h"
#include "devices/cpu/workspace.h"
#include "rms_norm_backward_simd.h"

#include <cmath>

namespace op::rms_norm_backward {
namespace {

class CpuDescriptor final : public Descriptor {
  public:
    CpuDescriptor(int device_id, const Info &info)
        : Descriptor(INFINI_DEVICE_CPU, device_id, info), plan_(info.rows, info.dim) {}

    // Chunk sums, w as F32, then one F32 grad_w partial of length D per row block.
    size_t workspaceSize() const override {
        return cpu::withAlignmentSlack(plan_.scratchBytes() + (1 + plan_.blocks.count) * info.dim * sizeof(float));
    }

    infiniStatus_t calculate(void *workspace, void *grad_x, void *grad_w, const void *grad_y, const void *x,
                             const void *w, void *) const override {
        cpu::withNormFloat(info.dtype, [&](auto tag) {
            using T = decltype(tag);
            run(cpu::alignedWorkspace(workspace), static_cast<T *>(grad_x), static_cast<T *>(grad_w),
                static_cast<const T *>(grad_y), static_cast<const T *>(x), static_cast<const T *>(w));
            return 0;
        });
        return INFINI_STATUS_SUCCESS;
    }

  private:
    template <typename T>
    void run(void *workspace, T *grad_x, T *grad_w, const T *grad_y, const T *x, const T *w) const {
        const size_t dim = info.dim;
        auto *chunk_sums = static_cast<cpu::PairSums *>(workspace);
        float *w_f32 = reinterpret_cast<float *>(chunk_sums + plan_.chunks.count);
        float *partials = w_f32 + dim;
        cpu::selectedTable<cpu::Conversions<T>>().widen(dim, w, info.w_stride, w_f32);
        cpu::zeroFloats(partials, plan_.blocks.count * dim);
        const Kernels<T> &kernels = cpu::selectedTable<Kernels<T>>();

        cpu::runRows(
            plan_, chunk_sums,
            [&](size_t row, size_t begin, size_t n) {
                return kernels.sums(n, grad_y + info.grad_y.offset(row) + begin, x + info.x.offset(row) + begin,
                                    w_f32 + begin);
            },
            [&](size_t block, size_t row, const cpu::PairSums &total, size_t begin, size_t n) {
                // r = 1/sqrt(mean(x^2)); grad_x = r*grad_y*w - r^3 * sum(grad_y*w*x)/D * x
                const double rstd = 1.0 / std::sqrt(total.first / static_cast<double>(dim));
                const float x_coef = static_cast<float>(rstd * rstd * rstd * total.second / static_cast<double>(dim));
                kernels.apply(n, static_cast<float>(rstd), x_coef, grad_y + info.grad_y.offset(row) + begin,
                              x + info.x.offset(row) + begin, w_f32 + begin, grad_x + info.grad_x.offset(row) + begin,
                              partials + block * dim + begin);
            });
        // w_f32 is free again: it holds the F32 grad_w before narrowing.
        cpu::sumBlockPartials(partials, plan_.blocks.count, dim, w_f32, grad_w, info.grad_w_stride);
    }

    cpu::RowPlan plan_;
};

} // namespace

infiniStatus_t Backends::cpu(const Info &info, int device_id, Descriptor **desc) {
    *desc = new CpuDescriptor(device_id, info);
    return INFINI_STATUS_SUCCESS;
}

} // namespace op::rms_norm_backward
