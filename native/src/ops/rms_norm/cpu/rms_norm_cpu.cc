// RMSNorm forward on the CPU: per row, one pass reduces sum(x^2), a second writes y = x * r * w while the row is
// still in cache (and, for long rows, reduces the next row as it goes), so x is read from DRAM once and y written
// once. The schedules are the backward's (devices/cpu/row_driver.h); there are no weight gradients to sum.
#include "../rms_norm.h"

#include "devices/cpu/row_driver.h"
#include "devices/cpu/types.h"
#include "devices/cpu/workspace.h"
#include "rms_norm_simd.h"

#include <cmath>
#include <type_traits>

namespace op::rms_norm {
namespace {

// F64 is for reference-grade use: plain loops, everything in F64, the same schedule as the fast types.
cpu::PairSums sumsF64(size_t n, const double *x) {
    cpu::PairSums total;
    for (size_t j = 0; j < n; ++j) total.first += x[j] * x[j];
    return total;
}

cpu::PairSums applyF64(size_t n, double r, const double *x, const double *w, double *y,
                       const cpu::RowHints<double> &hints) {
    for (size_t j = 0; j < n; ++j) y[j] = x[j] * r * w[j];
    return hints.next_a == nullptr ? cpu::PairSums{} : sumsF64(n, hints.next_a);
}

void blockSumsF64(size_t rows, size_t n, const double *x, ptrdiff_t x_stride, cpu::PairSums *totals) {
    for (size_t r = 0; r < rows; ++r) totals[r] = sumsF64(n, x + static_cast<ptrdiff_t>(r) * x_stride);
}

void blockApplyF64(size_t rows, size_t n, const double *r, const double *x, ptrdiff_t x_stride, const double *w,
                   double *y, ptrdiff_t y_stride, bool) {
    for (size_t i = 0; i < rows; ++i) {
        const ptrdiff_t row = static_cast<ptrdiff_t>(i);
        applyF64(n, r[i], x + row * x_stride, w, y + row * y_stride, cpu::RowHints<double>{false});
    }
}

const Kernels<double, double> kF64Kernels{sumsF64, applyF64, blockSumsF64, blockApplyF64, nullptr};

// The forward's plan: the default limits, but the forwards' one for streamed short rows (16-bit rows of 256 too).
// 16-bit rows that do not reduce the next row inside the apply pass reduce it before (RowPlan::reduce_next_first).
// 2026-12-07, AVX-512 Xeon, 2 threads, A/B in alternating processes, same bits, back to back / each call after a
// 256 MiB copy: BF16 16384x1024 0.91-0.93 / 0.95-0.99 of the time, 65536x512 0.88-0.89 / 0.95-0.98, 1024x2048
// 0.90-0.97 / 0.96-1.06, F16 8192x1536 0.91-0.96 / 1.00-1.02. Not F32 rows of 128 from DRAM (1.04-1.09x as long,
// 2026-12-07), nor RMSNorm's backward: F32 16384x512 0.96-0.98 / 0.97, but BF16 16384x1024 0.96-0.99 / 0.99-1.01,
// F16 8192x1536 0.94-0.97 / 1.04-1.07, cached F32 2048x512 and BF16 256x4096 0.98-1.05 / 1.01-1.06.
cpu::RowPlan planOf(const Info &info) {
    const size_t element_bytes = infini::dtypeSize(info.dtype);
    cpu::RowPlan plan(info.rows, info.dim, element_bytes, info.x.uniform() && info.y.uniform(),
                      cpu::kShortStreamedRowBytes);
    plan.reduce_next_first = element_bytes == 2;
    cpu::runWholeRowsAlways(plan);
    return plan;
}

class CpuDescriptor final : public Descriptor {
  public:
    CpuDescriptor(int device_id, const Info &info)
        : Descriptor(INFINI_DEVICE_CPU, device_id, info),
          plan_(planOf(info)),
          copies_w_(!cpu::readAsStored(true, info.w_stride, info.weight_dtype == cpu::computeDtypeOf(info.dtype),
                                     plan_.readsWeightAsStored())),
          workspace_(workspaceOf(info, plan_, copies_w_)) {}

    size_t workspaceSize() const override { return workspace_.value(); }
    bool workspaceOverflows() const override { return workspace_.overflowed(); }

    infiniStatus_t calculate(void *workspace, void *y, void *rstd, const void *x, const void *w,
                             void *) const override {
        cpu::withDataAndParameterTypes(info.dtype, info.weight_dtype, [&](auto data_tag, auto parameter_tag) {
            using T = decltype(data_tag);
            using W = decltype(parameter_tag);
            run(cpu::alignedWorkspace(workspace), static_cast<T *>(y), rstd, static_cast<const T *>(x),
                static_cast<const W *>(w));
        });
        return INFINI_STATUS_SUCCESS;
    }

