// LayerNorm forward on the CPU: per row, one pass reduces sum(x - x0) and sum((x - x0)^2) about the row's first
// element x0 (each 4096-element chunk about an estimate of its mean: see layer_norm_simd.h), a second writes y
// (and xhat) while the row is still in cache, so x is read from DRAM once and y written once. The schedules are
// the backward's (devices/cpu/row_driver.h) without reducing the next row inside the elementwise pass.
#include "../layer_norm.h"

#include "common/moments.h"
#include "devices/cpu/row_driver.h"
#include "devices/cpu/types.h"
#include "devices/cpu/workspace.h"
#include "layer_norm_simd.h"

#include <cmath>
#include <type_traits>

namespace op::layer_norm {
namespace {

// F64 is for reference-grade use: plain loops, everything in F64, the same chunks and schedule as the fast types.
cpu::PairSums sumsF64(size_t n, const double *x, double row_shift) {
    cpu::PairSums total;
    for (size_t begin = 0; begin < n; begin += cpu::kRowChunk) {
        const size_t m = n - begin < cpu::kRowChunk ? n - begin : cpu::kRowChunk;
        double shift = 0.0, residual = 0.0, squares = 0.0;
        for (size_t j = begin; j < begin + m; ++j) shift += x[j];
        shift /= static_cast<double>(m);
        for (size_t j = begin; j < begin + m; ++j) {
            residual += x[j] - shift;
            squares += (x[j] - shift) * (x[j] - shift);
        }
        const double offset = shift - row_shift;
        total.first += static_cast<double>(m) * offset + residual;
        total.second += squares + 2.0 * offset * residual + static_cast<double>(m) * offset * offset;
    }
    return total;
}

void applyF64(size_t n, RowStatistics<double> row, const double *x, const double *w, const double *b, double *y,
              double *xhat, bool) {
    for (size_t j = 0; j < n; ++j) {
        const double standardized = ((x[j] - row.mean_high) - row.mean_low) * row.rstd;
        if (xhat != nullptr) xhat[j] = standardized;
        y[j] = standardized * w[j] + (b != nullptr ? b[j] : 0.0);
    }
}

void blockSumsF64(size_t rows, size_t n, const double *x, ptrdiff_t x_stride, cpu::PairSums *totals) {
    for (size_t r = 0; r < rows; ++r) {
        const double *row = x + static_cast<ptrdiff_t>(r) * x_stride;
        totals[r] = sumsF64(n, row, row[0]);
    }
}

void blockApplyF64(size_t rows, size_t n, const RowStatistics<double> *statistics, const double *x,
                   ptrdiff_t x_stride, const double *w, const double *b, double *y, ptrdiff_t y_stride, double *xhat,
                   ptrdiff_t xhat_stride, bool) {
    for (size_t r = 0; r < rows; ++r) {
        const ptrdiff_t row = static_cast<ptrdiff_t>(r);
        applyF64(n, statistics[r], x + row * x_stride, w, b, y + row * y_stride,
                 xhat != nullptr ? xhat + row * xhat_stride : nullptr, false);
    }
}

const Kernels<double, double> kF64Kernels{sumsF64, applyF64, blockSumsF64, blockApplyF64, nullptr};

// A statistic of the parameters' type W: 16-bit ones through F32 (rounding twice can move a tie by one ulp of W).
template <typename W>
W parameterOf(double value) {
    if constexpr (std::is_same_v<W, double>) {
        return value;
    } else {
        return cpu::fromFloat<W>(static_cast<float>(value));
    }
}

// Cached rows of at most this many bytes run as row blocks (RowPlan::short_rows), twice the backward's limit: the
// forward reads one input and has no weight-gradient partials, and its block kernels (all rows' sums, then all
// rows' outputs) took 0.77-0.93 of the row-by-row time on F32 rows of 192-256 and 16-bit rows of 384-512, on 1 and 2
// threads (2026-12-01, this Xeon, same-process A/B; F32 rows of 512: 0.95-1.02, so not those). Rows from DRAM keep
// the backward's limit: there the blocks took 1.12-1.19x as long.
constexpr size_t kForwardShortCachedRowBytes = 1024;

// The forward's plan: the backward's, never reducing the next row inside the elementwise pass but before it
// (RowPlan::reduce_next_first), with longer short rows where cached or streamed. Reducing first, 2026-12-07, AVX-512
// Xeon, 2 threads, A/B in alternating processes, same bits, back to back / each call after a 256 MiB copy: F32
// 65536x128 0.84-0.90 / 0.92-0.99 of the time, 16384x512 0.93-0.98 / 0.97-1.02, 2048x512 0.92-0.96 / 0.97; BF16
// 16384x1024 0.94 / 1.02. The backward lost that way (F32 8192x768 1.03-1.10x as long, BF16 16384x1024 1.04-1.06x),
// as did RMSNorm's forward on F32 rows of 128 from DRAM (1.04-1.09x).
cpu::RowPlan planOf(const Info &info) {
    const size_t element_bytes = infini::dtypeSize(info.dtype);
    cpu::RowPlan plan(info.rows, info.dim, element_bytes, info.x.uniform() && info.y.uniform() && info.xhat.uniform(),
                      cpu::kShortStreamedRowBytes, kForwardShortCachedRowBytes);
    plan.reduce_alongside = false;
    plan.reduce_next_first = true;
    cpu::runWholeRowsAlways(plan);
    return plan;
}

class CpuDescriptor final : public Descriptor {
  public:
    CpuDescriptor(int device_id, const Info &info)
        : Descriptor(INFINI_DEVICE_CPU, device_id, info), plan_(planOf(info)), copies_(copiesParameters(info, plan_)),
          workspace_(workspaceOf(info, plan_, copies_)) {}

