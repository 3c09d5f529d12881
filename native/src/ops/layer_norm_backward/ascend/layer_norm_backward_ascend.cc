// LayerNorm backward on Ascend. aclnnLayerNormBackward wants (input, mean, rstd), we hold (xhat, std): given
// input = xhat, mean = 0 and rstd = 1 it yields grad_weight and grad_bias exactly and grad_input * std, so
// one aclnnDiv by std (broadcast along the row) finishes grad_input. The zeros and ones are device constants.
#include "../layer_norm_backward.h"

#include "devices/ascend/views.h"

#include <memory>
#include <vector>

namespace op::layer_norm_backward {
namespace {

using ascend::Buffer;
using ascend::TensorSpec;

enum Arg { kGradInput, kGradWeight, kGradBias, kGradOutput, kWeight, kXhat, kStd };

class AscendDescriptor final : public Descriptor {
  public:
    AscendDescriptor(int device_id, const Info &info, std::unique_ptr<ascend::Plan> plan)
        : Descriptor(INFINI_DEVICE_ASCEND, device_id, info), plan_(std::move(plan)) {}

    size_t workspaceSize() const override { return plan_->workspaceSize(); }

    infiniStatus_t calculate(void *workspace, void *grad_input, void *grad_weight, void *grad_bias,
                             const void *grad_output, const void *weight, const void *input_standardization,
                             const void *input_std_deviation, void *stream) const override {
        return plan_->run(workspace,
                          {grad_input, grad_weight, grad_bias, grad_output, weight, input_standardization,
                           input_std_deviation},
                          stream);
    }

  private:
    std::unique_ptr<ascend::Plan> plan_;
};

void planCalls(const Info &info, ascend::Plan &plan) {
    const ascend::Api &acl = plan.acl();
    const aclDataType dtype = ascend::aclDtypeOf(info.dtype);
    const size_t rows = info.rows, dim = info.dim;

    const std::vector<float> zeros(rows, 0.0f), ones(rows, 1.0f);
    const Buffer mean = Buffer::constant(plan.addConstant(zeros.data(), rows * sizeof(float)));
    const Buffer rstd = Buffer::constant(plan.addConstant(ones.data(), rows * sizeof(float)));
    const Buffer scaled = Buffer::scratch(plan.reserveScratch(rows * dim * infini::dtypeSize(info.dtype)));

    // grad_input * std, packed in the workspace, shaped like grad_input's view.
    const TensorSpec packed =
        TensorSpec::contiguous(ascend::rowsView(info.grad_input, rows, dim, dtype, scaled).shape, dtype, scaled);
    std::vector<int64_t> per_row_shape = packed.shape;
    per_row_shape.back() = 1;

    const aclIntArray *normalized_shape = plan.intArray({static_cast<int64_t>(dim)});
    const aclBoolArray *output_mask = plan.boolArray({true, true, true});
    plan.add({{ascend::rowsView(info.grad_output, rows, dim, dtype, Buffer::argument(kGradOutput)),
               ascend::rowsView(info.input_standardization, rows, dim, dtype, Buffer::argument(kXhat)),
               TensorSpec::contiguous(per_row_shape, ACL_FLOAT, mean),
               TensorSpec::contiguous(per_row_shape, ACL_FLOAT, rstd),
               ascend::vectorView(dim, info.weight_stride, dtype, Buffer::argument(kWeight))},
              {packed, ascend::vectorView(dim, info.grad_weight_stride, dtype, Buffer::argument(kGradWeight)),
               ascend::vectorView(dim, info.grad_bias_stride, dtype, Buffer::argument(kGradBias))},
              [&acl, normalized_shape, output_mask](aclTensor *const *t, uint64_t *ws, aclOpExecutor **ex) {
                  return acl.aclnnLayerNormBackwardGetWorkspaceSize(t[0], t[1], normalized_shape, t[2], t[3], t[4],
                                                                    nullptr, output_mask, t[5], t[6], t[7], ws, ex);
              },
              acl.aclnnLayerNormBackward});
    plan.add({{packed, ascend::perRowView(info.input_std_deviation, rows, dtype, Buffer::argument(kStd))},
              {ascend::rowsView(info.grad_input, rows, dim, dtype, Buffer::argument(kGradInput))},
              [&acl](aclTensor *const *t, uint64_t *ws, aclOpExecutor **ex) {
                  return acl.aclnnDivGetWorkspaceSize(t[0], t[1], t[2], ws, ex);
              },
              acl.aclnnDiv});
}

} // namespace

infiniStatus_t Backends::ascend(const Info &info, int device_id, Descriptor **desc) {
    if (!info.seedFeatures()) return INFINI_STATUS_NOT_IMPLEMENTED;
    const ascend::Api *acl;
    INFINI_CHECK(ascend::api(&acl));
    // aclCreateTensor takes non-negative strides only.
    if (!ascend::nonNegative(info.grad_input, info.rows) || !ascend::nonNegative(info.grad_output, info.rows) ||
        !ascend::nonNegative(info.input_standardization, info.rows) ||
        !ascend::nonNegative(info.input_std_deviation, info.rows) || info.weight_stride < 0 ||
        info.grad_weight_stride < 0 || info.grad_bias_stride < 0) {
        return INFINI_STATUS_BAD_TENSOR_STRIDES;
    }
    auto plan = std::make_unique<ascend::Plan>(acl);
    if (info.rows > 0 && info.dim > 0) {
        planCalls(info, *plan);
    } else if (info.dim > 0) {
        // No rows: grad_weight and grad_bias are empty sums.
        INFINI_CHECK(ascend::addZeroedVectors(*plan, info.dim, infini::dtypeSize(info.dtype),
                                            {{kGradWeight, info.grad_weight_stride}, {kGradBias, info.grad_bias_stride}}));
    }
    INFINI_CHECK(plan->build());
    *desc = new AscendDescriptor(device_id, info, std::move(plan));
    return INFINI_STATUS_SUCCESS;
}

} // namespace op::layer_norm_backward
