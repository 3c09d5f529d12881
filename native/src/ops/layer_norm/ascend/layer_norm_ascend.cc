// LayerNorm forward on Ascend: aclnnLayerNorm(x, [L], w, b, eps, y, mean, rstd) on (leading..., L) views. The
// normalized dims are packed, so they pass as one (normalizedShape = [L]); the leading dims keep the tensors' own
// strides, all row tensors viewed with one leading shape (aclnnLayerNorm takes non-contiguous tensors).
// - The Ex form is that one call. Absent w / b are weightOptional / biasOptional = NULL (CANN then uses ones /
//   zeros, of the other's dtype or else the input's), absent mean / rstd meanOutOptional / rstdOutOptional = NULL.
// - The xhat form: xhat is aclnnLayerNorm without weight and bias, run first (y may be x); then y, with its rstd
//   into the workspace when std is wanted, and std = 1 / rstd by aclnnDiv (a constant one over the rows) in the
//   parameters' dtype: std = sqrt(var + eps) exactly as the CPU defines it.
// - mean and rstd are F32 for every data dtype, as torch_npu passes them for 16-bit input and CANN's first phase
//   accepts; the newest document words them as the input's dtype, which would round the mean the from-input
//   backward subtracts to 16 bits.
// - y may be x (in place) as on every device: the document says nothing of aliasing (not tried on real CANN).
// - No rows: nothing to do. Rows of zero length (aclnn refuses empty tensors) get NaN statistics (0/0, as on the
//   CPU) from a fill, which needs them packed (BAD_TENSOR_STRIDES otherwise).
#include "../layer_norm.h"

#include "devices/ascend/calls.h"
#include "devices/ascend/views.h"

#include <memory>
#include <optional>
#include <vector>

namespace op::layer_norm {
namespace {

using ascend::Buffer;
using ascend::TensorSpec;
using OptionalTensor = std::optional<TensorSpec>;

// The run's data pointers, in calculate's order (kFirst: std in the xhat form, mean in the Ex form).
enum Arg { kY, kXhat, kFirst, kRstd, kX, kW, kB };

class AscendDescriptor final : public Descriptor {
  public:
    AscendDescriptor(int device_id, const Info &info, std::unique_ptr<ascend::Plan> plan)
        : Descriptor(INFINI_DEVICE_ASCEND, device_id, info), plan_(std::move(plan)) {}

    size_t workspaceSize() const override { return plan_->workspaceSize(); }

    infiniStatus_t calculate(void *workspace, void *y, void *xhat, void *first_statistic, void *rstd, const void *x,
                             const void *w, const void *b, void *stream) const override {
        return plan_->run(workspace, {y, xhat, first_statistic, rstd, x, w, b}, stream);
    }

  private:
    std::unique_ptr<ascend::Plan> plan_;
};

// The views of one descriptor's tensors, all rows with one leading shape (aclnn matches shapes dim by dim).
class Views {
  public:
    explicit Views(const Info &info) : info_(info) {
        std::vector<const RowLayout *> layouts{&info.y, &info.x};
        if (info.has_xhat) layouts.push_back(&info.xhat);
        if (info.has_first_statistic) layouts.push_back(&info.first_statistic);
        if (info.has_rstd) layouts.push_back(&info.rstd);
        leading_ = ascend::commonRowDims(info.rows, layouts);
    }

    TensorSpec rows(const RowLayout &layout, Arg arg) const { return rowsOf(layout, info_.dim, info_.dtype, arg); }
    TensorSpec perRow(const RowLayout &layout, infiniDtype_t dtype, Arg arg) const {
        return rowsOf(layout, 1, dtype, arg);
    }
    OptionalTensor vector(bool present, ptrdiff_t stride, Arg arg) const {
        if (!present) return std::nullopt;
        return ascend::vectorView(info_.dim, stride, ascend::aclDtypeOf(info_.parameter_dtype), Buffer::argument(arg));
    }

  private:
    TensorSpec rowsOf(const RowLayout &layout, size_t length, infiniDtype_t dtype, Arg arg) const {
        return ascend::rowsView(layout, leading_, length, ascend::aclDtypeOf(dtype), Buffer::argument(arg));
    }

