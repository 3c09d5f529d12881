// LayerNorm forward: the shape, dtype and stride rules (checked once, for every device) and the layout kept.
#ifndef INFINIOP_SRC_OPS_LAYER_NORM_INFO_H
#define INFINIOP_SRC_OPS_LAYER_NORM_INFO_H

#include "common/layout.h"
#include "common/status.h"
#include "ops/layer_norm_layout.h"
#include "ops/rows.h"

#include <cmath>

namespace op::layer_norm {

struct Info {
    // Which run takes the descriptor and which statistics it writes: xhat and std (the seed's, what the seed
    // backward takes), or mean and rstd (the Ex form's, what the from-input backward takes).
    enum class Form { xhat, statistics };

    Form form;
    infiniDtype_t dtype;           // y, x, xhat
    infiniDtype_t parameter_dtype; // w, b; the std of the xhat form
    size_t rows;                   // all leading dims flattened
    size_t dim;                    // L, the normalized length (all normalized dims flattened)
    RowLayout y, x;
    RowLayout xhat;                // the xhat form's input_standardization, when has_xhat
    RowLayout first_statistic;     // one element per row: std (xhat form) or mean, when has_first_statistic
    RowLayout rstd;                // one element per row: the statistics form's rstd, when has_rstd
    ptrdiff_t w_stride, b_stride;
    bool has_w, has_b, has_xhat, has_first_statistic, has_rstd;
    double epsilon;

    // infiniopCreateLayerNormDescriptor: upstream's ranks (2 or 3, weight a vector, std of the leading shape),
    // weight required; the Ex dtype rules with std among the parameters.
    static infiniStatus_t create(Info *info, infini::Tensor output, infini::Tensor input_standardization,
                                 infini::Tensor input_std_deviation, infini::Tensor input, infini::Tensor weight,
                                 infini::Tensor bias, float eps) {
        if (output == nullptr || input == nullptr || weight == nullptr) return INFINI_STATUS_NULL_POINTER;
        INFINI_CHECK(infini::checkNormDtypesEx({output, input_standardization, input},
                                               {weight, bias, input_std_deviation}, {}));
        if ((output->ndim() != 2 && output->ndim() != 3) || weight->ndim() != 1) {
            return INFINI_STATUS_BAD_TENSOR_SHAPE;
        }
        return createForm(info, Form::xhat, output, input_standardization, input_std_deviation, nullptr, input,
                          weight, bias, eps);
    }

    // infiniopCreateLayerNormDescriptorEx: mean, rstd, w and b may be NULL (see the public header).
    static infiniStatus_t createEx(Info *info, infini::Tensor y, infini::Tensor mean, infini::Tensor rstd,
                                   infini::Tensor x, infini::Tensor w, infini::Tensor b, double eps) {
        if (y == nullptr || x == nullptr) return INFINI_STATUS_NULL_POINTER;
        INFINI_CHECK(infini::checkNormDtypesEx({y, x}, {w, b}, {mean, rstd}));
        return createForm(info, Form::statistics, y, nullptr, mean, rstd, x, w, b, eps);
    }

  private:
    // The rules both forms share, after their NULL and dtype checks. first_statistic: std or mean; rstd: the
    // statistics form's (NULL in the xhat form).
    static infiniStatus_t createForm(Info *info, Form form, infini::Tensor y, infini::Tensor xhat,
                                     infini::Tensor first_statistic, infini::Tensor rstd, infini::Tensor x,
                                     infini::Tensor w, infini::Tensor b, double eps) {
        if (!std::isfinite(eps) || eps < 0.0) return INFINI_STATUS_BAD_PARAM;
        const size_t ndim = y->ndim();
        // What names the normalized dims: a parameter's rank, else a statistic's (the leading dims), else 1.
        const infini::Tensor parameter = w != nullptr ? w : b;
        const infini::Tensor statistic = first_statistic != nullptr ? first_statistic : rstd;
        size_t leading = ndim - 1;
        if (parameter != nullptr) {
            if (parameter->ndim() < 1 || parameter->ndim() > ndim) return INFINI_STATUS_BAD_TENSOR_SHAPE;
            leading = ndim - parameter->ndim();
        } else if (statistic != nullptr) {
            leading = statistic->ndim();
        }
        LayerNormLayout layout;
        ptrdiff_t vector_strides[2];
        INFINI_CHECK(LayerNormLayout::check(&layout, leading, {{y, true}, {xhat, true}, {x, false}},
                                            {{w, false}, {b, false}}, {{first_statistic, true}, {rstd, true}},
                                            vector_strides));
        auto rowsOf = [&](infini::Tensor t) { return t != nullptr ? RowLayout::of(t, leading) : RowLayout{}; };
        *info = Info{form,
                     y->dtype,
                     infini::dtypeOfFirst({w, b, form == Form::xhat ? first_statistic : nullptr}, y->dtype),
                     layout.rows,
                     layout.dim,
                     RowLayout::of(y, leading),
                     RowLayout::of(x, leading),
                     rowsOf(xhat),
                     rowsOf(first_statistic),
                     rowsOf(rstd),
                     vector_strides[0],
                     vector_strides[1],
                     w != nullptr,
                     b != nullptr,
                     xhat != nullptr,
                     first_statistic != nullptr,
                     rstd != nullptr,
                     eps};
        return INFINI_STATUS_SUCCESS;
    }
};

} // namespace op::layer_norm

#endif
