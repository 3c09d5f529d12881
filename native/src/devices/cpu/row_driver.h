// The two-pass schedule shared by the row-normalizing ops: per row, reduce a pair of sums, then apply.
// Many row blocks: threads take whole row blocks. Few: threads take the fixed chunks of each row in turn.
// Both schedules do the same arithmetic in the same order, so results never depend on the thread count.
#ifndef INFINI_DEVICES_CPU_ROW_DRIVER_H
#define INFINI_DEVICES_CPU_ROW_DRIVER_H

#include "parallel.h"
#include "reduce.h"

#include <cstring>

namespace cpu {

constexpr size_t kMaxRowBlocks = 64;
constexpr size_t kRowChunk = 4096; // the reduction chunk of the leaf kernels (simd::kChunk)

struct RowPlan {
    size_t rows, dim;
    Blocks blocks; // row blocks, each with its own weight-gradient partials
    Blocks chunks; // kRowChunk-element chunks of a row

    RowPlan(size_t rows, size_t dim)
        : rows(rows), dim(dim), blocks(Blocks::split(rows, kMaxRowBlocks)), chunks(Blocks::ofSize(dim, kRowChunk)) {}

    // Scratch the driver needs in the workspace: one PairSums per chunk.
    size_t scratchBytes() const { return chunks.count * sizeof(PairSums); }
};

// sums(row, begin, n) -> PairSums of the row's elements [begin, begin + n);
// apply(block, row, total, begin, n) finishes those elements given the row's total sums.
template <typename Sums, typename Apply>
void runRows(const RowPlan &plan, PairSums *chunk_sums, Sums &&sums, Apply &&apply) {
    if (plan.dim == 0) return; // rows of no elements: nothing to reduce or write (and their data may be NULL)
    if (plan.blocks.count >= 2 * maxThreads()) {
        parallelFor(plan.blocks.count, [&](size_t block) {
            for (size_t row = plan.blocks.begin(block); row < plan.blocks.end(block, plan.rows); ++row) {
                PairSums total = sums(row, 0, plan.dim);
                apply(block, row, total, 0, plan.dim);
            }
        });
        return;
    }
    for (size_t row = 0; row < plan.rows; ++row) {
        parallelFor(plan.chunks.count, [&](size_t c) {
            size_t begin = plan.chunks.begin(c);
            chunk_sums[c] = sums(row, begin, plan.chunks.end(c, plan.dim) - begin);
        });
        PairSums total;
        for (size_t c = 0; c < plan.chunks.count; ++c) {
            total.first += chunk_sums[c].first;
            total.second += chunk_sums[c].second;
        }
        size_t block = row / plan.blocks.per_block;
        parallelFor(plan.chunks.count, [&](size_t c) {
            size_t begin = plan.chunks.begin(c);
            apply(block, row, total, begin, plan.chunks.end(c, plan.dim) - begin);
        });
    }
}

template <typename C>
void zeroFill(C *data, size_t count) {
    constexpr size_t kPiece = 1 << 16;
    parallelFor((count + kPiece - 1) / kPiece, [&](size_t piece) {
        size_t begin = piece * kPiece, n = count - begin < kPiece ? count - begin : kPiece;
        std::memset(data + begin, 0, n * sizeof(C));
    });
}

} // namespace cpu

#endif