  private:
    // Chunk sums, then w in the compute type unless the kernels read it as stored. No rows or no columns: none.
    static infini::CheckedSize workspaceOf(const Info &info, const cpu::RowPlan &plan, bool copies_w) {
        if (info.rows == 0 || info.dim == 0) return 0;
        const size_t compute = infini::dtypeSize(cpu::computeDtypeOf(info.dtype));
        return cpu::withAlignmentSlack(infini::CheckedSize(plan.scratchBytes()) +
                                       infini::CheckedSize(copies_w ? info.dim : 0) * compute);
    }

    template <typename T, typename W>
    void run(void *workspace, T *y, void *rstd, const T *x, const W *w) const {
        using C = cpu::ComputeOf<T>; // also rstd's type: F32, or F64 for F64 data (the Ex dtype rule)
        const size_t dim = info.dim;
        auto rstdOf = [&](double sum_squares) { return 1.0 / std::sqrt(sum_squares / static_cast<double>(dim) + info.epsilon); };
        if (info.rows == 0) return;
        if (dim == 0) { // nothing to read or write but rstd: the mean of no elements is 0/0, as the formula says
            if (info.has_rstd) {
                for (size_t row = 0; row < info.rows; ++row) {
                    static_cast<C *>(rstd)[info.rstd.offset(row)] = static_cast<C>(rstdOf(0.0));
                }
            }
            return;
        }
        auto *chunk_sums = static_cast<cpu::PairSums *>(workspace);
        C *w_copy = reinterpret_cast<C *>(static_cast<char *>(workspace) + plan_.scratchBytes());
        cpu::withKernelVector(dim, w, info.w_stride, plan_.readsWeightAsStored(), w_copy, [&](const auto *w_k) {
            using K = std::remove_const_t<std::remove_pointer_t<decltype(w_k)>>;
            const Kernels<T, K> &kernels = cpu::kernelsFor<Kernels, T, K>(kF64Kernels);
            const bool whole_rows = kernels.block_rows != nullptr && dim <= cpu::kBlockRowsMaxDim;
            const bool stream_y =
                plan_.streams({y}, x, sizeof(T), stridesMultipleOf(cpu::kStreamElements, {info.y}));
            cpu::runRows(
                plan_, chunk_sums,
                [&](size_t row, size_t begin, size_t n) { return kernels.sums(n, x + info.x.offset(row) + begin); },
                [&](size_t, size_t row, const cpu::PairSums &total, size_t begin, size_t n, bool reduce_next) {
                    const double r = rstdOf(total.first);
                    // Every schedule finishes each row's first elements exactly once: that call writes its rstd.
                    if (info.has_rstd && begin == 0) static_cast<C *>(rstd)[info.rstd.offset(row)] = static_cast<C>(r);
                    const T *x_row = x + info.x.offset(row);
                    return kernels.apply(n, static_cast<C>(r), x_row + begin, w_k + begin,
                                         y + info.y.offset(row) + begin,
                                         plan_.hints(stream_y, row, begin, reduce_next, x, info.x, x, info.x));
                },
                [](size_t, size_t) {}, // no weight gradient to finish
                [&](size_t, size_t first, size_t end) {
                    constexpr size_t kRowsPerCall = 16; // their x stays in L1 between the two calls
                    static_assert(kRowsPerCall <= cpu::kBlockRows, "block_rows takes at most kBlockRows rows");
                    cpu::PairSums totals[kRowsPerCall];
                    C r[kRowsPerCall];
                    // Groups of rows one stride apart in each layout (cpu::runWholeRowsAlways takes any layout).
                    for (size_t row = first, count; row < end; row += count) {
                        count = end - row < kRowsPerCall ? end - row : kRowsPerCall;
                        for (const RowLayout *layout : {&info.x, &info.y}) count = layout->rowsInStride(row, count);
                        const T *x_rows = x + info.x.offset(row);
                        if (whole_rows) {
                            double rstds[cpu::kBlockRows];
                            kernels.block_rows(count, dim, info.epsilon, x_rows, info.x.innerStride(), w_k,
                                               y + info.y.offset(row), info.y.innerStride(), rstds, stream_y,
                                               plan_.cached);
                            if (info.has_rstd) {
                                info.rstd.forRows(row, count, [&](size_t i, ptrdiff_t at) {
                                    static_cast<C *>(rstd)[at] = static_cast<C>(rstds[i]);
                                });
                            }
                            continue;
                        }
                        kernels.block_sums(count, dim, x_rows, info.x.innerStride(), totals);
                        for (size_t i = 0; i < count; ++i) {
                            r[i] = static_cast<C>(rstdOf(totals[i].first));
                            if (info.has_rstd) static_cast<C *>(rstd)[info.rstd.offset(row + i)] = r[i];
                        }
                        kernels.block_apply(count, dim, r, x_rows, info.x.innerStride(), w_k, y + info.y.offset(row),
                                            info.y.innerStride(), stream_y);
                    }
                });
        });
    }

    cpu::RowPlan plan_;
    bool copies_w_; // the kernels read w widened into the workspace
    infini::CheckedSize workspace_;
};

} // namespace

infiniStatus_t Backends::cpu(const Info &info, int device_id, Descriptor **desc) {
    *desc = new CpuDescriptor(device_id, info);
    return INFINI_STATUS_SUCCESS;
}

} // namespace op::rms_norm
