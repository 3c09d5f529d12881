// BatchNorm backward on Ascend: aclnnBatchNormBackward in training mode with eps 0, format NCL, saveMean =
// the batch mean and saveInvstd = aclnnRsqrt(batch var). Its per-channel tensors are F32 (the only dtype
// every documented version accepts), so F16/BF16 channel vectors go through aclnnCast both ways.
#include "../batch_norm_backward.h"

#include "devices/ascend/views.h"

#include <memory>

namespace op::batch_norm_backward {
namespace {

using ascend::Buffer;
using ascend::TensorSpec;

enum Arg { kGradInput, kGradWeight, kGradBias, kInput, kGradOutput, kWeight, kMean, kVar };

class AscendDescriptor final : public Descriptor {
  public:
    AscendDescriptor(int device_id, const Info &info, std::unique_ptr<ascend::Plan> plan)
        : Descriptor(INFINI_DEVICE_ASCEND, device_id, info), plan_(std::move(plan)) {}

    size_t workspaceSize() const override { return plan_->workspaceSize(); }

    infiniStatus_t calculate(void *workspace, void *grad_input, void *grad_weight, void *grad_bias,
                             const void *input, const void *grad_output, const void *weight,
                             const void *running_mean, const void *running_var, const void * /*save_mean*/,
                             const void * /*save_invstd: seedFeatures only*/, void *stream) const override {
        return plan_->run(workspace, {grad_input, grad_weight, grad_bias, input, grad_output, weight, running_mean,
                                      running_var},
                          stream);
    }

  private:
    std::unique_ptr<ascend::Plan> plan_;
};

void planCalls(const Info &info, ascend::Plan &plan) {
    const ascend::Api &acl = plan.acl();
    const aclDataType dtype = ascend::aclDtypeOf(info.dtype);
    const size_t channels = info.channels;
    const bool cast = dtype != ACL_FLOAT;

    auto userVector = [&](Arg arg, ptrdiff_t stride) {
        return ascend::vectorView(channels, stride, dtype, Buffer::argument(arg));
    };
    auto f32Vector = [&](Buffer b) {
        return TensorSpec::contiguous({static_cast<int64_t>(channels)}, ACL_FLOAT, b);
    };
    auto castCall = [&](const TensorSpec &from, const TensorSpec &to) {
        aclDataType target = to.dtype;
        plan.add({{from},
                  {to},
                  [&acl, target](aclTensor *const *t, uint64_t *ws, aclOpExecutor **ex) {
                      return acl.aclnnCastGetWorkspaceSize(t[0], target, t[1], ws, ex);
                  },
                  acl.aclnnCast});
    };
    // The F32 view of a channel vector argument: itself for F32, else a workspace copy cast from it.
    auto asF32Input = [&](Arg arg, ptrdiff_t stride) {
        if (!cast) return userVector(arg, stride);
        TensorSpec copy = f32Vector(Buffer::scratch(plan.reserveScratch(channels * sizeof(float))));
        castCall(userVector(arg, stride), copy);
        return copy;
    };
    auto asF32Output = [&](Arg arg, ptrdiff_t stride) {
        return cast ? f32Vector(Buffer::scratch(plan.reserveScratch(channels * sizeof(float))))
                    : userVector(arg, stride);
    };

    const TensorSpec weight = asF32Input(kWeight, info.weight_stride);
    const TensorSpec mean = asF32Input(kMean, info.running_mean_stride);
    const TensorSpec var = asF32Input(kVar, info.running_var_stride);
    const TensorSpec invstd = f32Vector(Buffer::scratch(plan.reserveScratch(channels * sizeof(float))));
    plan.add({{var},
              {invstd},
              [&acl](aclTensor *const *t, uint64_t *ws, aclOpExecutor **ex) {
                  return acl.aclnnRsqrtGetWorkspaceSize(t[0], t[1], ws, ex);
              },
              acl.aclnnRsqrt});

    const TensorSpec grad_weight = asF32Output(kGradWeight, info.grad_weight_stride);
    const TensorSpec grad_bias = asF32Output(kGradBias, info.grad_bias_stride);
    auto ncl = [&](Arg arg) {
        return TensorSpec::contiguous({static_cast<int64_t>(info.batch), static_cast<int64_t>(channels),
                                       static_cast<int64_t>(info.length)},
                                      dtype, Buffer::argument(arg), ACL_FORMAT_NCL);
    };
    const aclBoolArray *output_mask = plan.boolArray({true, true, true});
    plan.add({{ncl(kGradOutput), ncl(kInput), weight, mean, var, mean, invstd},
              {ncl(kGradInput), grad_weight, grad_bias},
              [&acl, output_mask](aclTensor *const *t, uint64_t *ws, aclOpExecutor **ex) {
                  return acl.aclnnBatchNormBackwardGetWorkspaceSize(t[0], t[1], t[2], t[3], t[4], t[5], t[6], true,
                                                                    0.0, output_mask, t[7], t[8], t[9], ws, ex);
              },
              acl.aclnnBatchNormBackward});
    if (cast) {
        castCall(grad_weight, userVector(kGradWeight, info.grad_weight_stride));
        castCall(grad_bias, userVector(kGradBias, info.grad_bias_stride));
    }
}

} // namespace

infiniStatus_t Backends::ascend(const Info &info, int device_id, Descriptor **desc) {
    if (!info.seedFeatures()) return INFINI_STATUS_NOT_IMPLEMENTED;
    const ascend::Api *acl;
    INFINI_CHECK(ascend::api(&acl));
    if (info.weight_stride < 0 || info.running_mean_stride < 0 || info.running_var_stride < 0 ||
        info.grad_weight_stride < 0 || info.grad_bias_stride < 0) {
        return INFINI_STATUS_BAD_TENSOR_STRIDES; // aclCreateTensor takes non-negative strides only
    }
    auto plan = std::make_unique<ascend::Plan>(acl);
    if (info.elements() > 0) {
        planCalls(info, *plan);
    } else if (info.channels > 0) {
        // No samples: grad_weight and grad_bias are empty sums.
        INFINI_CHECK(ascend::addZeroedVectors(*plan, info.channels, infini::dtypeSize(info.dtype),
                                            {{kGradWeight, info.grad_weight_stride}, {kGradBias, info.grad_bias_stride}}));
    }
    INFINI_CHECK(plan->build());
    *desc = new AscendDescriptor(device_id, info, std::move(plan));
    return INFINI_STATUS_SUCCESS;
}

} // namespace op::batch_norm_backward
