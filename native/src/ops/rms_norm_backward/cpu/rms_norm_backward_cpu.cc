// RMSNorm backward on the CPU. Per row: one pass reduces sum(x^2) and sum(grad_y*w*x), a second writes grad_x
// while the row is still in cache and adds grad_y*x*r into its row block's F32 grad_w partial; the partials
// are summed in block order at the end.
#include "../rms_norm_backward.h"

#include "devices/cpu/half.h"
#include "devices/cpu/parallel.h"
#include "devices/cpu/reduce.h"

#include <cmath>

namespace op::rms_norm_backward {
namespace {

constexpr size_t kMaxRowBlocks = 64;

class CpuDescriptor final : public Descriptor {
  public:
    CpuDescriptor(int device_id, const Info &info)
        : Descriptor(INFINI_DEVICE_CPU, device_id, info), blocks_(cpu::Blocks::split(info.rows, kMaxRowBlocks)) {}

    // w as F32, then one F32 grad_w partial of length D per row block.
    size_t workspaceSize() const override { return (1 + blocks_.count) * info.dim * sizeof(float); }

    infiniStatus_t calculate(void *workspace, void *grad_x, void *grad_w, const void *grad_y, const void *x,
                             const void *w, void *) const override {
        cpu::withNormFloat(info.dtype, [&](auto tag) {
            using T = decltype(tag);
            run(static_cast<float *>(workspace), static_cast<T *>(grad_x), static_cast<T *>(grad_w),
                static_cast<const T *>(grad_y), static_cast<const T *>(x), static_cast<const T *>(w));
            return 0;
        });
        return INFINI_STATUS_SUCCESS;
    }

  private:
    template <typename T>
    void run(float *workspace, T *grad_x, T *grad_w, const T *grad_y, const T *x, const T *w) const {
        const size_t dim = info.dim;
        float *w_f32 = workspace;
        float *partials = workspace + dim;
        for (size_t j = 0; j < dim; ++j) w_f32[j] = cpu::toFloat(w[static_cast<ptrdiff_t>(j) * info.w_stride]);

        cpu::parallelFor(blocks_.count, [&](size_t block) {
            float *partial = partials + block * dim;
            for (size_t j = 0; j < dim; ++j) partial[j] = 0.0f;
            for (size_t row = blocks_.begin(block); row < blocks_.end(block, info.rows); ++row) {
                backwardRow(dim, w_f32, grad_x + info.grad_x.offset(row), grad_y + info.grad_y.offset(row),
                            x + info.x.offset(row), partial);
            }
        });
        cpu::sumBlockPartials(partials, blocks_.count, dim, grad_w, info.grad_w_stride);
    }

    // grad_x may be grad_y itself: each element is read before it is written.
    template <typename T>
    static void backwardRow(size_t dim, const float *w, T *grad_x, const T *grad_y, const T *x, float *partial) {
        double sum_squares, sum_gwx;
        cpu::sumPairs(
            dim,
            [&](size_t j) {
                double xj = cpu::toFloat(x[j]);
                return std::pair<double, double>{xj * xj, cpu::toFloat(grad_y[j]) * w[j] * xj};
            },
            sum_squares, sum_gwx);
        const double rstd = 1.0 / std::sqrt(sum_squares / static_cast<double>(dim));
        const float r = static_cast<float>(rstd);
        const float x_coef = static_cast<float>(rstd * rstd * rstd * sum_gwx / static_cast<double>(dim));
        for (size_t j = 0; j < dim; ++j) {
            float gy = cpu::toFloat(grad_y[j]), xj = cpu::toFloat(x[j]);
            partial[j] += gy * xj * r;
            grad_x[j] = cpu::fromFloat<T>(r * gy * w[j] - x_coef * xj);
        }
    }

    cpu::Blocks blocks_;
};

} // namespace

infiniStatus_t Backends::cpu(const Info &info, int device_id, Descriptor **desc) {
    *desc = new CpuDescriptor(device_id, info);
    return INFINI_STATUS_SUCCESS;
}

} // namespace op::rms_norm_backward
