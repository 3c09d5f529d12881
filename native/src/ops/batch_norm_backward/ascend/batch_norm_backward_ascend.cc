// BatchNorm backward on Ascend: one aclnnBatchNormBackward on (N, C, L) views, format NCL (L = the spatial dims
// flattened; channels-last tensors are strided NCL views, which aclnn accepts as non-contiguous tensors).
// - Statistics: eval passes the running ones with training = false and eps (CANN computes 1/sqrt(var + eps)).
//   Training passes saveMean / saveInvstd: the caller's saved ones, else the batch mean and
//   aclnnRsqrt(var) (aclnnAdds(var, eps) first when eps > 0). Statistics not used are NULL.
// - weight NULL is weight = NULL (ones); skipped gradients are outputMask entries (NULL outputs).
// - Per-channel tensors are F32 (the only dtype every documented version accepts): F16/BF16 channel vectors go
//   through aclnnCast both ways; F32 ones (F32 parameters with any data, saved statistics) are passed as they are.
#include "../batch_norm_backward.h"

#include "devices/ascend/views.h"

#include <memory>
#include <optional>

namespace op::batch_norm_backward {
namespace {

using ascend::Buffer;
using ascend::TensorSpec;

enum Arg {
    kGradInput, kGradWeight, kGradBias, kInput, kGradOutput, kWeight, kMean, kVar, kSaveMean, kSaveInvstd
};

class AscendDescriptor final : public Descriptor {
  public:
    AscendDescriptor(int device_id, const Info &info, std::unique_ptr<ascend::Plan> plan)
        : Descriptor(INFINI_DEVICE_ASCEND, device_id, info), plan_(std::move(plan)) {}

    size_t workspaceSize() const override { return plan_->workspaceSize(); }

    infiniStatus_t calculate(const Phase &phase, void *workspace, void *grad_input, void *grad_weight,
                             void *grad_bias, const void *input, const void *grad_output, const void *weight,
                             const void *running_mean, const void *running_var, const void *save_mean,
                             const void *save_invstd, void *stream) const override {
        // The two phases are not composed from aclnn calls: CANN documents no per-channel reduce / elementwise
        // BatchNorm backward pair among the operators this backend loads (docs/ascend.md).
        if (phase.kind != Phase::whole) return INFINI_STATUS_NOT_IMPLEMENTED;
        return plan_->run(workspace, {grad_input, grad_weight, grad_bias, input, grad_output, weight, running_mean,
                                      running_var, save_mean, save_invstd},
                          stream);
    }

