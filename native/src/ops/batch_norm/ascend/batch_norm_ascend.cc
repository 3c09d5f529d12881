// BatchNorm forward on Ascend: one aclnnBatchNorm(x, weight, bias, runningMean, runningVar, training, momentum,
// eps, y, saveMean, saveInvstd) on (N, C, L) views in format NCL (batch_norm_views.h). It computes what ours does:
// y from the batch statistics (training) or the running ones (eval); in training the running statistics updated
// in place to (1 - momentum) * running + momentum * batch, the variance unbiased (M / (M - 1)), as its
// BNTrainingUpdate kernel documents.
// - Per-channel tensors are F32 (ChannelVectors): 16-bit parameters and running statistics go through aclnnCast,
//   the running ones cast back after the update.
// - Absent weight, bias, running statistics are NULL (CANN then uses ones, zeros, and 0 / 1 it does not write).
// - saveMean / saveInvstd are required in training: the caller's save_mean, else the workspace.
// - saveInvstd holds, by aclnnBatchNorm's document, the biased batch variance on Atlas training, inference, A2 and
//   A3 products and 1/sqrt(var + eps) only on Ascend 950 (devices/ascend/batch_norm_saved.h): elsewhere save_invstd
//   is aclnnRsqrt(var + eps) of it. On a SoC none of those (or none named), a wanted save_invstd is NOT_IMPLEMENTED.
// - y may be x (in place) as on every device: the document says nothing of aliasing (not tried on real CANN).
// - No samples (N * L == 0): in training save_mean = 0 and save_invstd = 1/sqrt(eps) from fills (packed only,
//   BAD_TENSOR_STRIDES otherwise) and the running statistics left as they are, as on the CPU (CANN would write a
//   NaN invstd).
#include "../batch_norm.h"

#include "devices/ascend/batch_norm_saved.h"
#include "devices/ascend/batch_norm_views.h"

#include <cmath>
#include <memory>
#include <optional>

namespace op::batch_norm {
namespace {

using ascend::SavedSpread;
using ascend::TensorSpec;
using OptionalTensor = std::optional<TensorSpec>;

enum Arg { kY, kSaveMean, kSaveInvstd, kRunningMean, kRunningVar, kX, kWeight, kBias };

class AscendDescriptor final : public Descriptor {
  public:
    AscendDescriptor(int device_id, const Info &info, std::unique_ptr<ascend::Plan> plan)
        : Descriptor(INFINI_DEVICE_ASCEND, device_id, info), plan_(std::move(plan)) {}

    size_t workspaceSize() const override { return plan_->workspaceSize(); }

    infiniStatus_t calculate(void *workspace, void *y, void *save_mean, void *save_invstd, void *running_mean,
                             void *running_var, const void *x, const void *weight, const void *bias,
                             void *stream) const override {
        return plan_->run(workspace, {y, save_mean, save_invstd, running_mean, running_var, x, weight, bias}, stream);
    }

  private:
    std::unique_ptr<ascend::Plan> plan_;
};

void planCalls(const Info &info, ascend::Plan &plan, SavedSpread spread) {
    const ascend::Api &acl = plan.acl();
    ascend::ChannelVectors vectors(plan, info.channels, ascend::aclDtypeOf(info.parameter_dtype));
    const OptionalTensor weight = vectors.input(info.has_weight, kWeight, info.weight_stride);
    const OptionalTensor bias = vectors.input(info.has_bias, kBias, info.bias_stride);
    const OptionalTensor running_mean = vectors.input(info.has_running, kRunningMean, info.running_mean_stride);
    const OptionalTensor running_var = vectors.input(info.has_running, kRunningVar, info.running_var_stride);
    const bool invstd_direct = info.has_save_invstd && spread == SavedSpread::invstd;
    auto saved = [&](Arg arg, ptrdiff_t stride) { return vectors.argument(arg, stride, ACL_FLOAT); };
    OptionalTensor save_mean, save_invstd;
    if (info.training) {
        save_mean = info.has_save_mean ? saved(kSaveMean, info.save_mean_stride) : vectors.scratch();
        save_invstd = invstd_direct ? saved(kSaveInvstd, info.save_invstd_stride) : vectors.scratch();
    }

    const bool training = info.training;
    const double momentum = info.momentum, eps = info.epsilon;
    plan.add({{ascend::nclView(info, kX), weight, bias, running_mean, running_var},
              {ascend::nclView(info, kY), save_mean, save_invstd},
              [&acl, training, momentum, eps](aclTensor *const *t, uint64_t *ws, aclOpExecutor **ex) {
                  return acl.aclnnBatchNormGetWorkspaceSize(t[0], t[1], t[2], t[3], t[4], training, momentum, eps,
                                                            t[5], t[6], t[7], ws, ex);
              },
              acl.aclnnBatchNorm});
    if (!training) return;
    vectors.finish(running_mean, kRunningMean, info.running_mean_stride);
    vectors.finish(running_var, kRunningVar, info.running_var_stride);
    if (info.has_save_invstd && !invstd_direct) {
        ascend::addInverseSqrt(plan, *save_invstd, eps, saved(kSaveInvstd, info.save_invstd_stride));
    }
}

bool nonNegativeStrides(const Info &info) {
    for (ptrdiff_t stride : {info.save_mean_stride, info.save_invstd_stride, info.running_mean_stride,
                             info.running_var_stride, info.weight_stride, info.bias_stride}) {
        if (stride < 0) return false;
    }
    return true;
}

} // namespace

infiniStatus_t Backends::ascend(const Info &info, int device_id, Descriptor **desc) {
    const ascend::Api *acl;
    INFINI_CHECK(ascend::loadFor(info.dtype, nonNegativeStrides(info), &acl));
    const bool computes = info.elements() > 0;
    const SavedSpread spread = ascend::savedSpreadOf(*acl);
    if (computes && info.has_save_invstd && spread == SavedSpread::unknown) return INFINI_STATUS_NOT_IMPLEMENTED;
    const size_t saved = info.training ? info.channels : 0;
    const float empty_invstd = static_cast<float>(1.0 / std::sqrt(info.epsilon)); // of no samples: var 0
    std::unique_ptr<ascend::Plan> plan;
    INFINI_CHECK(ascend::makePlan(
        acl, device_id, computes,
        {{kSaveMean, info.has_save_mean ? saved : 0, ascend::unitStride(saved, info.save_mean_stride), ACL_FLOAT, 0.0f},
         {kSaveInvstd, info.has_save_invstd ? saved : 0, ascend::unitStride(saved, info.save_invstd_stride), ACL_FLOAT,
          empty_invstd}},
        [&](ascend::Plan &p) { planCalls(info, p, spread); }, &plan));
    *desc = new AscendDescriptor(device_id, info, std::move(plan));
    return INFINI_STATUS_SUCCESS;
}

} // namespace op::batch_norm
