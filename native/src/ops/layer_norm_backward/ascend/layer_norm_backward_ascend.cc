// LayerNorm backward on Ascend: aclnnLayerNormBackward takes (input, mean, rstd), which the from-input form
// passes straight in. The xhat form holds (xhat, std): given input = xhat, mean = 0 and rstd = 1 it yields
// grad_weight and grad_bias exactly and grad_input * std, so one aclnnDiv by std (broadcast along the row)
// finishes grad_input. The zeros and ones are device constants.
// Skipped gradients are outputMask entries; a missing weight is weightOptional = NULL (CANN then uses ones),
// except with F32 gradients for F16/BF16 data: the gradients take weightOptional's dtype, so an F32 ones
// constant stands in. The normalized dims (packed) are passed as one, normalizedShape = [L].
#include "../layer_norm_backward.h"

#include "devices/ascend/calls.h"
#include "devices/ascend/views.h"

#include <memory>
#include <optional>
#include <vector>

namespace op::layer_norm_backward {
namespace {

using ascend::Buffer;
using ascend::TensorSpec;

// The run's data pointers, in calculate's order (kMean: NULL in the xhat form).
enum Arg { kGradInput, kGradWeight, kGradBias, kGradOutput, kWeight, kRowInput, kMean, kScale };

class AscendDescriptor final : public Descriptor {
  public:
    AscendDescriptor(int device_id, const Info &info, std::unique_ptr<ascend::Plan> plan)
        : Descriptor(INFINI_DEVICE_ASCEND, device_id, info), plan_(std::move(plan)) {}

    size_t workspaceSize() const override { return plan_->workspaceSize(); }

    infiniStatus_t calculate(void *workspace, void *grad_input, void *grad_weight, void *grad_bias,
                             const void *grad_output, const void *weight, const void *row_input, const void *row_mean,
                             const void *row_scale, void *stream) const override {
        return plan_->run(workspace, {grad_input, grad_weight, grad_bias, grad_output, weight, row_input, row_mean,
                                      row_scale},
                          stream);
    }

