// LayerNorm backward: the shape, dtype and stride rules (checked once, for every device) and the layout kept.
#ifndef INFINIOP_SRC_OPS_LAYER_NORM_BACKWARD_INFO_H
#define INFINIOP_SRC_OPS_LAYER_NORM_BACKWARD_INFO_H

#include "common/layout.h"
#include "common/status.h"
#include "ops/layer_norm_layout.h"
#include "ops/rows.h"

namespace op::layer_norm_backward {

struct Info {
    // Which run takes the descriptor: xhat and std (the seed's), or input, mean and rstd (PyTorch's and CANN's).
    enum class Form { xhat, from_input };

    Form form;
    infiniDtype_t dtype;           // grad_input, grad_output, row_input
    infiniDtype_t parameter_dtype; // weight, grad_weight, grad_bias; the std of the xhat form
    size_t rows;                   // all leading dims flattened
    size_t dim;                    // L, the normalized length (all normalized dims flattened)
    RowLayout grad_input, grad_output;
    RowLayout row_input;           // xhat (input_standardization), or the from-input form's input
    RowLayout row_scale;           // one element per row: std (xhat form) or rstd (from-input form)
    RowLayout row_mean;            // one element per row: the from-input form's mean (depth 0 in the xhat form)
    ptrdiff_t grad_weight_stride, grad_bias_stride, weight_stride;
    bool has_grad_weight, has_grad_bias, has_weight;

    // infiniopCreateLayerNormBackwardDescriptor: one dtype of F16/F32/BF16, rank 2 or 3, every tensor given.
    static infiniStatus_t create(Info *info, infini::Tensor grad_input, infini::Tensor grad_weight,
                                 infini::Tensor grad_bias, infini::Tensor grad_output, infini::Tensor weight,
                                 infini::Tensor input_standardization, infini::Tensor input_std_deviation) {
        INFINI_CHECK(infini::checkSameNormFloat(
            {grad_input, grad_weight, grad_bias, grad_output, weight, input_standardization, input_std_deviation}));
        size_t ndim = grad_input->ndim();
        if ((ndim != 2 && ndim != 3) || input_std_deviation->ndim() != ndim - 1) return INFINI_STATUS_BAD_TENSOR_SHAPE;
        return createEx(info, grad_input, grad_weight, grad_bias, grad_output, weight, input_standardization,
                        input_std_deviation);
    }

    // infiniopCreateLayerNormBackwardDescriptorEx: grad_weight, grad_bias and weight may be NULL.
    static infiniStatus_t createEx(Info *info, infini::Tensor grad_input, infini::Tensor grad_weight,
                                   infini::Tensor grad_bias, infini::Tensor grad_output, infini::Tensor weight,
                                   infini::Tensor input_standardization, infini::Tensor input_std_deviation) {
        if (grad_input == nullptr || grad_output == nullptr || input_standardization == nullptr ||
            input_std_deviation == nullptr) {
            return INFINI_STATUS_NULL_POINTER;
        }
        INFINI_CHECK(infini::checkNormDtypesEx({grad_input, grad_output, input_standardization},
                                               {weight, grad_weight, grad_bias, input_std_deviation}, {}));
        return createRows(info, Form::xhat, grad_input, grad_weight, grad_bias, grad_output, weight,
                          input_standardization, nullptr, input_std_deviation);
    }

    // infiniopCreateLayerNormBackwardFromInputDescriptorEx: the Ex rules with input for xhat, and mean and rstd
    // (statistics: F32, F64 for F64 data) for std.
    static infiniStatus_t createFromInput(Info *info, infini::Tensor grad_input, infini::Tensor grad_weight,
                                          infini::Tensor grad_bias, infini::Tensor grad_output, infini::Tensor weight,
                                          infini::Tensor input, infini::Tensor mean, infini::Tensor rstd) {
        if (grad_input == nullptr || grad_output == nullptr || input == nullptr || mean == nullptr ||
            rstd == nullptr) {
            return INFINI_STATUS_NULL_POINTER;
        }
        INFINI_CHECK(infini::checkNormDtypesEx({grad_input, grad_output, input}, {weight, grad_weight, grad_bias},
                                               {mean, rstd}));
        return createRows(info, Form::from_input, grad_input, grad_weight, grad_bias, grad_output, weight, input,
                          mean, rstd);
    }

  private:
    // The shape and stride rules both Ex forms share, after their NULL and dtype checks. row_scale (std or rstd)
    // and mean (NULL in the xhat form) hold one value per row; row_scale's rank names the leading dims.
    static infiniStatus_t createRows(Info *info, Form form, infini::Tensor grad_input, infini::Tensor grad_weight,
                                     infini::Tensor grad_bias, infini::Tensor grad_output, infini::Tensor weight,
                                     infini::Tensor row_input, infini::Tensor mean, infini::Tensor row_scale) {
        const size_t leading = (mean != nullptr ? mean : row_scale)->ndim();
        LayerNormLayout layout;
        ptrdiff_t vector_strides[3];
        INFINI_CHECK(LayerNormLayout::check(&layout, leading, {{grad_input, true}, {grad_output, false}, {row_input, false}},
                                            {{weight, false}, {grad_weight, true}, {grad_bias, true}},
                                            {{mean, false}, {row_scale, false}}, vector_strides));
        const ptrdiff_t weight_stride = vector_strides[0], grad_weight_stride = vector_strides[1],
                        grad_bias_stride = vector_strides[2];
        *info = Info{form,
                     grad_input->dtype,
                     form == Form::xhat
                         ? infini::dtypeOfFirst({weight, grad_weight, grad_bias, row_scale}, grad_input->dtype)
                         : infini::dtypeOfFirst({weight, grad_weight, grad_bias}, grad_input->dtype),
                     layout.rows,
                     layout.dim,
                     RowLayout::of(grad_input, leading),
                     RowLayout::of(grad_output, leading),
                     RowLayout::of(row_input, leading),
                     RowLayout::of(row_scale, leading),
                     mean == nullptr ? RowLayout{} : RowLayout::of(mean, leading),
                     grad_weight_stride,
                     grad_bias_stride,
                     weight_stride,
                     grad_weight != nullptr,
                     grad_bias != nullptr,
                     weight != nullptr};
        return INFINI_STATUS_SUCCESS;
    }
};

} // namespace op::layer_norm_backward

#endif
