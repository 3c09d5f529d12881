// LayerNorm backward on the CPU, both forms: the row input is xhat, or the forward's input, of which the kernels
// form xhat = (input - mean) * rstd in registers. Per row: one pass reduces mean(g) and mean(g*xhat) with
// g = grad_output*weight, a second writes grad_input while the row is still in cache and adds grad_output*xhat
// and grad_output into the row block's F32 partials; the partials are summed in block order at the end
// (devices/cpu/row_driver.h has the schedule).
#include "../layer_norm_backward.h"

#include "devices/cpu/row_driver.h"
#include "devices/cpu/types.h"
#include "devices/cpu/workspace.h"
#include "layer_norm_backward_simd.h"

#include <type_traits>

namespace op::layer_norm_backward {
namespace {

// F64 is for reference-grade use: plain loops, everything in F64, the same schedule as the fast types.
template <bool kFromInput>
cpu::PairSums sumsF64(size_t n, const double *grad_output, const double *row_input, const double *weight,
                      RowStatistics<double> row) {
    cpu::PairSums total;
    for (size_t j = 0; j < n; ++j) {
        const double g = grad_output[j] * weight[j];
        total.first += g;
        total.second += g * standardized<kFromInput>(row_input[j], row.mean, row.rstd);
    }
    return total;
}

template <bool kFromInput>
cpu::PairSums applyF64(size_t n, RowStatistics<double> row, RowStatistics<double> next, double mean_g,
                       double mean_g_xhat, const double *grad_output, const double *row_input, const double *weight,
                       double *grad_input, cpu::GradientTerms<double, double> weight_terms,
                       cpu::GradientTerms<double, double> bias_terms, bool partials_with_next, bool starts,
                       const cpu::RowHints<double> &hints) {
    // F64 gradients are never rounded: no `gradient`
    double *weight_partial = weight_terms.partial, *bias_partial = bias_terms.partial;
    for (size_t j = 0; j < n; ++j) {
        const double go = grad_output[j], xh = standardized<kFromInput>(row_input[j], row.mean, row.rstd);
        const double next_go = partials_with_next ? hints.next_a[j] : 0.0;
        const double next_xh =
            partials_with_next ? standardized<kFromInput>(hints.next_b[j], next.mean, next.rstd) : 0.0;
        if (weight_partial != nullptr) {
            weight_partial[j] = (starts ? 0.0 : weight_partial[j]) + (go * xh + next_go * next_xh);
        }
        if (bias_partial != nullptr) bias_partial[j] = (starts ? 0.0 : bias_partial[j]) + (go + next_go);
        grad_input[j] = (go * weight[j] - mean_g - xh * mean_g_xhat) * row.rstd;
    }
    return hints.next_a == nullptr ? cpu::PairSums{}
                                   : sumsF64<kFromInput>(n, hints.next_a, hints.next_b, weight, next);
}

template <bool kFromInput>
void rowsF64(size_t rows, size_t n, const double *grad_output, ptrdiff_t grad_output_stride, const double *row_input,
             ptrdiff_t row_input_stride, double *grad_input, ptrdiff_t grad_input_stride, const double *weight,
             const RowStatistics<double> *statistics, double *weight_partial, double *bias_partial, bool starts,
             bool) { // F64 streams nothing
    const double inverse_n = 1.0 / static_cast<double>(n); // as the driver's apply (CpuDescriptor::run)
    for (size_t r = 0; r < rows; ++r) {
        const ptrdiff_t row = static_cast<ptrdiff_t>(r);
        const double *go = grad_output + row * grad_output_stride, *in = row_input + row * row_input_stride;
        const cpu::PairSums total = sumsF64<kFromInput>(n, go, in, weight, statistics[r]);
        applyF64<kFromInput>(n, statistics[r], {}, total.first * inverse_n, total.second * inverse_n, go, in, weight,
                             grad_input + row * grad_input_stride, {weight_partial, nullptr}, {bias_partial, nullptr},
                             false, starts && r == 0, cpu::RowHints<double>{false});
    }
}

const Kernels<double, double> kF64Kernels{{sumsF64<false>, applyF64<false>, rowsF64<false>},
                                          {sumsF64<true>, applyF64<true>, rowsF64<true>}};

// Which rows' terms a row's elementwise pass adds to the weight-gradient partials.
enum class PartialRows { this_row, with_next, none };

class CpuDescriptor final : public Descriptor {
  public:
    CpuDescriptor(int device_id, const Info &info)
        : Descriptor(INFINI_DEVICE_CPU, device_id, info),
          plan_(info.rows, info.dim, infini::dtypeSize(info.dtype),
                info.grad_output.uniform() && info.row_input.uniform() && info.grad_input.uniform()),
          space_(parameterSpaceOf(info, plan_)), workspace_(workspaceOf(info, plan_, space_)) {}

    size_t workspaceSize() const override { return workspace_.value(); }
    bool workspaceOverflows() const override { return workspace_.overflowed(); }