    size_t workspaceSize() const override { return workspace_.value(); }
    bool workspaceOverflows() const override { return workspace_.overflowed(); }

    infiniStatus_t calculate(void *workspace, void *y, void *xhat, void *first_statistic, void *rstd, const void *x,
                             const void *w, const void *b, void *) const override {
        cpu::withDataAndParameterTypes(info.dtype, info.parameter_dtype, [&](auto data_tag, auto parameter_tag) {
            using T = decltype(data_tag);
            using W = decltype(parameter_tag);
            run(cpu::alignedWorkspace(workspace), static_cast<T *>(y), info.has_xhat ? static_cast<T *>(xhat) : nullptr,
                first_statistic, rstd, static_cast<const T *>(x), info.has_w ? static_cast<const W *>(w) : nullptr,
                info.has_b ? static_cast<const W *>(b) : nullptr);
        });
        return INFINI_STATUS_SUCCESS;
    }

  private:
    // Whether w and b are widened into the workspace (both or neither, so that the kernels read one type): unless
    // both present ones are read as stored. An absent w is ones there.
    static bool copiesParameters(const Info &info, const cpu::RowPlan &plan) {
        const bool of_compute_type = info.parameter_dtype == cpu::computeDtypeOf(info.dtype);
        const bool sixteen_bit = plan.readsWeightAsStored();
        return !cpu::readAsStored(info.has_w, info.w_stride, of_compute_type, sixteen_bit) ||
               (info.has_b && !cpu::readAsStored(true, info.b_stride, of_compute_type, sixteen_bit));
    }

    // Chunk sums, then w and b in the compute type where they are copied. No rows or no columns: none.
    static infini::CheckedSize workspaceOf(const Info &info, const cpu::RowPlan &plan, bool copies) {
        if (info.rows == 0 || info.dim == 0) return 0;
        const size_t compute = infini::dtypeSize(cpu::computeDtypeOf(info.dtype));
        const size_t vectors = copies ? 1 + (info.has_b ? 1 : 0) : 0;
        return cpu::withAlignmentSlack(infini::CheckedSize(plan.scratchBytes()) +
                                       infini::CheckedSize(vectors) * info.dim * compute);
    }

