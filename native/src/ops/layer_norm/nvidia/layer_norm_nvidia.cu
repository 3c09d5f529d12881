// LayerNorm forward on NVIDIA GPUs: the row kernels of ops/row_forward_nvidia.cuh with centring. The xhat form
// writes xhat (data type) and std (parameter type); the statistics form mean and rstd (F32, F64 for F64 data).
#include "../layer_norm.h"

#include "ops/row_forward_nvidia.cuh"

namespace op::layer_norm {
namespace {

namespace rf = op::row_forward;

class NvidiaDescriptor final : public Descriptor {
  public:
    NvidiaDescriptor(int device_id, const Info &info, const rf::Plan &plan)
        : Descriptor(INFINI_DEVICE_NVIDIA, device_id, info), plan_(plan) {}

    size_t workspaceSize() const override { return 0; }

    infiniStatus_t calculate(void *, void *y, void *xhat, void *first_statistic, void *rstd, const void *x,
                             const void *w, const void *b, void *stream) const override {
        const nvidia::DeviceScope device_scope(device_id);
        INFINI_CHECK(device_scope.status());
        const bool xhat_form = info.form == Info::Form::xhat;
        rf::RowCall call{};
        call.y = y;
        call.xhat = info.has_xhat ? xhat : nullptr;
        call.x = x;
        call.w = info.has_w ? w : nullptr;
        call.b = info.has_b ? b : nullptr;
        call.y_rows = info.y;
        call.xhat_rows = info.xhat;
        call.x_rows = info.x;
        call.w_stride = info.w_stride;
        call.b_stride = info.b_stride;
        call.epsilon = info.epsilon;
        if (xhat_form) { // std in the rstd slot, written as sqrt(var + eps)
            call.stat = info.has_first_statistic ? first_statistic : nullptr;
            call.stat_rows = info.first_statistic;
            call.stat_is_std = true;
        } else {
            call.mean = info.has_first_statistic ? first_statistic : nullptr;
            call.mean_rows = info.first_statistic;
            call.stat = info.has_rstd ? rstd : nullptr;
            call.stat_rows = info.rstd;
        }
        const auto launch = static_cast<cudaStream_t>(stream);
        return nvidia::withDataAndParameterTypes(info.dtype, info.parameter_dtype, [&](auto data_tag, auto parameter_tag) {
            using T = decltype(data_tag);
            using W = decltype(parameter_tag);
            return xhat_form ? rf::run<true, T, W, W>(call, info.rows, info.dim, plan_, launch)
                             : rf::run<true, T, W, nvidia::ComputeOf<T>>(call, info.rows, info.dim, plan_,
                                                                         launch);
        });
    }

  private:
    rf::Plan plan_;
};

} // namespace

infiniStatus_t Backends::nvidia(const Info &info, int device_id, Descriptor **desc) {
    const RowLayout xhat = info.has_xhat ? info.xhat : RowLayout{};
    const bool xhat_form = info.form == Info::Form::xhat;
    rf::Plan plan;
    INFINI_CHECK(nvidia::withDataAndParameterTypes(info.dtype, info.parameter_dtype, [&](auto data_tag, auto parameter_tag) {
        using T = decltype(data_tag);
        using W = decltype(parameter_tag);
        const auto rows = {info.x, info.y, xhat};
        return xhat_form ? rf::makePlan<true, T, W, W>(info.rows, info.dim, rows, device_id, &plan)
                         : rf::makePlan<true, T, W, nvidia::ComputeOf<T>>(info.rows, info.dim, rows, device_id, &plan);
    }));
    *desc = new NvidiaDescriptor(device_id, info, plan);
    return INFINI_STATUS_SUCCESS;
}

} // namespace op::layer_norm
