// RMSNorm forward on NVIDIA GPUs: the row kernels of ops/row_forward_nvidia.cuh without centring; rstd in the
// compute type (F32, F64 for F64 data), as on the CPU.
#include "../rms_norm.h"

#include "ops/row_forward_nvidia.cuh"

namespace op::rms_norm {
namespace {

namespace rf = op::row_forward;

class NvidiaDescriptor final : public Descriptor {
  public:
    NvidiaDescriptor(int device_id, const Info &info, const rf::Plan &plan)
        : Descriptor(INFINI_DEVICE_NVIDIA, device_id, info), plan_(plan) {}

    size_t workspaceSize() const override { return 0; }

    infiniStatus_t calculate(void *, void *y, void *rstd, const void *x, const void *w, void *stream) const override {
        const nvidia::DeviceScope device_scope(device_id);
        INFINI_CHECK(device_scope.status());
        rf::RowCall call{};
        call.y = y;
        call.stat = info.has_rstd ? rstd : nullptr;
        call.x = x;
        call.w = w;
        call.y_rows = info.y;
        call.x_rows = info.x;
        call.stat_rows = info.rstd;
        call.w_stride = info.w_stride;
        call.epsilon = info.epsilon;
        return nvidia::withDataAndParameterTypes(info.dtype, info.weight_dtype, [&](auto data_tag, auto parameter_tag) {
            using T = decltype(data_tag);
            using W = decltype(parameter_tag);
            return rf::run<false, T, W, nvidia::ComputeOf<T>>(call, info.rows, info.dim, plan_,
                                                            static_cast<cudaStream_t>(stream));
        });
    }

  private:
    rf::Plan plan_;
};

} // namespace

infiniStatus_t Backends::nvidia(const Info &info, int device_id, Descriptor **desc) {
    rf::Plan plan;
    INFINI_CHECK(nvidia::withDataAndParameterTypes(info.dtype, info.weight_dtype, [&](auto data_tag, auto parameter_tag) {
        using T = decltype(data_tag);
        using W = decltype(parameter_tag);
        return rf::makePlan<false, T, W, nvidia::ComputeOf<T>>(info.rows, info.dim, {info.x, info.y}, device_id, &plan);
    }));
    *desc = new NvidiaDescriptor(device_id, info, plan);
    return INFINI_STATUS_SUCCESS;
}

} // namespace op::rms_norm
