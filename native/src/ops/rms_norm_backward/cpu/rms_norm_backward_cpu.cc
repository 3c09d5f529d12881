// RMSNorm backward on the CPU. Per row: one pass reduces sum(x^2) and sum(grad_y*w*x), a second writes grad_x
// while the row is still in cache and adds grad_y*x*r into its row block's grad_w partial; the partials are
// summed in block order at the end (devices/cpu/row_driver.h has the schedule).
#include "../rms_norm_backward.h"

#include "devices/cpu/row_driver.h"
#include "devices/cpu/types.h"
#include "devices/cpu/workspace.h"
#include "rms_norm_backward_simd.h"

#include <cmath>
#include <tuple>
#include <type_traits>
#include <utility>

namespace op::rms_norm_backward {
namespace {

// F64 is for reference-grade use: plain loops, everything in F64, the same schedule as the fast types.
cpu::PairSums sumsF64(size_t n, const double *grad_y, const double *x, const double *w) {
    cpu::PairSums total;
    for (size_t j = 0; j < n; ++j) {
        total.first += x[j] * x[j];
        total.second += grad_y[j] * w[j] * x[j];
    }
    return total;
}

cpu::PairSums applyF64(size_t n, double r, double x_coef, const double *grad_y, const double *x, const double *w,
                       double *grad_x, cpu::GradientTerms<double, double> grad_w_terms, bool starts,
                       const cpu::RowHints<double> &hints) {
    double *partial = grad_w_terms.partial; // an F64 gradient is never rounded: no `gradient`
    for (size_t j = 0; j < n; ++j) {
        const double gy = grad_y[j], xj = x[j];
        if (partial != nullptr) partial[j] = (starts ? 0.0 : partial[j]) + gy * xj * r;
        grad_x[j] = r * gy * w[j] - x_coef * xj;
    }
    return hints.next_a == nullptr ? cpu::PairSums{} : sumsF64(n, hints.next_a, hints.next_b, w);
}

void blockSumsF64(size_t rows, size_t n, const double *grad_y, ptrdiff_t grad_y_stride, const double *x,
                  ptrdiff_t x_stride, const double *w, cpu::PairSums *totals) {
    for (size_t i = 0; i < rows; ++i) {
        const ptrdiff_t row = static_cast<ptrdiff_t>(i);
        totals[i] = sumsF64(n, grad_y + row * grad_y_stride, x + row * x_stride, w);
    }
}

void blockApplyF64(size_t rows, size_t n, const double *r, const double *x_coef, const double *grad_y,
                   ptrdiff_t grad_y_stride, const double *x, ptrdiff_t x_stride, const double *w, double *grad_x,
                   ptrdiff_t grad_x_stride, double *partial, bool starts, bool) { // F64 streams nothing
    for (size_t i = 0; i < rows; ++i) {
        const ptrdiff_t row = static_cast<ptrdiff_t>(i);
        applyF64(n, r[i], x_coef[i], grad_y + row * grad_y_stride, x + row * x_stride, w,
                 grad_x + row * grad_x_stride, {partial, nullptr}, starts && i == 0, cpu::RowHints<double>{false});
    }
}

const Kernels<double, double> kF64Kernels{sumsF64, applyF64, blockSumsF64, blockApplyF64};

class CpuDescriptor final : public Descriptor {
  public:
    CpuDescriptor(int device_id, const Info &info)
        : Descriptor(INFINI_DEVICE_CPU, device_id, info),
          plan_(info.rows, info.dim, infini::dtypeSize(info.dtype),
                info.grad_y.uniform() && info.x.uniform() && info.grad_x.uniform(), cpu::kShortStreamedRowBytes),
          space_(parameterSpaceOf(info, plan_)), workspace_(workspaceOf(info, plan_, space_)) {}

    size_t workspaceSize() const override { return workspace_.value(); }
    bool workspaceOverflows() const override { return workspace_.overflowed(); }

    infiniStatus_t calculate(void *workspace, void *grad_x, void *grad_w, const void *grad_y, const void *x,
                             const void *w, const void *rstd, void *) const override {
        cpu::withDataAndParameterTypes(info.dtype, info.weight_dtype, [&](auto data_tag, auto parameter_tag) {
            using T = decltype(data_tag);
            using W = decltype(parameter_tag);
            run(cpu::alignedWorkspace(workspace), static_cast<T *>(grad_x), static_cast<W *>(grad_w), static_cast<const T *>(grad_y),
                static_cast<const T *>(x), static_cast<const W *>(w), rstd);
        });
        return INFINI_STATUS_SUCCESS;
    }

  private:
    // Which parameter vectors take workspace, from the layout alone (so that the size and the run agree): w in the
    // compute type unless the kernels read it as stored, and the row blocks' grad_w partials unless grad_w takes
    // them itself (cpu::BlockPartials).
    struct ParameterSpace {
        bool w_copy, partials;
    };
    static ParameterSpace parameterSpaceOf(const Info &info, const cpu::RowPlan &plan) {
        const bool of_compute_type = info.weight_dtype == cpu::computeDtypeOf(info.dtype);
        const bool as_stored = cpu::readAsStored(true, info.w_stride, of_compute_type, plan.readsWeightAsStored());
        const bool rounded_straight = !of_compute_type && as_stored && info.rows == 1;
        return {!as_stored, info.has_grad_w && cpu::partialsInScratch(plan.blocks.count, info.grad_w_stride,
                                                                      of_compute_type, rounded_straight)};
    }

