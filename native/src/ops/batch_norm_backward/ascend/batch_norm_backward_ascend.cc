// BatchNorm backward on Ascend: one aclnnBatchNormBackward on (N, C, L) views, format NCL (L = the spatial dims
// flattened; channels-last tensors are strided NCL views, which aclnn accepts as non-contiguous tensors).
// - Statistics: eval passes the running ones with training = false and eps (CANN computes 1/sqrt(var + eps)).
//   Training passes saveMean and, as saveInvstd, what the SoC's aclnnBatchNormBackward reads there
//   (devices/ascend/batch_norm_saved.h): on Ascend 950 1/sqrt(var + eps), the caller's save_invstd or
//   aclnnRsqrt(var + eps) of the batch variance; on Atlas training, inference, A2 and A3 SoCs the biased batch
//   variance itself, or 1/save_invstd^2 - eps of the caller's (aclnnDiv, aclnnAdds). On another SoC (or none
//   named) a training backward is NOT_IMPLEMENTED. saveMean is the caller's save_mean, else the batch mean.
//   Statistics not used are NULL.
// - weight NULL is weight = NULL (ones); skipped gradients are outputMask entries (NULL outputs).
// - Per-channel tensors are F32 (the only dtype every documented version accepts): F16/BF16 channel vectors go
//   through aclnnCast both ways; F32 ones (F32 parameters with any data, saved statistics) are passed as they are.
#include "../batch_norm_backward.h"

#include "devices/ascend/batch_norm_saved.h"
#include "devices/ascend/batch_norm_views.h"

#include <memory>
#include <optional>
#include <utility>

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

// saveMean / saveInvstd of the training backward, saveInvstd as `spread` says the kernel reads it (see above): from
// the caller's saved ones, else from the batch mean and variance (the running ones' F32 views). Neither in eval.
std::pair<OptionalTensor, OptionalTensor> savedStatistics(const Info &info, ascend::ChannelVectors &vectors,
                                                          const OptionalTensor &mean, const OptionalTensor &var,
                                                          ascend::SavedSpread spread) {
    if (!info.training) return {std::nullopt, std::nullopt};
    const bool reads_invstd = spread == ascend::SavedSpread::invstd;
    if (info.has_save) {
        const TensorSpec save_mean = vectors.argument(kSaveMean, info.save_mean_stride, ACL_FLOAT);
        const TensorSpec save_invstd = vectors.argument(kSaveInvstd, info.save_invstd_stride, ACL_FLOAT);
        if (reads_invstd) return {save_mean, save_invstd};
        TensorSpec variance = vectors.scratch();
        ascend::addVarianceOfInverseSqrt(vectors.plan(), save_invstd, info.epsilon, variance);
        return {save_mean, variance};
    }
    if (!reads_invstd) return {mean, var};
    TensorSpec invstd = vectors.scratch();
    ascend::addInverseSqrt(vectors.plan(), *var, info.epsilon, invstd);
    return {mean, invstd};
}

void planCalls(const Info &info, ascend::Plan &plan, ascend::SavedSpread spread) {
    const ascend::Api &acl = plan.acl();
    ascend::ChannelVectors vectors(plan, info.channels, ascend::aclDtypeOf(info.parameter_dtype));
    const OptionalTensor weight = vectors.input(info.has_weight, kWeight, info.weight_stride);
    const bool uses_running = info.usesRunning();
    const OptionalTensor mean = vectors.input(uses_running, kMean, info.running_mean_stride);
    const OptionalTensor var = vectors.input(uses_running, kVar, info.running_var_stride);
    const auto [save_mean, save_invstd] = savedStatistics(info, vectors, mean, var, spread);
    const OptionalTensor grad_weight = vectors.output(info.has_grad_weight, kGradWeight, info.grad_weight_stride);
    const OptionalTensor grad_bias = vectors.output(info.has_grad_bias, kGradBias, info.grad_bias_stride);

    auto ncl = [&](Arg arg) { return ascend::nclView(info, arg); };
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
    vectors.finish(grad_weight, kGradWeight, info.grad_weight_stride);
    vectors.finish(grad_bias, kGradBias, info.grad_bias_stride);
}

} // namespace

infiniStatus_t Backends::ascend(const Info &info, int device_id, Descriptor **desc) {
    const bool strides_taken = info.weight_stride >= 0 && info.running_mean_stride >= 0 &&
                               info.running_var_stride >= 0 && info.save_mean_stride >= 0 &&
                               info.save_invstd_stride >= 0 && info.grad_weight_stride >= 0 &&
                               info.grad_bias_stride >= 0;
    const ascend::Api *acl;
    INFINI_CHECK(ascend::loadFor(info.dtype, strides_taken, &acl));
    const bool computes = info.elements() > 0;
    const ascend::SavedSpread spread = ascend::savedSpreadOf(*acl);
    if (computes && info.training && spread == ascend::SavedSpread::unknown) return INFINI_STATUS_NOT_IMPLEMENTED;
    std::unique_ptr<ascend::Plan> plan;
    const size_t c = info.channels;
    INFINI_CHECK(ascend::makePlan(
        acl, device_id, computes,
        {ascend::emptySum(kGradWeight, info.has_grad_weight, c, info.grad_weight_stride, info.parameter_dtype),
         ascend::emptySum(kGradBias, info.has_grad_bias, c, info.grad_bias_stride, info.parameter_dtype)},
        [&](ascend::Plan &p) { planCalls(info, p, spread); }, &plan));
    *desc = new AscendDescriptor(device_id, info, std::move(plan));
    return INFINI_STATUS_SUCCESS;
}

} // namespace op::batch_norm_backward