  private:
    std::unique_ptr<ascend::Plan> plan_;
};

using OptionalTensor = std::optional<TensorSpec>;

void planCalls(const Info &info, ascend::Plan &plan) {
    const ascend::Api &acl = plan.acl();
    const aclDataType dtype = ascend::aclDtypeOf(info.dtype);
    const aclDataType parameter_dtype = ascend::aclDtypeOf(info.parameter_dtype);
    const size_t channels = info.channels;
    const bool cast = parameter_dtype != ACL_FLOAT;

    auto userVector = [&](Arg arg, ptrdiff_t stride, aclDataType type) {
        return ascend::vectorView(channels, stride, type, Buffer::argument(arg));
    };
    auto f32Scratch = [&] {
        return TensorSpec::contiguous({static_cast<int64_t>(channels)}, ACL_FLOAT,
                                      Buffer::scratch(plan.reserveScratch(infini::CheckedSize(channels) * sizeof(float))));
    };
    auto unaryCall = [&](const TensorSpec &from, const TensorSpec &to, ascend::Call::Prepare prepare,
                         ascend::Call::Launch launch) { plan.add({{from}, {to}, std::move(prepare), launch}); };
    auto castCall = [&](const TensorSpec &from, const TensorSpec &to) {
        aclDataType target = to.dtype;
        unaryCall(from, to,
                  [&acl, target](aclTensor *const *t, uint64_t *ws, aclOpExecutor **ex) {
                      return acl.aclnnCastGetWorkspaceSize(t[0], target, t[1], ws, ex);
                  },
                  acl.aclnnCast);
    };
    // The F32 view of a parameter argument (absent when not used): itself when F32, else a workspace copy.
    auto asF32Input = [&](bool used, Arg arg, ptrdiff_t stride) -> OptionalTensor {
        if (!used) return std::nullopt;
        if (!cast) return userVector(arg, stride, ACL_FLOAT);
        TensorSpec copy = f32Scratch();
        castCall(userVector(arg, stride, parameter_dtype), copy);
        return copy;
    };
    auto asF32Output = [&](bool wanted, Arg arg, ptrdiff_t stride) -> OptionalTensor {
        if (!wanted) return std::nullopt;
        return cast ? f32Scratch() : userVector(arg, stride, ACL_FLOAT);
    };
    const OptionalTensor weight = asF32Input(info.has_weight, kWeight, info.weight_stride);
    const bool uses_running = info.usesRunning();
    const OptionalTensor mean = asF32Input(uses_running, kMean, info.running_mean_stride);
    const OptionalTensor var = asF32Input(uses_running, kVar, info.running_var_stride);
    OptionalTensor save_mean, save_invstd;
    if (info.has_save) {
        save_mean = userVector(kSaveMean, info.save_mean_stride, ACL_FLOAT);
        save_invstd = userVector(kSaveInvstd, info.save_invstd_stride, ACL_FLOAT);
    } else if (info.training) { // the batch statistics: invstd = 1/sqrt(var + eps)
        TensorSpec shifted = *var;
        if (info.epsilon > 0.0) {
            shifted = f32Scratch();
            const aclScalar *eps = plan.floatScalar(static_cast<float>(info.epsilon)), *one = plan.floatScalar(1.0f);
            unaryCall(*var, shifted,
                      [&acl, eps, one](aclTensor *const *t, uint64_t *ws, aclOpExecutor **ex) {
                          return acl.aclnnAddsGetWorkspaceSize(t[0], eps, one, t[1], ws, ex);
                      },
                      acl.aclnnAdds);
        }
        save_mean = mean;
        save_invstd = f32Scratch();
        unaryCall(shifted, *save_invstd,
                  [&acl](aclTensor *const *t, uint64_t *ws, aclOpExecutor **ex) {
                      return acl.aclnnRsqrtGetWorkspaceSize(t[0], t[1], ws, ex);
                  },
                  acl.aclnnRsqrt);
    }

    const OptionalTensor grad_weight = asF32Output(info.has_grad_weight, kGradWeight, info.grad_weight_stride);
    const OptionalTensor grad_bias = asF32Output(info.has_grad_bias, kGradBias, info.grad_bias_stride);
    const int64_t batch = static_cast<int64_t>(info.batch), length = static_cast<int64_t>(info.length);
    const int64_t c = static_cast<int64_t>(channels);
    auto ncl = [&](Arg arg) {
        if (info.layout == Layout::channels_first) {
            return TensorSpec::contiguous({batch, c, length}, dtype, Buffer::argument(arg), ACL_FORMAT_NCL);
        }
        // (N, L, C) in memory (channels-last), seen as (N, C, L).
        return TensorSpec{{batch, c, length}, {length * c, 1, c}, dtype, Buffer::argument(arg), ACL_FORMAT_NCL};
    };
    const bool training = info.training;
    const double epsilon = info.epsilon;
    const aclBoolArray *output_mask = plan.boolArray({true, info.has_grad_weight, info.has_grad_bias});
    plan.add({{ncl(kGradOutput), ncl(kInput), weight, mean, var, save_mean, save_invstd},
              {ncl(kGradInput), grad_weight, grad_bias},
              [&acl, output_mask, training, epsilon](aclTensor *const *t, uint64_t *ws, aclOpExecutor **ex) {
                  return acl.aclnnBatchNormBackwardGetWorkspaceSize(t[0], t[1], t[2], t[3], t[4], t[5], t[6],
                                                                    training, epsilon, output_mask, t[7], t[8],
                                                                    t[9], ws, ex);
              },
              acl.aclnnBatchNormBackward});
    if (cast && grad_weight) castCall(*grad_weight, userVector(kGradWeight, info.grad_weight_stride, parameter_dtype));
    if (cast && grad_bias) castCall(*grad_bias, userVector(kGradBias, info.grad_bias_stride, parameter_dtype));
}

} // namespace

infiniStatus_t Backends::ascend(const Info &info, int device_id, Descriptor **desc) {
    if (!ascend::cannHasDtype(info.dtype)) return INFINI_STATUS_NOT_IMPLEMENTED;
    const ascend::Api *acl;
    INFINI_CHECK(ascend::api(&acl));
    if (info.weight_stride < 0 || info.running_mean_stride < 0 || info.running_var_stride < 0 ||
        info.save_mean_stride < 0 || info.save_invstd_stride < 0 || info.grad_weight_stride < 0 ||
        info.grad_bias_stride < 0) {
        return INFINI_STATUS_BAD_TENSOR_STRIDES; // aclCreateTensor takes non-negative strides only
    }
    std::unique_ptr<ascend::Plan> plan;
    INFINI_CHECK(ascend::makePlan(acl, device_id, info.elements() > 0, info.channels,
                                  infini::dtypeSize(info.parameter_dtype),
                                  {{kGradWeight, info.grad_weight_stride, info.has_grad_weight},
                                   {kGradBias, info.grad_bias_stride, info.has_grad_bias}},
                                  [&](ascend::Plan &p) { planCalls(info, p); }, &plan));
    *desc = new AscendDescriptor(device_id, info, std::move(plan));
    return INFINI_STATUS_SUCCESS;
}

} // namespace op::batch_norm_backward
