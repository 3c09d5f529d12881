#include "batch_norm_backward.h"

#include "infiniop/ops/batch_norm_backward.h"
#include "ops/dispatch.h"

using op::batch_norm_backward::Op;
using op::batch_norm_backward::Phase;

__C infiniStatus_t infiniopCreateBatchNormBackwardDescriptor(
    infiniopHandle_t handle, infiniopBatchNormBackwardDescriptor_t *desc_ptr,
    infiniopTensorDescriptor_t grad_input_desc, infiniopTensorDescriptor_t grad_weight_desc,
    infiniopTensorDescriptor_t grad_bias_desc, infiniopTensorDescriptor_t input_desc,
    infiniopTensorDescriptor_t grad_output_desc, infiniopTensorDescriptor_t weight_desc,
    infiniopTensorDescriptor_t running_mean_desc, infiniopTensorDescriptor_t running_var_desc) {
    // grad_bias_desc (argument 2) may be NULL: a layer without bias, as InfiniCore passes it; not computed then.
    return op::createDescriptor<Op>(handle, desc_ptr, 2, grad_input_desc, grad_weight_desc, grad_bias_desc,
                                    input_desc, grad_output_desc, weight_desc, running_mean_desc, running_var_desc);
}

__C infiniStatus_t infiniopCreateBatchNormBackwardDescriptorEx(
    infiniopHandle_t handle, infiniopBatchNormBackwardDescriptor_t *desc_ptr,
    infiniopTensorDescriptor_t grad_input_desc, infiniopTensorDescriptor_t grad_weight_desc,
    infiniopTensorDescriptor_t grad_bias_desc, infiniopTensorDescriptor_t input_desc,
    infiniopTensorDescriptor_t grad_output_desc, infiniopTensorDescriptor_t weight_desc,
    infiniopTensorDescriptor_t running_mean_desc, infiniopTensorDescriptor_t running_var_desc,
    infiniopTensorDescriptor_t save_mean_desc, infiniopTensorDescriptor_t save_invstd_desc, double epsilon,
    int training) {
    return op::createFromInfo<Op>(handle, desc_ptr,
                                  {grad_input_desc, grad_weight_desc, grad_bias_desc, input_desc, grad_output_desc,
                                   weight_desc, running_mean_desc, running_var_desc, save_mean_desc, save_invstd_desc},
                                  [&](Op::Info *info) {
        return Op::Info::createEx(info, grad_input_desc, grad_weight_desc, grad_bias_desc, input_desc,
                                  grad_output_desc, weight_desc, running_mean_desc, running_var_desc, save_mean_desc,
                                  save_invstd_desc, epsilon, training);
    });
}

__C infiniStatus_t infiniopGetBatchNormBackwardWorkspaceSize(infiniopBatchNormBackwardDescriptor_t desc,
                                                             size_t *size) {
    return op::getWorkspaceSize<Op>(desc, size);
}

