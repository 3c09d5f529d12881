// BatchNorm forward: the shape, dtype and stride rules (checked once, for every device) and the layout kept.
#ifndef INFINIOP_SRC_OPS_BATCH_NORM_INFO_H
#define INFINIOP_SRC_OPS_BATCH_NORM_INFO_H

#include "common/layout.h"
#include "common/status.h"
#include "ops/batch_norm_layout.h"

#include <cmath>

namespace op::batch_norm {

using Layout = BatchNormLayout;

struct Info {
    infiniDtype_t dtype;           // y, x
    infiniDtype_t parameter_dtype; // weight, bias, running_mean, running_var
    infiniDtype_t statistic_dtype; // save_mean, save_invstd
    size_t batch, channels, length; // (N, C, L)
    Layout layout;
    ptrdiff_t save_mean_stride, save_invstd_stride, running_mean_stride, running_var_stride, weight_stride,
        bias_stride;
    bool has_save_mean, has_save_invstd, has_running, has_weight, has_bias;
    bool training;
    double momentum, epsilon;

    size_t elements() const { return batch * channels * length; }

    // infiniopCreateBatchNormDescriptor: the documentation's rules (one dtype of F16/F32/BF16, rank 3, fully
    // contiguous, every tensor given), training mode.
    static infiniStatus_t create(Info *info, infini::Tensor output, infini::Tensor running_mean,
                                 infini::Tensor running_var, infini::Tensor input, infini::Tensor weight,
                                 infini::Tensor bias, float momentum, float eps) {
        for (infini::Tensor t : {output, running_mean, running_var, input, weight, bias}) {
            if (t == nullptr) return INFINI_STATUS_NULL_POINTER;
        }
        INFINI_CHECK(infini::checkSameNormFloat({output, running_mean, running_var, input, weight, bias}));
        if (output->ndim() != 3) return INFINI_STATUS_BAD_TENSOR_SHAPE;
        INFINI_CHECK(createEx(info, output, nullptr, nullptr, running_mean, running_var, input, weight, bias, 1,
                              momentum, eps));
        return info->layout == Layout::channels_first ? INFINI_STATUS_SUCCESS : INFINI_STATUS_BAD_TENSOR_STRIDES;
    }

    // infiniopCreateBatchNormDescriptorEx (rules in the public header), checked in the order NULL / parameters,
    // dtypes, shapes, strides: the backward Ex's order.
    static infiniStatus_t createEx(Info *info, infini::Tensor y, infini::Tensor save_mean, infini::Tensor save_invstd,
                                   infini::Tensor running_mean, infini::Tensor running_var, infini::Tensor x,
                                   infini::Tensor weight, infini::Tensor bias, int training, double momentum,
                                   double eps) {
        if (y == nullptr || x == nullptr) return INFINI_STATUS_NULL_POINTER;
        if (!std::isfinite(eps) || eps < 0.0 || !std::isfinite(momentum)) return INFINI_STATUS_BAD_PARAM;
        const bool has_running = running_mean != nullptr;
        if (has_running != (running_var != nullptr) || (training == 0 && !has_running)) {
            return INFINI_STATUS_NULL_POINTER;
        }
        if (training == 0 && (save_mean != nullptr || save_invstd != nullptr)) return INFINI_STATUS_BAD_PARAM;
        INFINI_CHECK(infini::checkNormDtypesEx({y, x}, {weight, bias, running_mean, running_var},
                                               {save_mean, save_invstd}));

        if (!BatchNormShape::rankOk(y) || !infini::sameShape(x, y)) return INFINI_STATUS_BAD_TENSOR_SHAPE;
        const size_t channels = y->shape[1];
        for (infini::Tensor vector : {save_mean, save_invstd, running_mean, running_var, weight, bias}) {
            if (vector != nullptr && !infini::isVector(vector, channels)) return INFINI_STATUS_BAD_TENSOR_SHAPE;
        }
        const size_t per_channel = y->shape[0] * infini::countOf(y, 2, y->ndim());
        // PyTorch's unbiased running variance divides by M - 1 (it raises there too).
        if (training != 0 && has_running && per_channel == 1) return INFINI_STATUS_BAD_TENSOR_SHAPE;

        Layout layout;
        if (!BatchNormShape::sharedLayout({y, x}, &layout)) return INFINI_STATUS_BAD_TENSOR_STRIDES;
        // Written per channel: no two channels may share an element (running stats in eval are only read).
        for (infini::Tensor vector : {save_mean, save_invstd, training != 0 ? running_mean : nullptr,
                                      training != 0 ? running_var : nullptr}) {
            if (vector != nullptr && !infini::nonOverlapping(vector)) return INFINI_STATUS_BAD_TENSOR_STRIDES;
        }

        const infiniDtype_t dtype = y->dtype;
        auto strideOf = [](infini::Tensor vector) { return vector != nullptr ? vector->strides[0] : 0; };
        *info = Info{dtype,
                     infini::dtypeOfFirst({weight, bias, running_mean, running_var}, dtype),
                     infini::statisticsDtypeOf(dtype),
                     y->shape[0],
                     channels,
                     infini::countOf(y, 2, y->ndim()),
                     layout,
                     strideOf(save_mean),
                     strideOf(save_invstd),
                     strideOf(running_mean),
                     strideOf(running_var),
                     strideOf(weight),
                     strideOf(bias),
                     save_mean != nullptr,
                     save_invstd != nullptr,
                     has_running,
                     weight != nullptr,
                     bias != nullptr,
                     training != 0,
                     momentum,
                     eps};
        return INFINI_STATUS_SUCCESS;
    }
};

} // namespace op::batch_norm

#endif
