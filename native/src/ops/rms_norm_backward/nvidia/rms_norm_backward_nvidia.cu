// RMSNorm backward on NVIDIA GPUs: the row kernels of ops/row_backward_nvidia.cuh with the RMSNorm terms,
// the same formulas (and F32/F64 choices) as the CPU backend.
#include "../rms_norm_backward.h"

#include "ops/row_backward_nvidia.cuh"

namespace op::rms_norm_backward {
namespace {

namespace rb = op::row_backward;

// Row inputs: a = grad_y, b = x; w = w. Sums: sum(x^2), sum(grad_y*w*x).
struct RmsTerms {
    static constexpr int kPartials = 1; // grad_w
    static constexpr bool kRowScalar = false;
    struct Row {
        float r, x_coef;
    };

    __device__ static float2 terms(float gy, float x, float w) { return make_float2(x * x, gy * w * x); }

    // A row of zeros gives r = inf and NaN outputs, as the seed formula does; nothing traps.
    __device__ static Row row(double sum_squares, double sum_gwx, size_t dim, float) {
        const double rstd = 1.0 / sqrt(sum_squares / static_cast<double>(dim));
        return Row{static_cast<float>(rstd), static_cast<float>(rstd * rstd * rstd * sum_gwx / static_cast<double>(dim))};
    }

    __device__ static float out(float gy, float x, float w, const Row &k) { return k.r * gy * w - k.x_coef * x; }

    __device__ static float2 partialTerms(float gy, float x, const Row &k) { return make_float2(gy * x * k.r, 0.0f); }
};

class NvidiaDescriptor final : public Descriptor {
  public:
    NvidiaDescriptor(int device_id, const Info &info, const rb::Plan &plan)
        : Descriptor(INFINI_DEVICE_NVIDIA, device_id, info), plan_(plan),
          vector_ok_(rb::vectorStrides(infini::dtypeSize(info.dtype), {info.grad_x, info.grad_y, info.x})) {}

    size_t workspaceSize() const override { return plan_.workspaceBytes(); }

    infiniStatus_t calculate(void *workspace, void *grad_x, void *grad_w, const void *grad_y, const void *x,
                             const void *w, const void * /*rstd: seedFeatures only*/, void *stream) const override {
        INFINI_CHECK(nvidia::useDevice(device_id));
        return nvidia::withNormFloat(info.dtype, [&](auto tag) {
            using T = decltype(tag);
            rb::Args<T> args{};
            args.out = static_cast<T *>(grad_x);
            args.a = static_cast<const T *>(grad_y);
            args.b = static_cast<const T *>(x);
            args.w = static_cast<const T *>(w);
            args.scalar = nullptr;
            args.out_rows = rb::offsetsOf(info.grad_x);
            args.a_rows = rb::offsetsOf(info.grad_y);
            args.b_rows = rb::offsetsOf(info.x);
            args.scalar_rows = args.out_rows; // unused
            args.w_stride = info.w_stride;
            args.rows = info.rows;
            args.dim = info.dim;
            T *outs[] = {static_cast<T *>(grad_w)};
            const ptrdiff_t strides[] = {info.grad_w_stride};
            return rb::run<RmsTerms, T>(plan_, vector_ok_, args, workspace, outs, strides,
                                        static_cast<cudaStream_t>(stream));
        });
    }

  private:
    rb::Plan plan_;
    bool vector_ok_;
};

} // namespace

infiniStatus_t Backends::nvidia(const Info &info, int device_id, Descriptor **desc) {
    if (!info.seedFeatures()) return INFINI_STATUS_NOT_IMPLEMENTED;
    rb::Plan plan;
    INFINI_CHECK(rb::makePlan<RmsTerms>(info.dtype, info.rows, info.dim, device_id, &plan));
    *desc = new NvidiaDescriptor(device_id, info, plan);
    return INFINI_STATUS_SUCCESS;
}

} // namespace op::rms_norm_backward
