// Compiled once per ISA (CPU_ISA = avx512, avx2 or generic, with matching flags); see devices/cpu/simd.h.
#include "rms_norm_backward_simd.h"

#include "devices/cpu/simd.h"

namespace op::rms_norm_backward {
namespace {

using simd::f32v;

template <typename T>
cpu::PairSums sums(size_t n, const T *grad_y, const T *x, const float *w) {
    return simd::chunkedSums(
        n,
        [&](size_t j, f32v &sum_squares, f32v &sum_gwx) {
            f32v xj = simd::load(x + j);
            sum_squares += xj * xj;
            sum_gwx += simd::load(grad_y + j) * simd::load(w + j) * xj;
        },
        [&](size_t j, float &sum_squares, float &sum_gwx) {
            float xj = cpu::toFloat(x[j]);
            sum_squares += xj * xj;
            sum_gwx += cpu::toFloat(grad_y[j]) * w[j] * xj;
        });
}

template <typename T, bool kAccumulate>
void applyRow(size_t n, float r, float x_coef, const T *grad_y, const T *x, const float *w, T *grad_x,
              float *partial) {
    const f32v r_v = simd::splat(r), x_coef_v = simd::splat(x_coef);
    size_t j = 0;
    for (; j + simd::kWidth <= n; j += simd::kWidth) {
        f32v gy = simd::load(grad_y + j), xj = simd::load(x + j);
        if constexpr (kAccumulate) simd::store(partial + j, simd::load(partial + j) + gy * xj * r_v);
        simd::store(grad_x + j, r_v * gy * simd::load(w + j) - x_coef_v * xj);
    }
    for (; j < n; ++j) {
        float gy = cpu::toFloat(grad_y[j]), xj = cpu::toFloat(x[j]);
        if constexpr (kAccumulate) partial[j] += gy * xj * r;
        grad_x[j] = cpu::fromFloat<T>(r * gy * w[j] - x_coef * xj);
    }
}

template <typename T>
void apply(size_t n, float r, float x_coef, const T *grad_y, const T *x, const float *w, T *grad_x, float *partial) {
    if (partial != nullptr) {
        applyRow<T, true>(n, r, x_coef, grad_y, x, w, grad_x, partial);
    } else {
        applyRow<T, false>(n, r, x_coef, grad_y, x, w, grad_x, nullptr);
    }
}

template <typename T>
const Kernels<T> &table() {
    static const Kernels<T> table{sums<T>, apply<T>};
    return table;
}

} // namespace
} // namespace op::rms_norm_backward

// This ISA's tables: CPU_ISA names a cpu::Isa value.
namespace cpu {
using op::rms_norm_backward::Kernels;
template <>
const Kernels<float> &isaTable<Isa::CPU_ISA, Kernels<float>>() {
    return op::rms_norm_backward::table<float>();
}
template <>
const Kernels<f16_t> &isaTable<Isa::CPU_ISA, Kernels<f16_t>>() {
    return op::rms_norm_backward::table<f16_t>();
}
template <>
const Kernels<bf16_t> &isaTable<Isa::CPU_ISA, Kernels<bf16_t>>() {
    return op::rms_norm_backward::table<bf16_t>();
}
} // namespace cpu