namespace {

// The bytes of a per-channel sum vector of the two-phase entry points: C contiguous statistics values.
infini::Footprint sumFootprint(const Op::Info &info) {
    infini::Footprint footprint;
    if (info.channels == 0) return footprint;
    footprint.empty = false;
    footprint.itemsize = infini::dtypeSize(info.statistic_dtype);
    footprint.last = static_cast<ptrdiff_t>(info.channels * footprint.itemsize) - 1;
    if (info.channels > 1) footprint.stepped.emplace_back(info.channels, 1);
    return footprint;
}

// The checks every run of a descriptor shares, then its calculate. Arguments are in infiniopBatchNormBackwardEx's
// order; those a phase does not take are NULL.
infiniStatus_t run(infiniopBatchNormBackwardDescriptor_t desc, Phase::Kind kind, void *workspace,
                   size_t workspace_size, void *grad_input, void *grad_weight, void *grad_bias, const void *input,
                   const void *grad_output, const void *weight, const void *running_mean, const void *running_var,
                   const void *save_mean, const void *save_invstd, void *sum_grad, void *sum_grad_centered,
                   int64_t total_count, void *stream) {
    return infini::guarded([&] {
        const Op::Descriptor *op_desc;
        INFINI_CHECK(op::descriptorOf<Op>(desc, &op_desc));
        const auto &info = op_desc->info;
        const size_t elements = info.elements();
        const bool reduce = kind == Phase::reduce, elementwise = kind == Phase::elementwise;
        if (kind != Phase::whole && !info.training) return INFINI_STATUS_BAD_PARAM;
        if (elementwise && (total_count < 0 || static_cast<uint64_t>(total_count) < info.batch * info.length)) {
            return INFINI_STATUS_BAD_PARAM;
        }
        auto channelsIf = [&](bool used) { return used ? info.channels : 0; };
        // An absent or unused tensor counts as empty: its pointer is never read.
        INFINI_CHECK(infini::checkRunArgs(workspace, workspace_size, op_desc->workspaceSize(),
                                          {{grad_input, reduce ? 0 : elements},
                                           {grad_weight, channelsIf(info.has_grad_weight && !elementwise)},
                                           {grad_bias, channelsIf(info.has_grad_bias && !elementwise)},
                                           {input, elements},
                                           {grad_output, elements},
                                           {weight, channelsIf(info.has_weight && !reduce)},
                                           {running_mean, channelsIf(info.usesRunning())},
                                           {running_var, channelsIf(info.usesRunning())},
                                           {save_mean, channelsIf(info.has_save)},
                                           {save_invstd, channelsIf(info.has_save)},
                                           {sum_grad, channelsIf(kind != Phase::whole)},
                                           {sum_grad_centered, channelsIf(kind != Phase::whole)}}));
        // Outputs first: whole writes grad_input, grad_weight, grad_bias; reduce the sums (after them);
        // elementwise grad_input alone. The sums are inputs of elementwise.
        if (kind == Phase::whole) {
            INFINI_CHECK(infini::checkNoAliasing(op_desc->footprints, workspace, op_desc->workspaceSize(),
                                                 {grad_input, grad_weight, grad_bias, input, grad_output, weight,
                                                  running_mean, running_var, save_mean, save_invstd},
                                                 3, {{0, 4}})); // grad_input is grad_output
        } else {
            auto at = [&](size_t i) { return infini::footprintAt(op_desc->footprints, i); };
            const infini::Footprint sums = sumFootprint(info);
            if (reduce) {
                INFINI_CHECK(infini::checkNoAliasing({sums, sums, at(1), at(2), at(3), at(4), at(6), at(7), at(8),
                                                      at(9)},
                                                     workspace, op_desc->workspaceSize(),
                                                     {sum_grad, sum_grad_centered, grad_weight, grad_bias, input,
                                                      grad_output, running_mean, running_var, save_mean, save_invstd},
                                                     4));
            } else {
                INFINI_CHECK(infini::checkNoAliasing({at(0), at(3), at(4), at(5), at(6), at(7), at(8), at(9), sums,
                                                      sums},
                                                     workspace, op_desc->workspaceSize(),
                                                     {grad_input, input, grad_output, weight, running_mean,
                                                      running_var, save_mean, save_invstd, sum_grad, sum_grad_centered},
                                                     1, {{0, 2}})); // grad_input is grad_output
            }
        }
        Phase phase = Phase::wholeOf(info);
        phase.kind = kind;
        phase.sum_grad = sum_grad;
        phase.sum_grad_centered = sum_grad_centered;
        if (elementwise) phase.count = static_cast<double>(total_count);
        return op_desc->calculate(phase, workspace, reduce ? nullptr : grad_input,
                                  elementwise || !info.has_grad_weight ? nullptr : grad_weight,
                                  elementwise || !info.has_grad_bias ? nullptr : grad_bias, input, grad_output,
                                  reduce || !info.has_weight ? nullptr : weight, running_mean, running_var, save_mean,
                                  save_invstd, stream);
    });
}

} // namespace

__C infiniStatus_t infiniopBatchNormBackwardEx(infiniopBatchNormBackwardDescriptor_t desc, void *workspace,
                                               size_t workspace_size, void *grad_input, void *grad_weight,
                                               void *grad_bias, const void *input, const void *grad_output,
                                               const void *weight, const void *running_mean,
                                               const void *running_var, const void *save_mean,
                                               const void *save_invstd, void *stream) {
    return run(desc, Phase::whole, workspace, workspace_size, grad_input, grad_weight, grad_bias, input, grad_output,
               weight, running_mean, running_var, save_mean, save_invstd, nullptr, nullptr, 0, stream);
}

__C infiniStatus_t infiniopBatchNormBackwardReduceEx(infiniopBatchNormBackwardDescriptor_t desc, void *workspace,
                                                     size_t workspace_size, void *sum_grad_output,
                                                     void *sum_grad_centered, void *grad_weight, void *grad_bias,
                                                     const void *input, const void *grad_output,
                                                     const void *running_mean, const void *running_var,
                                                     const void *save_mean, const void *save_invstd, void *stream) {
    return run(desc, Phase::reduce, workspace, workspace_size, nullptr, grad_weight, grad_bias, input, grad_output,
               nullptr, running_mean, running_var, save_mean, save_invstd, sum_grad_output, sum_grad_centered, 0,
               stream);
}

__C infiniStatus_t infiniopBatchNormBackwardElementwiseEx(
    infiniopBatchNormBackwardDescriptor_t desc, void *workspace, size_t workspace_size, void *grad_input,
    const void *input, const void *grad_output, const void *weight, const void *running_mean,
    const void *running_var, const void *save_mean, const void *save_invstd, const void *sum_grad_output,
    const void *sum_grad_centered, int64_t total_count, void *stream) {
    return run(desc, Phase::elementwise, workspace, workspace_size, grad_input, nullptr, nullptr, input, grad_output,
               weight, running_mean, running_var, save_mean, save_invstd, const_cast<void *>(sum_grad_output),
               const_cast<void *>(sum_grad_centered), total_count, stream);
}

__C infiniStatus_t infiniopBatchNormBackward(infiniopBatchNormBackwardDescriptor_t desc, void *workspace,
                                             size_t workspace_size, void *grad_input, void *grad_weight,
                                             void *grad_bias, const void *input, const void *grad_output,
                                             const void *weight, const void *running_mean, const void *running_var,
                                             void *stream) {
    return infiniopBatchNormBackwardEx(desc, workspace, workspace_size, grad_input, grad_weight, grad_bias, input,
                                       grad_output, weight, running_mean, running_var, nullptr, nullptr, stream);
}

__C infiniStatus_t infiniopDestroyBatchNormBackwardDescriptor(infiniopBatchNormBackwardDescriptor_t desc) {
    return op::destroyDescriptor<Op>(desc);
}