    infiniStatus_t calculate(void *workspace, void *grad_input, void *grad_weight, void *grad_bias,
                             const void *grad_output, const void *weight, const void *row_input, const void *row_mean,
                             const void *row_scale, void *) const override {
        cpu::withDataAndParameterTypes(info.dtype, info.parameter_dtype, [&](auto data_tag, auto parameter_tag) {
            using T = decltype(data_tag);
            using W = decltype(parameter_tag);
            using C = cpu::ComputeOf<T>;
            auto runForm = [&](auto from_input) {
                constexpr bool kFromInput = decltype(from_input)::value;
                using S = std::conditional_t<kFromInput, C, W>; // std has the parameters' type, mean/rstd C's
                run<kFromInput>(cpu::alignedWorkspace(workspace), static_cast<T *>(grad_input),
                                static_cast<W *>(grad_weight), static_cast<W *>(grad_bias),
                                static_cast<const T *>(grad_output),
                                info.has_weight ? static_cast<const W *>(weight) : nullptr,
                                static_cast<const T *>(row_input), static_cast<const S *>(row_mean),
                                static_cast<const S *>(row_scale));
            };
            if (info.form == Info::Form::from_input) {
                runForm(std::true_type{});
            } else {
                runForm(std::false_type{});
            }
        });
        return INFINI_STATUS_SUCCESS;
    }

  private:
    // Which parameter vectors take workspace, from the layout alone (so that the size and the run agree): the
    // weight in the compute type unless the kernels read it as stored, and the row blocks' partials of each wanted
    // gradient that keeps them there (cpu::BlockPartials).
    struct ParameterSpace {
        bool single_row; // the kernels write both gradients one way: rounded straight only if both are contiguous
        bool weight_copy, weight_partials, bias_partials;
    };
    static ParameterSpace parameterSpaceOf(const Info &info, const cpu::RowPlan &plan) {
        const bool of_compute_type = info.parameter_dtype == cpu::computeDtypeOf(info.dtype);
        const bool as_stored =
            cpu::readAsStored(info.has_weight, info.weight_stride, of_compute_type, plan.readsWeightAsStored());
        const bool single_row = info.rows == 1 && (!info.has_grad_weight || info.grad_weight_stride == 1) &&
                                (!info.has_grad_bias || info.grad_bias_stride == 1);
        const bool rounded_straight = !of_compute_type && as_stored && single_row;
        auto inScratch = [&](bool wanted, ptrdiff_t stride) {
            return wanted && cpu::partialsInScratch(plan.blocks.count, stride, of_compute_type, rounded_straight);
        };
        return {single_row, !as_stored, inScratch(info.has_grad_weight, info.grad_weight_stride),
                inScratch(info.has_grad_bias, info.grad_bias_stride)};
    }

    // Chunk sums, then the parameter space: weight, then per row block one partial of length L per gradient. No
    // rows: none (the run only zeroes the gradients).
    static infini::CheckedSize workspaceOf(const Info &info, const cpu::RowPlan &plan, const ParameterSpace &space) {
        if (info.rows == 0) return 0;
        const size_t compute = infini::dtypeSize(cpu::computeDtypeOf(info.dtype));
        const size_t partials = (space.weight_partials ? 1 : 0) + (space.bias_partials ? 1 : 0);
        return cpu::withAlignmentSlack(
            infini::CheckedSize(plan.scratchBytes()) +
            (infini::CheckedSize(space.weight_copy ? 1 : 0) + infini::CheckedSize(partials) * plan.blocks.count) *
                info.dim * compute);
    }

