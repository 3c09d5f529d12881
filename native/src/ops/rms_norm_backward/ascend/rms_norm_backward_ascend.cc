// RMSNorm backward on Ascend: rstd is the caller's (Ex) or aclnnRmsNorm(x, w, epsilon) leaves it in the
// workspace; then aclnnRmsNormGrad. Its dgamma is F32: written straight to an F32 grad_w, cast by aclnnCast for
// an F16/BF16 one, or left in the workspace when grad_w is not wanted (aclnnRmsNormGrad always produces it).
// Every shape is passed as (rows, D): the normalized dims are packed, so w of any rank is a (D,) vector.
// aclnnRmsNormGrad takes no strided input, so every tensor must be packed (BAD_TENSOR_STRIDES otherwise).
#include "../rms_norm_backward.h"

#include "devices/ascend/calls.h"
#include "devices/ascend/views.h"

#include <memory>

namespace op::rms_norm_backward {
namespace {

using ascend::Buffer;
using ascend::TensorSpec;

enum Arg { kGradX, kGradW, kGradY, kX, kW, kRstd };

class AscendDescriptor final : public Descriptor {
  public:
    AscendDescriptor(int device_id, const Info &info, std::unique_ptr<ascend::Plan> plan)
        : Descriptor(INFINI_DEVICE_ASCEND, device_id, info), plan_(std::move(plan)) {}

    size_t workspaceSize() const override { return plan_->workspaceSize(); }

    infiniStatus_t calculate(void *workspace, void *grad_x, void *grad_w, const void *grad_y, const void *x,
                             const void *w, const void *rstd, void *stream) const override {
        return plan_->run(workspace, {grad_x, grad_w, grad_y, x, w, rstd}, stream);
    }

  private:
    std::unique_ptr<ascend::Plan> plan_;
};

void planCalls(const Info &info, ascend::Plan &plan) {
    const ascend::Api &acl = plan.acl();
    const aclDataType dtype = ascend::aclDtypeOf(info.dtype), weight_dtype = ascend::aclDtypeOf(info.weight_dtype);
    const int64_t rows = static_cast<int64_t>(info.rows), dim = static_cast<int64_t>(info.dim);
    const size_t element = infini::dtypeSize(info.dtype);

    auto matrix = [&](Buffer b) { return TensorSpec::contiguous({rows, dim}, dtype, b); };
    auto vector = [&](Buffer b, aclDataType t) { return TensorSpec::contiguous({dim}, t, b); };

    Buffer rstd = Buffer::argument(kRstd);
    if (!info.has_rstd) {
        const Buffer y = Buffer::scratch(plan.reserveScratch(infini::CheckedSize(info.rows) * info.dim * element));
        rstd = Buffer::scratch(plan.reserveScratch(infini::CheckedSize(info.rows) * sizeof(float)));
        const double epsilon = info.epsilon;
        plan.add({{matrix(Buffer::argument(kX)), vector(Buffer::argument(kW), weight_dtype)},
                  {matrix(y), TensorSpec::contiguous({rows, 1}, ACL_FLOAT, rstd)},
                  [&acl, epsilon](aclTensor *const *t, uint64_t *ws, aclOpExecutor **ex) {
                      return acl.aclnnRmsNormGetWorkspaceSize(t[0], t[1], epsilon, t[2], t[3], ws, ex);
                  },
                  acl.aclnnRmsNorm});
    }
    const bool direct_dgamma = info.has_grad_w && weight_dtype == ACL_FLOAT;
    const Buffer dgamma =
        direct_dgamma ? Buffer::argument(kGradW) : Buffer::scratch(plan.reserveScratch(infini::CheckedSize(info.dim) * sizeof(float)));
    plan.add({{matrix(Buffer::argument(kGradY)), matrix(Buffer::argument(kX)),
               TensorSpec::contiguous({rows}, ACL_FLOAT, rstd), vector(Buffer::argument(kW), weight_dtype)},
              {matrix(Buffer::argument(kGradX)), vector(dgamma, ACL_FLOAT)},
              [&acl](aclTensor *const *t, uint64_t *ws, aclOpExecutor **ex) {
                  return acl.aclnnRmsNormGradGetWorkspaceSize(t[0], t[1], t[2], t[3], t[4], t[5], ws, ex);
              },
              acl.aclnnRmsNormGrad});
    if (info.has_grad_w && !direct_dgamma) {
        ascend::addCast(plan, vector(dgamma, ACL_FLOAT), vector(Buffer::argument(kGradW), weight_dtype));
    }
}

} // namespace

infiniStatus_t Backends::ascend(const Info &info, int device_id, Descriptor **desc) {
    // aclnnRmsNormGrad takes packed tensors only.
    const bool strides_taken =
        ascend::packedRows(info.grad_x, info.rows, info.dim) && ascend::packedRows(info.grad_y, info.rows, info.dim) &&
        ascend::packedRows(info.x, info.rows, info.dim) && ascend::unitStride(info.dim, info.w_stride) &&
        (!info.has_grad_w || ascend::unitStride(info.dim, info.grad_w_stride)) &&
        (!info.has_rstd || ascend::packedRows(info.rstd, info.rows, 1));
    const ascend::Api *acl;
    INFINI_CHECK(ascend::loadFor(info.dtype, strides_taken, &acl));
    std::unique_ptr<ascend::Plan> plan;
    INFINI_CHECK(ascend::makePlan(acl, device_id, info.rows > 0 && info.dim > 0,
                                  {ascend::emptySum(kGradW, info.has_grad_w, info.dim, info.grad_w_stride,
                                                    info.weight_dtype)},
                                  [&](ascend::Plan &p) { planCalls(info, p); }, &plan));
    *desc = new AscendDescriptor(device_id, info, std::move(plan));
    return INFINI_STATUS_SUCCESS;
}

} // namespace op::rms_norm_backward
