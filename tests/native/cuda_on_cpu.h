// The CUDA that scripts/gpu_variants/row_backward_variants.cu uses, on the CPU (tests/native/cuda_emulation), and
// a stand-in for the library's C API: a float64 RMSNorm backward, enqueued like a kernel. So the program's kernels
// and checks run without a GPU (tests/test_gpu_variants_script.py). The test rewrites the .cu for it: launches
// `k<<<g, b, s, st>>>(a)` become `emu::launch(k, g, b, s, st, a)`, and the dynamic shared array a call of
// emu::dynamicShared.
#pragma once
#include "cuda_emulation/emulation.h"
#include "infiniop.h"
#include "infinirt.h"

// ---------------------------------------------------------------------------------------------------------------
// The library's C API: the seed RMSNorm backward in float64, rounded to the data's 16 bits.
struct InfiniopTensorDescriptor {
    size_t rows, dim;
    infiniDtype_t dtype;
};
struct InfiniopDescriptor {
    size_t rows, dim;
    infiniDtype_t dtype;
};
struct InfiniopHandle {};

namespace emu {
inline double value(infiniDtype_t t, uint16_t b) {
    return t == INFINI_DTYPE_BF16 ? __uint_as_float(uint32_t(b) << 16) : __half2float(__ushort_as_half(b));
}
inline uint16_t bits(infiniDtype_t t, double v) {
    return t == INFINI_DTYPE_BF16 ? __bfloat16_as_ushort(__float2bfloat16_rn(float(v)))
                                  : __half_as_ushort(__float2half_rn(float(v)));
}
} // namespace emu

extern "C" {
inline infiniStatus_t infinirtSetDevice(infiniDevice_t, int) { return INFINI_STATUS_SUCCESS; }
inline infiniStatus_t infiniopCreateHandle(infiniopHandle_t *h) {
    return *h = new InfiniopHandle, INFINI_STATUS_SUCCESS;
}
inline infiniStatus_t infiniopDestroyHandle(infiniopHandle_t h) { return delete h, INFINI_STATUS_SUCCESS; }
inline infiniStatus_t infiniopCreateTensorDescriptor(infiniopTensorDescriptor_t *d, size_t ndim, const size_t *shape,
                                                     const ptrdiff_t *, infiniDtype_t dtype) {
    return *d = new InfiniopTensorDescriptor{ndim == 2 ? shape[0] : 1, shape[ndim - 1], dtype}, INFINI_STATUS_SUCCESS;
}
inline infiniStatus_t infiniopDestroyTensorDescriptor(infiniopTensorDescriptor_t d) {
    return delete d, INFINI_STATUS_SUCCESS;
}
inline infiniStatus_t infiniopCreateRMSNormBackwardDescriptor(infiniopHandle_t,
                                                              infiniopRMSNormBackwardDescriptor_t *desc,
                                                              infiniopTensorDescriptor_t grad_x,
                                                              infiniopTensorDescriptor_t, infiniopTensorDescriptor_t,
                                                              infiniopTensorDescriptor_t, infiniopTensorDescriptor_t) {
    return *desc = new InfiniopDescriptor{grad_x->rows, grad_x->dim, grad_x->dtype}, INFINI_STATUS_SUCCESS;
}
inline infiniStatus_t infiniopGetRMSNormBackwardWorkspaceSize(infiniopRMSNormBackwardDescriptor_t, size_t *size) {
    return *size = 4096, INFINI_STATUS_SUCCESS;
}
inline infiniStatus_t infiniopRMSNormBackward(infiniopRMSNormBackwardDescriptor_t d, void *, size_t, void *grad_x,
                                              void *grad_w, const void *grad_y, const void *x, const void *w, void *) {
    const InfiniopDescriptor k = *d;
    emu::enqueue([=] {
        auto *gx = static_cast<uint16_t *>(grad_x), *gw = static_cast<uint16_t *>(grad_w);
        auto *gy = static_cast<const uint16_t *>(grad_y), *xs = static_cast<const uint16_t *>(x);
        auto *ws = static_cast<const uint16_t *>(w);
        auto v = [&](uint16_t b) { return emu::value(k.dtype, b); };
        std::vector<double> acc(k.dim, 0.0);
        for (size_t r = 0; r < k.rows; ++r) {
            const size_t o = r * k.dim;
            double s1 = 0, s2 = 0;
            for (size_t j = 0; j < k.dim; ++j)
                s1 += v(xs[o + j]) * v(xs[o + j]), s2 += v(gy[o + j]) * v(ws[j]) * v(xs[o + j]);
            const double rs = 1 / std::sqrt(s1 / k.dim), c = rs * rs * rs * s2 / k.dim;
            for (size_t j = 0; j < k.dim; ++j) {
                gx[o + j] = emu::bits(k.dtype, rs * v(gy[o + j]) * v(ws[j]) - c * v(xs[o + j]));
                acc[j] += v(gy[o + j]) * v(xs[o + j]) * rs;
            }
        }
        for (size_t j = 0; j < k.dim; ++j) gw[j] = emu::bits(k.dtype, acc[j]);
    });
    return INFINI_STATUS_SUCCESS;
}
}
