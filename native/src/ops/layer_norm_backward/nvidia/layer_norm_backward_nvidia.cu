// LayerNorm backward on NVIDIA GPUs: the row kernels of ops/row_backward_nvidia.cuh with the LayerNorm terms,
// the same formulas (and F32/F64 choices) as the CPU backend.
#include "../layer_norm_backward.h"

#include "ops/row_backward_nvidia.cuh"

namespace op::layer_norm_backward {
namespace {

namespace rb = op::row_backward;

// Row inputs: a = grad_output, b = xhat; w = weight (ones when absent); the row scalar is the row's std.
// Sums: sum(g), sum(g*xhat) with g = grad_output*weight.
struct LayerNormTerms {
    static constexpr int kPartials = 2; // grad_weight, grad_bias
    template <typename T, typename W>
    using Scalar = W; // input_std_deviation has the parameters' dtype
    template <typename C>
    struct Row {
        C inv_std, mean_g, mean_g_xhat;
    };

    template <typename C>
    __device__ static rb::Pair<C> terms(C go, C xhat, C w) {
        const C g = go * w;
        return {g, g * xhat};
    }

    // The std is always given (has_std is true). A: the sums' type (F64, or F32 in the packed plan).
    template <typename C, typename A>
    __device__ static Row<C> row(A sum_g, A sum_g_xhat, size_t dim, double, bool /*has_std*/, double std_row) {
        return Row<C>{C(1) / static_cast<C>(std_row), static_cast<C>(sum_g / static_cast<A>(dim)),
                      static_cast<C>(sum_g_xhat / static_cast<A>(dim))};
    }

    template <typename C>
    __device__ static C out(C go, C xhat, C w, const Row<C> &k) {
        return (go * w - k.mean_g - xhat * k.mean_g_xhat) * k.inv_std;
    }

    template <typename C>
    __device__ static rb::Pair<C> partialTerms(C go, C xhat, const Row<C> &) {
        return {go * xhat, go};
    }
};

// The from-input form (input, mean and rstd, as PyTorch and CANN save them): the driver forms
// xhat = (input - mean) * rstd in registers; the row scalar is rstd, in the compute type.
struct LayerNormFromInputTerms : LayerNormTerms {
    static constexpr bool kCentersB = true;
    template <typename T, typename W>
    using Scalar = nvidia::ComputeOf<T>; // rstd: F32, F64 for F64 data
    template <typename C, typename A>
    __device__ static Row<C> row(A sum_g, A sum_g_xhat, size_t dim, double, bool, double rstd) {
        return Row<C>{static_cast<C>(rstd), static_cast<C>(sum_g / static_cast<A>(dim)),
                      static_cast<C>(sum_g_xhat / static_cast<A>(dim))};
    }
};

template <typename Terms>
class NvidiaDescriptor final : public Descriptor {
  public:
    NvidiaDescriptor(int device_id, const Info &info, const rb::Driver<Terms> &driver)
        : Descriptor(INFINI_DEVICE_NVIDIA, device_id, info), driver_(driver) {}

    size_t workspaceSize() const override { return driver_.workspaceBytes(); }

    infiniStatus_t calculate(void *workspace, void *grad_input, void *grad_weight, void *grad_bias,
                             const void *grad_output, const void *weight, const void *row_input,
                             const void *row_mean, const void *row_scale, void *stream) const override {
        const nvidia::DeviceScope device_scope(device_id);
        INFINI_CHECK(device_scope.status());
        rb::RowCall call{};
        call.out = grad_input;
        call.a = grad_output;
        call.b = row_input;
        call.w = info.has_weight ? weight : nullptr;
        call.scalar = row_scale;
        call.b_mean = row_mean; // NULL in the xhat form
        call.out_rows = info.grad_input;
        call.a_rows = info.grad_output;
        call.b_rows = info.row_input;
        call.scalar_rows = info.row_scale;
        call.b_mean_rows = info.row_mean;
        call.w_stride = info.weight_stride;
        call.outs[0] = info.has_grad_weight ? grad_weight : nullptr;
        call.outs[1] = info.has_grad_bias ? grad_bias : nullptr;
        call.out_strides[0] = info.grad_weight_stride;
        call.out_strides[1] = info.grad_bias_stride;
        return driver_.run(call, workspace, static_cast<cudaStream_t>(stream));
    }

  private:
    rb::Driver<Terms> driver_;
};

template <typename Terms>
infiniStatus_t make(const Info &info, int device_id, Descriptor **desc) {
    rb::Driver<Terms> driver;
    const bool wanted[] = {info.has_grad_weight, info.has_grad_bias};
    INFINI_CHECK(rb::Driver<Terms>::make(info.dtype, info.parameter_dtype, info.rows, info.dim, wanted,
                                         {info.grad_input, info.grad_output, info.row_input}, device_id, &driver));
    *desc = new NvidiaDescriptor<Terms>(device_id, info, driver);
    return INFINI_STATUS_SUCCESS;
}

} // namespace

infiniStatus_t Backends::nvidia(const Info &info, int device_id, Descriptor **desc) {
    return info.form == Info::Form::from_input ? make<LayerNormFromInputTerms>(info, device_id, desc)
                                               : make<LayerNormTerms>(info, device_id, desc);
}

} // namespace op::layer_norm_backward