  private:
    std::unique_ptr<ascend::Plan> plan_;
};

// weightOptional: the caller's weight, NULL (ones of dT, CANN's default), or an F32 ones constant.
std::optional<TensorSpec> weightTensor(const Info &info, ascend::Plan &plan) {
    const aclDataType parameter_dtype = ascend::aclDtypeOf(info.parameter_dtype);
    if (info.has_weight) return ascend::vectorView(info.dim, info.weight_stride, parameter_dtype, Buffer::argument(kWeight));
    if (info.parameter_dtype == info.dtype) return std::nullopt;
    const std::vector<float> ones(info.dim, 1.0f);
    const Buffer constant = Buffer::constant(plan.addConstant(ones.data(), info.dim * sizeof(float)));
    return TensorSpec::contiguous({static_cast<int64_t>(info.dim)}, ACL_FLOAT, constant);
}

void planCalls(const Info &info, ascend::Plan &plan) {
    const ascend::Api &acl = plan.acl();
    const aclDataType dtype = ascend::aclDtypeOf(info.dtype), parameter_dtype = ascend::aclDtypeOf(info.parameter_dtype);
    const size_t rows = info.rows, dim = info.dim;
    const bool from_input = info.form == Info::Form::from_input;

    const std::optional<TensorSpec> weight = weightTensor(info, plan);
    // One leading shape for every row tensor: aclnn matches their shapes (and broadcasts std) dim by dim.
    std::vector<const RowLayout *> row_layouts{&info.grad_input, &info.grad_output, &info.row_input, &info.row_scale};
    if (from_input) row_layouts.push_back(&info.row_mean);
    const std::vector<int64_t> leading = ascend::commonRowDims(rows, row_layouts);
    auto rowsOf = [&](const RowLayout &layout, size_t length, aclDataType type, Arg arg) {
        return ascend::rowsView(layout, leading, length, type, Buffer::argument(arg));
    };
    auto gradientVector = [&](bool wanted, Arg arg, ptrdiff_t stride) -> std::optional<TensorSpec> {
        if (!wanted) return std::nullopt;
        return ascend::vectorView(dim, stride, parameter_dtype, Buffer::argument(arg));
    };
    const aclIntArray *normalized_shape = plan.intArray({static_cast<int64_t>(dim)});
    const aclBoolArray *output_mask = plan.boolArray({true, info.has_grad_weight, info.has_grad_bias});
    auto layerNormBackward = [&acl, normalized_shape, output_mask](aclTensor *const *t, uint64_t *ws,
                                                                   aclOpExecutor **ex) {
        return acl.aclnnLayerNormBackwardGetWorkspaceSize(t[0], t[1], normalized_shape, t[2], t[3], t[4], nullptr,
                                                          output_mask, t[5], t[6], t[7], ws, ex);
    };

    if (from_input) { // mean and rstd are F32 (F64 data is NOT_IMPLEMENTED), one per row: shape (leading, 1)
        plan.add({{rowsOf(info.grad_output, dim, dtype, kGradOutput), rowsOf(info.row_input, dim, dtype, kRowInput),
                   rowsOf(info.row_mean, 1, ACL_FLOAT, kMean), rowsOf(info.row_scale, 1, ACL_FLOAT, kScale), weight},
                  {rowsOf(info.grad_input, dim, dtype, kGradInput),
                   gradientVector(info.has_grad_weight, kGradWeight, info.grad_weight_stride),
                   gradientVector(info.has_grad_bias, kGradBias, info.grad_bias_stride)},
                  layerNormBackward, acl.aclnnLayerNormBackward});
        return;
    }

    const std::vector<float> zeros(rows, 0.0f), ones(rows, 1.0f);
    const Buffer mean = Buffer::constant(plan.addConstant(zeros.data(), rows * sizeof(float)));
    const Buffer rstd = Buffer::constant(plan.addConstant(ones.data(), rows * sizeof(float)));
    const Buffer scaled = Buffer::scratch(plan.reserveScratch(infini::CheckedSize(rows) * dim * infini::dtypeSize(info.dtype)));

    // grad_input * std, packed in the workspace, shaped like grad_input's view.
    const TensorSpec packed =
        TensorSpec::contiguous(rowsOf(info.grad_input, dim, dtype, kGradInput).shape, dtype, scaled);
    std::vector<int64_t> per_row_shape = packed.shape;
    per_row_shape.back() = 1;
    plan.add({{rowsOf(info.grad_output, dim, dtype, kGradOutput), rowsOf(info.row_input, dim, dtype, kRowInput),
               TensorSpec::contiguous(per_row_shape, ACL_FLOAT, mean),
               TensorSpec::contiguous(per_row_shape, ACL_FLOAT, rstd), weight},
              {packed, gradientVector(info.has_grad_weight, kGradWeight, info.grad_weight_stride),
               gradientVector(info.has_grad_bias, kGradBias, info.grad_bias_stride)},
              layerNormBackward, acl.aclnnLayerNormBackward});
    ascend::addDiv(plan, packed, rowsOf(info.row_scale, 1, parameter_dtype, kScale),
                   rowsOf(info.grad_input, dim, dtype, kGradInput));
}

} // namespace

infiniStatus_t Backends::ascend(const Info &info, int device_id, Descriptor **desc) {
    const bool strides_taken =
        ascend::nonNegative(info.grad_input) && ascend::nonNegative(info.grad_output) &&
        ascend::nonNegative(info.row_input) && ascend::nonNegative(info.row_scale) &&
        (info.form != Info::Form::from_input || ascend::nonNegative(info.row_mean)) && info.weight_stride >= 0 &&
        info.grad_weight_stride >= 0 && info.grad_bias_stride >= 0;
    const ascend::Api *acl;
    INFINI_CHECK(ascend::loadFor(info.dtype, strides_taken, &acl));
    std::unique_ptr<ascend::Plan> plan;
    INFINI_CHECK(ascend::makePlan(
        acl, device_id, info.rows > 0 && info.dim > 0,
        {ascend::emptySum(kGradWeight, info.has_grad_weight, info.dim, info.grad_weight_stride, info.parameter_dtype),
         ascend::emptySum(kGradBias, info.has_grad_bias, info.dim, info.grad_bias_stride, info.parameter_dtype)},
        [&](ascend::Plan &p) { planCalls(info, p); }, &plan));
    *desc = new AscendDescriptor(device_id, info, std::move(plan));
    return INFINI_STATUS_SUCCESS;
}

} // namespace op::layer_norm_backward