    template <bool kFromInput, typename T, typename W, typename S>
    void run(void *workspace, T *grad_input, W *grad_weight, W *grad_bias, const T *grad_output, const W *weight,
             const T *row_input, const S *row_mean, const S *row_scale) const {
        using C = cpu::ComputeOf<T>;
        const size_t dim = info.dim, blocks = plan_.blocks.count;
        if (info.rows == 0) { // nothing to read: the gradients of no rows are zero
            if (info.has_grad_weight) cpu::zeroVector(grad_weight, dim, info.grad_weight_stride);
            if (info.has_grad_bias) cpu::zeroVector(grad_bias, dim, info.grad_bias_stride);
            return;
        }
        auto *chunk_sums = static_cast<cpu::PairSums *>(workspace);
        C *weight_copy = reinterpret_cast<C *>(static_cast<char *>(workspace) + plan_.scratchBytes());
        C *weight_scratch = weight_copy + (space_.weight_copy ? dim : 0);
        C *bias_scratch = weight_scratch + (space_.weight_partials ? blocks * dim : 0);
        auto statisticsOf = [&](size_t row) {
            const S scale = row_scale[info.row_scale.offset(row)];
            if constexpr (kFromInput) {
                return RowStatistics<C>{row_mean[info.row_mean.offset(row)], scale};
            } else {
                return RowStatistics<C>{C(0), static_cast<C>(1.0 / cpu::toDouble(scale))};
            }
        };
        // Rows reduced alongside pair up from their block's first: the first of a pair adds both rows' terms to
        // the partials, read while it reduces the second, which adds none (one trip of the partials through the
        // caches per two rows). A block's odd last row adds its own.
        auto partialRows = [&](size_t block, size_t row, bool reduce_next) {
            if (!plan_.reduce_alongside) return PartialRows::this_row;
            const size_t first = plan_.blocks.begin(block), end = plan_.blocks.end(block, plan_.rows);
            if ((row - first) % 2 == 1) return PartialRows::none;
            return reduce_next && row + 1 < end ? PartialRows::with_next : PartialRows::this_row;
        };
        const bool single_row = space_.single_row;
        const bool as_stored = plan_.readsWeightAsStored();
        // The means of a row's sums as the block kernels form them (blockRows: times 1 / D, where this had divided
        // by D), so that the same sums give the same means whichever kernels ran the row.
        const double inverse_dim = 1.0 / static_cast<double>(dim);
        const bool stream = plan_.streams({grad_input}, grad_output, sizeof(T),
                                          stridesMultipleOf(cpu::kStreamElements, {info.grad_input}));
        cpu::withKernelVector(dim, weight, info.weight_stride, as_stored, weight_copy, [&](const auto *weight_k) {
            using K = std::remove_const_t<std::remove_pointer_t<decltype(weight_k)>>;
            const cpu::BlockPartials<C, K> weight_block_partials(
                blocks, dim, info.has_grad_weight ? grad_weight : nullptr, info.grad_weight_stride, single_row,
                weight_scratch);
            const cpu::BlockPartials<C, K> bias_block_partials(blocks, dim, info.has_grad_bias ? grad_bias : nullptr,
                                                               info.grad_bias_stride, single_row, bias_scratch);
            const Kernels<T, K> &all_kernels = cpu::kernelsFor<Kernels, T, K>(kF64Kernels);
            const FormKernels<T, K> &kernels = kFromInput ? all_kernels.from_input : all_kernels.xhat;
            const bool finished = cpu::runRows(
                plan_, chunk_sums,
                [&](size_t row, size_t begin, size_t n) {
                    return kernels.sums(n, grad_output + info.grad_output.offset(row) + begin,
                                        row_input + info.row_input.offset(row) + begin, weight_k + begin,
                                        kFromInput ? statisticsOf(row) : RowStatistics<C>{}); // xhat: not read
                },
                [&](size_t block, size_t row, const cpu::PairSums &total, size_t begin, size_t n, bool reduce_next) {
                    const PartialRows partial_rows = partialRows(block, row, reduce_next);
                    const bool skip_partials = partial_rows == PartialRows::none;
                    // The next row's statistics where this pass reduces it (reduce_next: it exists); xhat reads none.
                    const RowStatistics<C> next =
                        kFromInput && reduce_next ? statisticsOf(row + 1) : RowStatistics<C>{};
                    return kernels.apply(n, statisticsOf(row), next,
                                         static_cast<C>(total.first * inverse_dim),
                                         static_cast<C>(total.second * inverse_dim),
                                         grad_output + info.grad_output.offset(row) + begin,
                                         row_input + info.row_input.offset(row) + begin, weight_k + begin,
                                         grad_input + info.grad_input.offset(row) + begin,
                                         skip_partials ? cpu::GradientTerms<C, K>{}
                                                       : weight_block_partials.at(block, begin),
                                         skip_partials ? cpu::GradientTerms<C, K>{}
                                                       : bias_block_partials.at(block, begin),
                                         partial_rows == PartialRows::with_next, row == plan_.blocks.begin(block),
                                         plan_.hints(stream, row, begin, reduce_next, grad_output,
                                                     info.grad_output, row_input, info.row_input));
                },
                [&](size_t begin, size_t n) {
                    weight_block_partials.finishColumns(grad_weight, info.grad_weight_stride, begin, n);
                    bias_block_partials.finishColumns(grad_bias, info.grad_bias_stride, begin, n);
                },
                [&](size_t block, size_t first, size_t end) {
                    // Several rows: the partials are never the rounded gradients (BlockPartials).
                    const cpu::GradientTerms<C, K> weight_terms = weight_block_partials.at(block, 0),
                                                   bias_terms = bias_block_partials.at(block, 0);
                    // The statistics of a few rows at a time, as the kernels take them.
                    constexpr size_t kRowsPerCall = 64;
                    RowStatistics<C> statistics[kRowsPerCall];
                    for (size_t row = first; row < end; row += kRowsPerCall) {
                        const size_t count = end - row < kRowsPerCall ? end - row : kRowsPerCall;
                        for (size_t r = 0; r < count; ++r) statistics[r] = statisticsOf(row + r);
                        kernels.rows(count, dim, grad_output + info.grad_output.offset(row),
                                     info.grad_output.stride(), row_input + info.row_input.offset(row),
                                     info.row_input.stride(), grad_input + info.grad_input.offset(row),
                                     info.grad_input.stride(), weight_k, statistics, weight_terms.partial,
                                     bias_terms.partial, row == first, stream);
                    }
                });
            if (!finished) {
                weight_block_partials.finish(grad_weight, info.grad_weight_stride);
                bias_block_partials.finish(grad_bias, info.grad_bias_stride);
            }
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

} // namespace op::layer_norm_backward