    const Info &info_;
    std::vector<int64_t> leading_;
};

// One aclnnLayerNorm of x (eps and normalizedShape = [L] from info) into out and the optional outputs.
void addLayerNorm(const Info &info, ascend::Plan &plan, const TensorSpec &x, const OptionalTensor &w,
                  const OptionalTensor &b, const TensorSpec &out, const OptionalTensor &mean,
                  const OptionalTensor &rstd) {
    const ascend::Api &acl = plan.acl();
    const aclIntArray *normalized_shape = plan.intArray({static_cast<int64_t>(info.dim)});
    const double eps = info.epsilon;
    plan.add({{x, w, b},
              {out, mean, rstd},
              [&acl, normalized_shape, eps](aclTensor *const *t, uint64_t *ws, aclOpExecutor **ex) {
                  return acl.aclnnLayerNormGetWorkspaceSize(t[0], normalized_shape, t[1], t[2], eps, t[3], t[4], t[5],
                                                            ws, ex);
              },
              acl.aclnnLayerNorm});
}

// The xhat form: xhat (before y, which may overwrite x), y, then std = 1 / rstd.
void planXhatForm(const Info &info, ascend::Plan &plan, const Views &views) {
    const TensorSpec x = views.rows(info.x, kX), y = views.rows(info.y, kY);
    if (info.has_xhat) addLayerNorm(info, plan, x, std::nullopt, std::nullopt, views.rows(info.xhat, kXhat), {}, {});
    const OptionalTensor w = views.vector(info.has_w, info.w_stride, kW);
    const OptionalTensor b = views.vector(info.has_b, info.b_stride, kB);
    if (!info.has_first_statistic) {
        addLayerNorm(info, plan, x, w, b, y, std::nullopt, std::nullopt);
        return;
    }
    std::vector<int64_t> per_row = y.shape;
    per_row.back() = 1;
    const size_t offset = plan.reserveScratch(infini::CheckedSize(info.rows) * sizeof(float));
    const TensorSpec rstd = TensorSpec::contiguous(per_row, ACL_FLOAT, Buffer::scratch(offset));
    addLayerNorm(info, plan, x, w, b, y, std::nullopt, rstd);
    ascend::addDiv(plan, ascend::oneConstant(plan), rstd,
                   views.perRow(info.first_statistic, info.parameter_dtype, kFirst));
}

void planCalls(const Info &info, ascend::Plan &plan) {
    const Views views(info);
    if (info.form == Info::Form::xhat) {
        planXhatForm(info, plan, views);
        return;
    }
    auto statistic = [&](bool present, const RowLayout &layout, Arg arg) -> OptionalTensor {
        if (!present) return std::nullopt;
        return views.perRow(layout, INFINI_DTYPE_F32, arg);
    };
    addLayerNorm(info, plan, views.rows(info.x, kX), views.vector(info.has_w, info.w_stride, kW),
                 views.vector(info.has_b, info.b_stride, kB), views.rows(info.y, kY),
                 statistic(info.has_first_statistic, info.first_statistic, kFirst),
                 statistic(info.has_rstd, info.rstd, kRstd));
}

bool nonNegativeStrides(const Info &info) {
    return ascend::nonNegative(info.y) && ascend::nonNegative(info.x) &&
           (!info.has_xhat || ascend::nonNegative(info.xhat)) &&
           (!info.has_first_statistic || ascend::nonNegative(info.first_statistic)) &&
           (!info.has_rstd || ascend::nonNegative(info.rstd)) && info.w_stride >= 0 && info.b_stride >= 0;
}

} // namespace

infiniStatus_t Backends::ascend(const Info &info, int device_id, Descriptor **desc) {
    const ascend::Api *acl;
    INFINI_CHECK(ascend::loadFor(info.dtype, nonNegativeStrides(info), &acl));
    // The first statistic: std of the parameters' dtype (xhat form) or the F32 mean.
    const aclDataType first_dtype =
        info.form == Info::Form::xhat ? ascend::aclDtypeOf(info.parameter_dtype) : ACL_FLOAT;
    std::unique_ptr<ascend::Plan> plan;
    INFINI_CHECK(ascend::makePlan(
        acl, device_id, info.rows > 0 && info.dim > 0,
        {ascend::emptyStatistic(kFirst, info.has_first_statistic, info.first_statistic, info.rows, first_dtype),
         ascend::emptyStatistic(kRstd, info.has_rstd, info.rstd, info.rows, ACL_FLOAT)},
        [&](ascend::Plan &p) { planCalls(info, p); }, &plan));
    *desc = new AscendDescriptor(device_id, info, std::move(plan));
    return INFINI_STATUS_SUCCESS;
}

} // namespace op::layer_norm
