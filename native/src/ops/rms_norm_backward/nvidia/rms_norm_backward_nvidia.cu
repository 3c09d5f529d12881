// RMSNorm backward on NVIDIA GPUs: the row kernels of ops/row_backward_nvidia.cuh with the RMSNorm terms,
// the same formulas (and F32/F64 choices) as the CPU backend.
#include "../rms_norm_backward.h"

#include "ops/row_backward_nvidia.cuh"

namespace op::rms_norm_backward {
namespace {

namespace rb = op::row_backward;

// Row inputs: a = grad_y, b = x; w = w; the row scalar, when given, is the saved rstd.
// Sums: sum(x^2), sum(grad_y*w*x).
struct RmsTerms {
    static constexpr int kPartials = 1; // grad_w
    template <typename T, typename W>
    using Scalar = nvidia::ComputeOf<T>; // rstd: F32, F64 for F64 data
    template <typename C>
    struct Row {
        C r, x_coef;
    };

    template <typename C>
    __device__ static rb::Pair<C> terms(C gy, C x, C w) {
        return {x * x, gy * w * x};
    }

    // r = the saved rstd, else 1/sqrt(mean(x^2) + eps), in A (the sums' type: F64, or F32 in the packed plan).
    // A row of zeros without eps gives r = inf and NaN outputs, as the seed formula does; nothing traps.
    // x_coef = r^3 * mean(grad_y*w*x) is formed from the right: mean(grad_y*w*x) scales as |x|, so each product
    // stays near |x|^(1-k); r^3 alone (|x|^-3) leaves F32's range for |x| beyond about 1e13 or below 1e-13.
    template <typename C, typename A>
    __device__ static Row<C> row(A sum_squares, A sum_gwx, size_t dim, double epsilon, bool has_rstd,
                                 double saved_rstd) {
        const A n = static_cast<A>(dim);
        const A rstd = has_rstd ? static_cast<A>(saved_rstd) : nvidia::rstdOfMeanSquare(sum_squares / n, epsilon);
        return Row<C>{static_cast<C>(rstd), static_cast<C>(rstd * (rstd * (rstd * (sum_gwx / n))))};
    }

    template <typename C>
    __device__ static C out(C gy, C x, C w, const Row<C> &k) {
        return k.r * gy * w - k.x_coef * x;
    }

    template <typename C>
    __device__ static rb::Pair<C> partialTerms(C gy, C x, const Row<C> &k) {
        return {gy * x * k.r, C(0)};
    }
};

class NvidiaDescriptor final : public Descriptor {
  public:
    NvidiaDescriptor(int device_id, const Info &info, const rb::Driver<RmsTerms> &driver)
        : Descriptor(INFINI_DEVICE_NVIDIA, device_id, info), driver_(driver) {}

    size_t workspaceSize() const override { return driver_.workspaceBytes(); }

    infiniStatus_t calculate(void *workspace, void *grad_x, void *grad_w, const void *grad_y, const void *x,
                             const void *w, const void *rstd, void *stream) const override {
        const nvidia::DeviceScope device_scope(device_id);
        INFINI_CHECK(device_scope.status());
        rb::RowCall call{};
        call.out = grad_x;
        call.a = grad_y;
        call.b = x;
        call.w = w;
        call.scalar = info.has_rstd ? rstd : nullptr;
        call.out_rows = info.grad_x;
        call.a_rows = info.grad_y;
        call.b_rows = info.x;
        call.scalar_rows = info.rstd;
        call.w_stride = info.w_stride;
        call.outs[0] = info.has_grad_w ? grad_w : nullptr;
        call.out_strides[0] = info.grad_w_stride;
        call.epsilon = info.epsilon;
        return driver_.run(call, workspace, static_cast<cudaStream_t>(stream));
    }

  private:
    rb::Driver<RmsTerms> driver_;
};

} // namespace

infiniStatus_t Backends::nvidia(const Info &info, int device_id, Descriptor **desc) {
    rb::Driver<RmsTerms> driver;
    const bool wanted[] = {info.has_grad_w};
    INFINI_CHECK(rb::Driver<RmsTerms>::make(info.dtype, info.weight_dtype, info.rows, info.dim, wanted,
                                            {info.grad_x, info.grad_y, info.x}, device_id, &driver));
    *desc = new NvidiaDescriptor(device_id, info, driver);
    return INFINI_STATUS_SUCCESS;
}

} // namespace op::rms_norm_backward
