// RMSNorm forward on Ascend: one aclnnRmsNorm(x, w, epsilon, y, rstd) on (leading..., D) views. The normalized
// dims are packed, so they pass as one of D and w of any rank as a (D,) vector; the leading dims keep the tensors'
// own strides, all row tensors viewed with one leading shape (aclnnRmsNorm takes non-contiguous tensors).
// - rstd is F32 of shape (leading..., 1), as CANN's example passes it. aclnnRmsNorm has no optional rstdOut, so
//   the seed form's (or an Ex descriptor's without rstd) goes to the workspace.
// - Its dtype table (Atlas A2/A3, Ascend 950) is ours: x F16/BF16 with w of x's dtype or F32, or both F32.
// - y may be x (in place) as on every device: the document says nothing of aliasing (not tried on real CANN).
// - No rows: nothing to do. Rows of zero length (aclnn refuses empty tensors) get rstd = NaN (0/0, as on the CPU)
//   from a fill, which needs rstd packed (BAD_TENSOR_STRIDES otherwise).
#include "../rms_norm.h"

#include "devices/ascend/views.h"

#include <memory>
#include <vector>

namespace op::rms_norm {
namespace {

using ascend::Buffer;
using ascend::TensorSpec;

enum Arg { kY, kRstd, kX, kW };

class AscendDescriptor final : public Descriptor {
  public:
    AscendDescriptor(int device_id, const Info &info, std::unique_ptr<ascend::Plan> plan)
        : Descriptor(INFINI_DEVICE_ASCEND, device_id, info), plan_(std::move(plan)) {}

    size_t workspaceSize() const override { return plan_->workspaceSize(); }

    infiniStatus_t calculate(void *workspace, void *y, void *rstd, const void *x, const void *w,
                             void *stream) const override {
        return plan_->run(workspace, {y, rstd, x, w}, stream);
    }

  private:
    std::unique_ptr<ascend::Plan> plan_;
};

void planCalls(const Info &info, ascend::Plan &plan) {
    const ascend::Api &acl = plan.acl();
    const aclDataType dtype = ascend::aclDtypeOf(info.dtype);
    std::vector<const RowLayout *> layouts{&info.y, &info.x};
    if (info.has_rstd) layouts.push_back(&info.rstd);
    const std::vector<int64_t> leading = ascend::commonRowDims(info.rows, layouts);
    auto rowsOf = [&](const RowLayout &layout, size_t length, aclDataType type, Arg arg) {
        return ascend::rowsView(layout, leading, length, type, Buffer::argument(arg));
    };
    const TensorSpec x = rowsOf(info.x, info.dim, dtype, kX);
    std::vector<int64_t> per_row = x.shape;
    per_row.back() = 1;
    TensorSpec rstd = TensorSpec::contiguous(per_row, ACL_FLOAT, Buffer::argument(kRstd));
    if (info.has_rstd) {
        rstd = rowsOf(info.rstd, 1, ACL_FLOAT, kRstd);
    } else {
        rstd.buffer = Buffer::scratch(plan.reserveScratch(infini::CheckedSize(info.rows) * sizeof(float)));
    }
    const TensorSpec w =
        ascend::vectorView(info.dim, info.w_stride, ascend::aclDtypeOf(info.weight_dtype), Buffer::argument(kW));
    const double epsilon = info.epsilon;
    plan.add({{x, w},
              {rowsOf(info.y, info.dim, dtype, kY), rstd},
              [&acl, epsilon](aclTensor *const *t, uint64_t *ws, aclOpExecutor **ex) {
                  return acl.aclnnRmsNormGetWorkspaceSize(t[0], t[1], epsilon, t[2], t[3], ws, ex);
              },
              acl.aclnnRmsNorm});
}

} // namespace

infiniStatus_t Backends::ascend(const Info &info, int device_id, Descriptor **desc) {
    const bool strides_taken = ascend::nonNegative(info.y) && ascend::nonNegative(info.x) && info.w_stride >= 0 &&
                               (!info.has_rstd || ascend::nonNegative(info.rstd));
    const ascend::Api *acl;
    INFINI_CHECK(ascend::loadFor(info.dtype, strides_taken, &acl));
    std::unique_ptr<ascend::Plan> plan;
    INFINI_CHECK(ascend::makePlan(acl, device_id, info.rows > 0 && info.dim > 0,
                                  {ascend::emptyStatistic(kRstd, info.has_rstd, info.rstd, info.rows, ACL_FLOAT)},
                                  [&](ascend::Plan &p) { planCalls(info, p); }, &plan));
    *desc = new AscendDescriptor(device_id, info, std::move(plan));
    return INFINI_STATUS_SUCCESS;
}

} // namespace op::rms_norm