    template <typename T, typename W>
    void run(void *workspace, T *y, T *xhat, void *first_statistic, void *rstd, const T *x, const W *w,
             const W *b) const {
        using C = cpu::ComputeOf<T>; // mean and rstd's type (the Ex dtype rule)
        const size_t dim = info.dim;
        const bool xhat_form = info.form == Info::Form::xhat;
        // Per row from the sums about its shift: the mean (split for the kernels), var + eps and its 1/sqrt, each
        // computed once (on rows of 512, F64 divisions and square roots were a tenth of the time).
        struct Row {
            double mean, variance_eps, rstd;
        };
        auto shiftOf = [&](size_t row) { return static_cast<C>(cpu::toDouble(x[info.x.offset(row)])); };
        const double inverse_dim = 1.0 / static_cast<double>(dim);
        auto rowOf = [&](size_t row, const cpu::PairSums &total) {
            const double offset = total.first * inverse_dim;
            const double variance_eps = biasedVariance(total.second * inverse_dim, offset) + info.epsilon;
            return Row{static_cast<double>(shiftOf(row)) + offset, variance_eps, 1.0 / std::sqrt(variance_eps)};
        };
        auto statisticsOf = [](const Row &r) {
            const C mean_high = static_cast<C>(r.mean);
            return RowStatistics<C>{mean_high, static_cast<C>(r.mean - static_cast<double>(mean_high)),
                                    static_cast<C>(r.rstd)};
        };
        auto writeStatistics = [&](size_t row, const Row &r) {
            if (xhat_form) {
                if (info.has_first_statistic) {
                    static_cast<W *>(first_statistic)[info.first_statistic.offset(row)] =
                        parameterOf<W>(std::sqrt(r.variance_eps));
                }
                return;
            }
            if (info.has_first_statistic) static_cast<C *>(first_statistic)[info.first_statistic.offset(row)] = static_cast<C>(r.mean);
            if (info.has_rstd) static_cast<C *>(rstd)[info.rstd.offset(row)] = static_cast<C>(r.rstd);
        };
        // Rows row .. row + count - 1 of block_rows, the same values as writeStatistics, one output at a time (row
        // by row, rereading the descriptor's flags and dividing each row's index took a tenth of the time on rows of
        // 16).
        auto writeGroupStatistics = [&](size_t row, size_t count, const BlockMoments &moments) {
            auto write = [&](bool present, const RowLayout &layout, auto *out, auto value_of) {
                if (present) layout.forRows(row, count, [&](size_t i, ptrdiff_t at) { out[at] = value_of(i); });
            };
            if (xhat_form) {
                write(info.has_first_statistic, info.first_statistic, static_cast<W *>(first_statistic),
                      [&](size_t i) { return parameterOf<W>(std::sqrt(moments.variance_eps[i])); });
                return;
            }
            write(info.has_first_statistic, info.first_statistic, static_cast<C *>(first_statistic),
                  [&](size_t i) { return static_cast<C>(moments.mean[i]); });
            write(info.has_rstd, info.rstd, static_cast<C *>(rstd),
                  [&](size_t i) { return static_cast<C>(moments.rstd[i]); });
        };
        if (info.rows == 0) return;
        if (dim == 0) { // nothing to read or write but the statistics: the mean and variance of no elements, 0/0
            const double nan = std::nan("");
            for (size_t row = 0; row < info.rows; ++row) writeStatistics(row, Row{nan, nan, nan});
            return;
        }
        auto *chunk_sums = static_cast<cpu::PairSums *>(workspace);
        C *w_copy = reinterpret_cast<C *>(static_cast<char *>(workspace) + plan_.scratchBytes());
        C *b_copy = w_copy + dim;
        auto withParameters = [&](auto &&body) {
            if (!copies_) return body(w, b);
            cpu::widenVector(dim, w, info.w_stride, w_copy); // an absent w: ones
            if (b != nullptr) cpu::widenVector(dim, b, info.b_stride, b_copy);
            body(static_cast<const C *>(w_copy), b != nullptr ? static_cast<const C *>(b_copy) : nullptr);
        };
        withParameters([&](const auto *w_k, const auto *b_k) {
            using K = std::remove_const_t<std::remove_pointer_t<decltype(w_k)>>;
            const Kernels<T, K> &kernels = cpu::kernelsFor<Kernels, T, K>(kF64Kernels);
            const bool whole_rows = kernels.block_rows != nullptr && dim <= cpu::kBlockRowsMaxDim;
            const bool stream =
                plan_.streams({y, xhat}, x, sizeof(T), stridesMultipleOf(cpu::kStreamElements, {info.y, info.xhat}));
            cpu::runRows(
                plan_, chunk_sums,
                [&](size_t row, size_t begin, size_t n) {
                    return kernels.sums(n, x + info.x.offset(row) + begin, shiftOf(row));
                },
                [&](size_t, size_t row, const cpu::PairSums &total, size_t begin, size_t n, bool) {
                    const Row r = rowOf(row, total);
                    // Every schedule finishes each row's first elements exactly once: that call writes its statistics.
                    if (begin == 0) writeStatistics(row, r);
                    kernels.apply(n, statisticsOf(r), x + info.x.offset(row) + begin, w_k + begin,
                                  b_k != nullptr ? b_k + begin : nullptr, y + info.y.offset(row) + begin,
                                  xhat != nullptr ? xhat + info.xhat.offset(row) + begin : nullptr, stream);
                    return cpu::PairSums{};
                },
                [](size_t, size_t) {}, // no weight gradient to finish
                [&](size_t, size_t first, size_t end) {
                    constexpr size_t kRowsPerCall = 16; // their x stays in L1 between the two calls
                    cpu::PairSums totals[kRowsPerCall];
                    RowStatistics<C> statistics[kRowsPerCall];
                    static_assert(kRowsPerCall <= cpu::kBlockRows, "block_rows takes at most kBlockRows rows");
                    // Groups of rows one stride apart in each layout (cpu::runWholeRowsAlways takes any layout).
                    for (size_t row = first, count; row < end; row += count) {
                        count = end - row < kRowsPerCall ? end - row : kRowsPerCall;
                        for (const RowLayout *layout : {&info.x, &info.y, &info.xhat}) {
                            count = layout->rowsInStride(row, count);
                        }
                        const T *x_rows = x + info.x.offset(row);
                        if (whole_rows) {
                            BlockMoments moments;
                            kernels.block_rows(count, dim, info.epsilon, x_rows, info.x.innerStride(), w_k, b_k,
                                               y + info.y.offset(row), info.y.innerStride(),
                                               xhat != nullptr ? xhat + info.xhat.offset(row) : nullptr,
                                               info.xhat.innerStride(), &moments, stream, plan_.cached);
                            writeGroupStatistics(row, count, moments);
                            continue;
                        }
                        kernels.block_sums(count, dim, x_rows, info.x.innerStride(), totals);
                        for (size_t i = 0; i < count; ++i) {
                            const Row r = rowOf(row + i, totals[i]);
                            writeStatistics(row + i, r);
                            statistics[i] = statisticsOf(r);
                        }
                        kernels.block_apply(count, dim, statistics, x_rows, info.x.innerStride(), w_k, b_k,
                                            y + info.y.offset(row), info.y.innerStride(),
                                            xhat != nullptr ? xhat + info.xhat.offset(row) : nullptr,
                                            info.xhat.innerStride(), stream);
                    }
                });
        });
    }

    cpu::RowPlan plan_;
    bool copies_; // the kernels read w and b widened into the workspace
    infini::CheckedSize workspace_;
};

} // namespace

infiniStatus_t Backends::cpu(const Info &info, int device_id, Descriptor **desc) {
    *desc = new CpuDescriptor(device_id, info);
    return INFINI_STATUS_SUCCESS;
}

} // namespace op::layer_norm