    // Chunk sums, then the parameter space: w, then one grad_w partial of length D per row block. No rows: none
    // (the run only zeroes grad_w).
    static infini::CheckedSize workspaceOf(const Info &info, const cpu::RowPlan &plan, const ParameterSpace &space) {
        if (info.rows == 0) return 0;
        const size_t compute = infini::dtypeSize(cpu::computeDtypeOf(info.dtype));
        return cpu::withAlignmentSlack(infini::CheckedSize(plan.scratchBytes()) +
                                       (infini::CheckedSize(space.w_copy ? 1 : 0) +
                                        infini::CheckedSize(space.partials ? plan.blocks.count : 0)) *
                                           info.dim * compute);
    }

    template <typename T, typename W>
    void run(void *workspace, T *grad_x, W *grad_w, const T *grad_y, const T *x, const W *w,
             const void *rstd) const {
        using C = cpu::ComputeOf<T>;
        const size_t dim = info.dim;
        if (info.rows == 0) { // nothing to read: grad_w of no rows is zero
            if (info.has_grad_w) cpu::zeroVector(grad_w, dim, info.grad_w_stride);
            return;
        }
        auto *chunk_sums = static_cast<cpu::PairSums *>(workspace);
        C *w_copy = reinterpret_cast<C *>(static_cast<char *>(workspace) + plan_.scratchBytes());
        // Saved rstd is F32, or F64 for F64 data (the Ex dtype rule).
        auto saved_rstd = [&](size_t row) -> double {
            return static_cast<const C *>(rstd)[info.rstd.offset(row)];
        };
        // r = 1/sqrt(mean(x^2) + eps); grad_x = r*grad_y*w - r^3 * sum(grad_y*w*x)/D * x
        auto coefficientsOf = [&](size_t row, const cpu::PairSums &total) {
            const double r = info.has_rstd ? saved_rstd(row)
                                           : 1.0 / std::sqrt(total.first / static_cast<double>(dim) + info.epsilon);
            return std::pair<C, C>{static_cast<C>(r), static_cast<C>(r * r * r * total.second / static_cast<double>(dim))};
        };
        const bool stream =
            plan_.streams({grad_x}, grad_y, sizeof(T), stridesMultipleOf(cpu::kStreamElements, {info.grad_x}));
        cpu::withKernelVector(dim, w, info.w_stride, plan_.readsWeightAsStored(), w_copy, [&](const auto *w_k) {
            using K = std::remove_const_t<std::remove_pointer_t<decltype(w_k)>>;
            const cpu::BlockPartials<C, K> block_partials(plan_.blocks.count, dim, info.has_grad_w ? grad_w : nullptr,
                                                          info.grad_w_stride, info.rows == 1,
                                                          w_copy + (space_.w_copy ? dim : 0));
            const Kernels<T, K> &kernels = cpu::kernelsFor<Kernels, T, K>(kF64Kernels);
            const bool finished = cpu::runRows(
                plan_, chunk_sums,
                [&](size_t row, size_t begin, size_t n) {
                    return kernels.sums(n, grad_y + info.grad_y.offset(row) + begin, x + info.x.offset(row) + begin,
                                        w_k + begin);
                },
                [&](size_t block, size_t row, const cpu::PairSums &total, size_t begin, size_t n, bool reduce_next) {
                    const auto [r, x_coef] = coefficientsOf(row, total);
                    return kernels.apply(n, r, x_coef, grad_y + info.grad_y.offset(row) + begin,
                                         x + info.x.offset(row) + begin, w_k + begin,
                                         grad_x + info.grad_x.offset(row) + begin, block_partials.at(block, begin),
                                         row == plan_.blocks.begin(block),
                                         plan_.hints(stream, row, begin, reduce_next, grad_y, info.grad_y, x, info.x));
                },
                [&](size_t begin, size_t n) { block_partials.finishColumns(grad_w, info.grad_w_stride, begin, n); },
                [&](size_t block, size_t first, size_t end) {
                    constexpr size_t kRowsPerCall = 16; // their inputs stay in L1 between the two calls
                    cpu::PairSums totals[kRowsPerCall];
                    C r[kRowsPerCall], x_coef[kRowsPerCall];
                    // Several rows: the terms go to partials, never rounded straight (BlockPartials).
                    C *partial = block_partials.at(block, 0).partial;
                    for (size_t row = first; row < end; row += kRowsPerCall) {
                        const size_t count = end - row < kRowsPerCall ? end - row : kRowsPerCall;
                        const T *grad_y_rows = grad_y + info.grad_y.offset(row), *x_rows = x + info.x.offset(row);
                        kernels.block_sums(count, dim, grad_y_rows, info.grad_y.stride(), x_rows, info.x.stride(), w_k,
                                           totals);
                        for (size_t i = 0; i < count; ++i) std::tie(r[i], x_coef[i]) = coefficientsOf(row + i, totals[i]);
                        kernels.block_apply(count, dim, r, x_coef, grad_y_rows, info.grad_y.stride(), x_rows,
                                            info.x.stride(), w_k, grad_x + info.grad_x.offset(row),
                                            info.grad_x.stride(), partial, row == first, stream);
                    }
                });
            if (!finished) block_partials.finish(grad_w, info.grad_w_stride);
        });
    }

    cpu::RowPlan plan_;
    ParameterSpace space_;
    infini::CheckedSize workspace_;
};

} // namespace

infiniStatus_t Backends::cpu(const Info &info, int device_id, Descriptor **desc) {
    *desc = new CpuDescriptor(device_id, info);
    return INFINI_STATUS_SUCCESS;
}

} // namespace op::rms_norm_backward
