// LayerNorm backward on NVIDIA GPUs: the row kernels of ops/row_backward_nvidia.cuh with the LayerNorm terms,
// the same formulas (and F32/F64 choices) as the CPU backend.
#include "../layer_norm_backward.h"

#include "ops/row_backward_nvidia.cuh"

namespace op::layer_norm_backward {
namespace {

namespace rb = op::row_backward;

// Row inputs: a = grad_output, b = xhat; w = weight; the row scalar is the row's std.
// Sums: sum(g), sum(g*xhat) with g = grad_output*weight.
struct LayerNormTerms {
    static constexpr int kPartials = 2; // grad_weight, grad_bias
    static constexpr bool kRowScalar = true;
    struct Row {
        float inv_std, mean_g, mean_g_xhat;
    };

    __device__ static float2 terms(float go, float xhat, float w) {
        const float g = go * w;
        return make_float2(g, g * xhat);
    }

    __device__ static Row row(double sum_g, double sum_g_xhat, size_t dim, float std_row) {
        return Row{1.0f / std_row, static_cast<float>(sum_g / static_cast<double>(dim)),
                   static_cast<float>(sum_g_xhat / static_cast<double>(dim))};
    }

    __device__ static float out(float go, float xhat, float w, const Row &k) {
        return (go * w - k.mean_g - xhat * k.mean_g_xhat) * k.inv_std;
    }

    __device__ static float2 partialTerms(float go, float xhat, const Row &) { return make_float2(go * xhat, go); }
};

class NvidiaDescriptor final : public Descriptor {
  public:
    NvidiaDescriptor(int device_id, const Info &info, const rb::Plan &plan)
        : Descriptor(INFINI_DEVICE_NVIDIA, device_id, info), plan_(plan),
          vector_ok_(rb::vectorStrides(infini::dtypeSize(info.dtype),
                                       {info.grad_input, info.grad_output, info.input_standardization})) {}

    size_t workspaceSize() const override { return plan_.workspaceBytes(); }

    infiniStatus_t calculate(void *workspace, void *grad_input, void *grad_weight, void *grad_bias,
                             const void *grad_output, const void *weight, const void *input_standardization,
                             const void *input_std_deviation, void *stream) const override {
        INFINI_CHECK(nvidia::useDevice(device_id));
        return nvidia::withNormFloat(info.dtype, [&](auto tag) {
            using T = decltype(tag);
            rb::Args<T> args{};
            args.out = static_cast<T *>(grad_input);
            args.a = static_cast<const T *>(grad_output);
            args.b = static_cast<const T *>(input_standardization);
            args.w = static_cast<const T *>(weight);
            args.scalar = static_cast<const T *>(input_std_deviation);
            args.out_rows = rb::offsetsOf(info.grad_input);
            args.a_rows = rb::offsetsOf(info.grad_output);
            args.b_rows = rb::offsetsOf(info.input_standardization);
            args.scalar_rows = rb::offsetsOf(info.input_std_deviation);
            args.w_stride = info.weight_stride;
            args.rows = info.rows;
            args.dim = info.dim;
            T *outs[] = {static_cast<T *>(grad_weight), static_cast<T *>(grad_bias)};
            const ptrdiff_t strides[] = {info.grad_weight_stride, info.grad_bias_stride};
            return rb::run<LayerNormTerms, T>(plan_, vector_ok_, args, workspace, outs, strides,
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
    INFINI_CHECK(rb::makePlan<LayerNormTerms>(info.dtype, info.rows, info.dim, device_id, &plan));
    *desc = new NvidiaDescriptor(device_id, info, plan);
    return INFINI_STATUS_SUCCESS;
}

} // namespace op::layer_norm_backward
