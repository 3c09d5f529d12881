// The two-pass schedule shared by the row-normalizing ops: per row, reduce a pair of sums, then apply. For long
// rows the apply pass also reduces the next row, so that reading it from DRAM overlaps this row's arithmetic.
// Many row blocks: threads take whole row blocks. Few, of rows that fit the caches: every row's sums first, then
// threads take column slices down all rows. Few otherwise: the threads split every row at fixed chunk
// boundaries. All schedules do the same arithmetic in the same order, so results never depend on the thread
// count, nor on how many threads an op's size asks for (cpu::threadsFor). Short rows (RowPlan::short_rows) take
// one schedule on any number of threads: whole row blocks, each run by the op's block kernels.
#ifndef INFINI_DEVICES_CPU_ROW_DRIVER_H
#define INFINI_DEVICES_CPU_ROW_DRIVER_H

#include "isa.h"
#include "parallel.h"
#include "reduce.h"
#include "row_hints.h"
#include "workspace.h"

#include <initializer_list>
#include <type_traits>

namespace cpu {

constexpr size_t kMaxRowBlocks = 64;
constexpr size_t kRowChunk = 4096; // the reduction chunk of the leaf kernels (simd::kChunk)
// The row blocks' weight-gradient partials of one gradient take at most this much (or one block): with long rows,
// 64 blocks of partials would be written, read and summed from DRAM, as much traffic as the data itself. 2 MiB
// (8 blocks of rows of 65536) measured 7-12% faster than 4 MiB there; it leaves rows up to 8192 64 blocks.
constexpr size_t kPartialBytes = size_t(2) << 20;
// Ops whose two inputs take at most this many bytes together are cached. Their row blocks hold at least
// kCachedBlockRows rows, so that their partials are zeroed and summed once per that many rows rather than per
// row: with a block per row, LayerNorm BF16 64x4096 spent 42% of its time there, and F32 lost to torch. Threads
// that find too few blocks split the columns instead (runRows), reading the rows once more from the caches.
// Measured on 2 threads (LayerNorm F32/BF16, 16-1024 rows of 512-16384): 16 rows per block was best or within
// 12% of best against 8, 32 and 64; fewer blocks left 2 threads to the column schedule, which re-reads each
// thread's rows from the other's cache (2-3x slower for rows of 512-768). 8 MiB rather than 4 made LayerNorm F32
// 256x4096 and 64x16384 25-30% faster; 16 MiB lost 5-10% at 512x4096.
constexpr size_t kCachedInputBytes = size_t(8) << 20;
constexpr size_t kCachedBlockRows = 16;
// And their partials of one gradient take at most this much (or one block). Summing them reads every block's
// partials on every thread's columns, half of them from the other core's cache with 2 threads: over 512 rows of
// 4096, 32 blocks meant 1 MiB of partials against 8-12 MiB of data. Capped here (16 blocks at 4096, 2026-11-28,
// 2 threads, A/B in alternating processes, back to back) RMSNorm BF16 512x4096 took 0.81 of the time, LayerNorm
// BF16 0.89, F16 0.87, and less still where the VM places its two vCPUs far apart (docs/performance.md, "The VM's
// two phases"). Only 16-bit rows reach the cap: cached F32 rows have at most 1 Mi elements, 256 KiB per 16 rows.
constexpr size_t kCachedPartialBytes = size_t(256) << 10;
// Rows of at most this many bytes run a row block per kernel call (RowPlan::short_rows), and cached ones
// (kCachedInputBytes) of at most kShortCachedRowBytes. Longer rows ran slower that way than row by row where they
// came from DRAM or a cold L3: the kernels read a group of rows, then write it, where row by row reads and writes
// interleave more finely (2 threads, each call after a 256 MiB copy: LayerNorm backward F32 4096x256 1.34x as
// long, BF16 and F16 rows of 512 from DRAM, forward and backward, 1.04-1.2x; F32 8192x128 0.94, F16 4096x256
// 1.00-1.05).
constexpr size_t kShortRowBytes = 256;
constexpr size_t kShortCachedRowBytes = 512;
// Streamed rows (RowPlan::stream_output) of whole vectors (RowPlan::streams: others are not streamed) of at most this
// many bytes run as row blocks where an op asks for it (short_streamed_row_bytes): RMSNorm's backward, whose block
// kernels stream grad_x, and the forwards. 2026-12-06, AVX-512 Xeon, 2 threads, A/B in alternating processes, back to
// back, RMSNorm backward's rows of 512 bytes as blocks against row by row: F32 65536x128 0.93-0.95 of the time, BF16
// 65536x256 0.79-0.80, 262144x256 0.84, F16 131072x256 0.89-0.96, F32 65536x100 0.98-1.00 (before streams() kept such
// rows cached). Not LayerNorm's backward: 0.79 to 1.06 between runs on F32 rows of 128 and 1.01-1.09 on 16-bit rows
// of 256 (its 16-bit block kernel is bound by its arithmetic). The forwards' rows of at most kBlockRowsMaxDim elements
// run as row blocks at any size anyway (runWholeRowsAlways), so this limit decides only their 16-bit rows of 129-256,
// which their block_sums and block_apply run, the row kernels inlined, with each row's y (and xhat) streamed as row
// by row, and the same bits: RMSNorm BF16 65536x256 0.82 of the time, F16 131072x256 0.79, LayerNorm BF16 65536x256
// 0.78, F16 131072x256 0.75 (2026-12-06, the same A/B).
constexpr size_t kShortStreamedRowBytes = 512;
// Cached ops of at most this many rows keep every row's sums (one PairSums each) for the column schedule.
constexpr size_t kMaxSlicedRows = 4096;
// Column slices start at multiples of this many elements: whole vectors, and partials in whole cache lines.
constexpr size_t kSliceAlignment = 64;

// A 16-bit weight is read as stored, widened as each vector is loaded, by ops of rows of at least
// kMinDimReadingWeightAsStored elements: on the AVX-512 paths at any number of rows, on the others at most
// kMaxRowsReadingWeightAsStored rows. Others widen it once into an F32 copy. For few long rows the copy is a
// large share of the traffic: written once, then read by every pass at twice the weight's size (BF16 1x1048576
// spent half its time on it and on rounding its gradient back; read as stored, 0.29-0.42 of the time, and
// 0.81-0.95 at 4-64 rows of 16384-262144). Over many rows, AVX-512 still gains from the smaller weight
// (2026-11-26, 2 threads, AMD EPYC, A/B in alternating processes: LayerNorm BF16 8192x4096 0.75 of the time, F16
// 0.77, 256x65536 0.83, 4096x4096 0.93, RMSNorm BF16 1024x16384 0.82; with BF16 rounded in software 0.97-0.99),
// while AVX2, bound by its vector ALUs, pays the widening on every row (LayerNorm BF16 4096x4096 1.12x as long).
// Rows of 512-2048, whose copy stays in L1, took 1.02-1.21x as long as stored on every path (measured before
// 2026-11-26).
constexpr size_t kMaxRowsReadingWeightAsStored = 64;
constexpr size_t kMinDimReadingWeightAsStored = 4096;

// The most row blocks (at least one, at most kMaxRowBlocks) whose partials of one gradient fit in `bytes`.
inline size_t blocksFitting(size_t dim, size_t bytes) {
    const size_t partial_bytes = dim * sizeof(float);
    if (partial_bytes * kMaxRowBlocks <= bytes) return kMaxRowBlocks;
    const size_t fitting = bytes / partial_bytes;
    return fitting < 1 ? 1 : fitting;
}

inline size_t cachedRowBlocks(size_t rows, size_t dim) {
    const size_t blocks = rows / kCachedBlockRows, most = blocksFitting(dim, kCachedPartialBytes);
    return blocks < 1 ? 1 : blocks < most ? blocks : most;
}

struct RowPlan {
    size_t rows, dim;
    bool cached;   // the inputs fit the caches (kCachedInputBytes)
    Blocks blocks; // row blocks, each with its own weight-gradient partials
    Blocks chunks; // kRowChunk-element chunks of a row
    // Long rows stream from kStreamOutputBytes, at any alignment; shorter ones from kStreamShortRowsBytes (32 MiB,
    // its measurements there; below, BF16 rows of 1 KiB lost a quarter of their speed streamed, with a fence per
    // row). At 64 MiB, with runRows fencing once per thread's run of rows (2026-12-06, AVX-512 Xeon, 2 threads, A/B
    // in alternating processes, back to back): LayerNorm forward F32 131072x128 0.74 of the time, 65536x256 0.67,
    // 32768x512 0.69, RMSNorm F32 131072x128 0.69, LayerNorm backward F32 131072x128 0.75, RMSNorm backward BF16
    // 65536x512 0.86; with the kernels' fence per row, 131072x128 took 2.8x as long. The backwards' short rows
    // (their block kernels) at 64 MiB: F32 rows of 64 0.62-0.65, LayerNorm F32 1048576x16 0.86, BF16 rows of 128
    // 0.88 (RMSNorm) and 0.97 (LayerNorm, nearly bound by its arithmetic on 2 threads). Whether a call's short rows
    // stream is streams()'s.
    bool stream_output;
    // Long rows reduce the next row inside their elementwise pass, where the next row comes from DRAM. Short
    // ones alternate their two passes often enough for the hardware prefetchers to keep DRAM busy, and measured
    // 5% slower with the fused pass; cached rows come from the caches anyway.
    bool reduce_alongside;
    // Where they do not, whether the next row's sums come before this row's apply rather than after, so that its
    // loads overlap the apply and the row's statistics (an F64 division and square root) rather than wait for them.
    // Same arithmetic, same bits. An op sets it where it gained: LayerNorm's forward (layer_norm_cpu.cc), RMSNorm's
    // on 16-bit rows (rms_norm_cpu.cc, which says where it did not).
    bool reduce_next_first = false;
    // Rows short enough that a row block's rows run in one kernel call (runRows' block_rows), where the op asks
    // for it (block_kernel: it has such a kernel for these operands), and more than one (a single row's 16-bit
    // gradients are rounded straight, BlockPartials, which the block kernels do not do).
    bool short_rows;

    // short_streamed_row_bytes and short_cached_row_bytes: the limits for streamed and cached rows, where an op's
    // block kernels gain on longer ones.
    RowPlan(size_t rows, size_t dim, size_t element_bytes, bool block_kernel = false,
            size_t short_streamed_row_bytes = kShortRowBytes, size_t short_cached_row_bytes = kShortCachedRowBytes)
        : rows(rows), dim(dim), cached(2 * rows * dim * element_bytes <= kCachedInputBytes),
          blocks(Blocks::split(rows, cached ? cachedRowBlocks(rows, dim) : blocksFitting(dim, kPartialBytes))),
          chunks(Blocks::ofSize(dim, kRowChunk)),
          stream_output(streamLongRuns(rows * dim * element_bytes, dim * element_bytes) ||
                        rows * dim * element_bytes >= kStreamShortRowsBytes),
          reduce_alongside(!cached && dim * element_bytes >= kLongRunBytes),
          short_rows(block_kernel && rows > 1 &&
                     dim * element_bytes <= (cached ? short_cached_row_bytes
                                             : stream_output && dim % kStreamElements == 0 ? short_streamed_row_bytes
                                                                                          : kShortRowBytes)) {}

    // Whether the kernels read a 16-bit weight as stored (kMaxRowsReadingWeightAsStored).
    bool readsWeightAsStored() const {
        return dim >= kMinDimReadingWeightAsStored &&
               (rows <= kMaxRowsReadingWeightAsStored || selectedIsa() >= Isa::avx512);
    }

    // Whether a call streams these outputs of its input `in` (rows_aligned: every output's rows a whole number of
    // kStreamElements apart): stream_output, and for rows shorter than kLongRunBytes, row by row as in the block
    // kernels, where each output can (shortRowsStreamable). Short rows that are not whole aligned vectors have a
    // cached partial vector at each end, and lines written partly by cached and partly by streamed stores cost far
    // more than either: 2026-12-06, AVX-512 Xeon, 2 threads, A/B in alternating processes, back to back, those rows
    // cached against streamed: LayerNorm forward F16 131072x200 0.40 of the time, backward BF16 131072x200 0.34,
    // RMSNorm F32 131072x100 forward 0.84 and backward 0.92. Long rows gain from streaming even so (BF16
    // 16384x2056 forward 1.24x as long cached, RMSNorm backward 1.13x, F32 8192x1028 forward 1.17x).
    bool streams(std::initializer_list<const void *> outputs, const void *in, size_t element_bytes,
                 bool rows_aligned) const {
        if (!stream_output) return false;
        if (dim * element_bytes >= kLongRunBytes) return true;
        for (const void *out : outputs) {
            if (!shortRowsStreamable(out, in, dim, element_bytes, rows_aligned)) return false;
        }
        return true;
    }

    // Whether the column schedule may run these rows: cached, few enough to keep their sums, and not short.
    bool sliced() const { return !short_rows && cached && rows <= kMaxSlicedRows; }

    // The hints of the elements of `row` from `begin`: the call's streaming (streams()) and, if reduce_next, the
    // same elements of row + 1 to reduce and of row + 2 (where there is one) to fetch, of the two inputs a and b
    // (each placed by its row layout).
    template <typename T, typename Layout>
    RowHints<T> hints(bool stream, size_t row, size_t begin, bool reduce_next, const T *a, const Layout &a_rows,
                      const T *b, const Layout &b_rows) const {
        RowHints<T> hints{stream};
        if (!reduce_next) return hints;
        hints.next_a = a + a_rows.offset(row + 1) + begin;
        hints.next_b = b + b_rows.offset(row + 1) + begin;
        if (row + 2 < rows) { // a fetch only ever goes with a reduction (simd::passAlongside relies on it)
            hints.fetch_a = a + a_rows.offset(row + 2) + begin;
            hints.fetch_b = b + b_rows.offset(row + 2) + begin;
        }
        return hints;
    }

    // Scratch the driver needs at the workspace's start: one PairSums per chunk, for two rows, or per row for the
    // column schedule. Rounded up to whole cache lines: the vectors the callers keep after it would otherwise
    // each straddle two lines.
    size_t scratchBytes() const {
        const size_t chunk_sums = 2 * chunks.count, row_sums = sliced() ? rows : 0;
        const size_t bytes = (chunk_sums > row_sums ? chunk_sums : row_sums) * sizeof(PairSums);
        return (bytes + kWorkspaceAlignment - 1) / kWorkspaceAlignment * kWorkspaceAlignment;
    }
};

// The forwards' rows of at most kBlockRowsMaxDim elements run as row blocks (short_rows) at every size, count and
// layout, so that their whole-row kernels (block_rows) give every such row its bits whatever call it is in: those
// kernels sum in another order than the row kernels, which had run a single row, rows of a non-uniform layout (now
// in groups one stride apart, RowLayout::rowsInStride) and F32 rows of 65-128 in calls over kCachedInputBytes, a few
// F32 roundings apart from the same rows among many (tests/test_determinism.py). F64 has no whole-row kernels: its
// block kernels are its row kernels. 2026-12-07, AVX-512 Xeon, 2 threads, A/B in alternating processes, back to
// back / each call after a 256 MiB copy, F32: LayerNorm 32768x128 0.90 / 1.02-1.05 of the time, 65536x100 0.87-0.90 /
// 1.07-1.09, 131072x128 (streamed) 0.70-0.82 / 0.91-0.97; RMSNorm 32768x128 0.92-0.98 / 1.01-1.04, 65536x80
// 0.77-0.83 / 0.94-0.95, 131072x128 0.57-0.63 / 0.94-0.96. Non-uniform layouts (16384 rows, 64 a group), back to
// back: LayerNorm F32 rows of 40 0.46, of 128 0.88, BF16 rows of 128 0.72; RMSNorm F32 rows of 16 0.37, of 64 0.74.
inline void runWholeRowsAlways(RowPlan &plan) {
    if (plan.dim <= kBlockRowsMaxDim) plan.short_rows = true;
}

// sums(row, begin, n) -> PairSums of the row's elements [begin, begin + n);
// apply(block, row, total, begin, n, reduce_next) finishes those elements given the row's total sums and, if
// reduce_next, returns the sums of the same elements of row + 1 (that row is the same thread's next one in every
// schedule that asks); finish_columns(begin, n) sums the block partials of columns [begin, begin + n) into the
// weight gradients (BlockPartials::finishColumns). `scratch` holds plan.scratchBytes(). Returns whether the
// gradients are finished: the column schedule has each thread finish its own slice, whose partials it wrote,
// while the other schedules leave it to the caller (BlockPartials::finish, over all threads). Where
// plan.stream_output, each thread fences its streamed stores once it has applied its rows, or a row block of
// block_rows (the kernels do not).
// With plan.short_rows, block_rows(block, first, end) runs a row block's rows [first, end) whole instead, on any
// number of threads: short rows spent most of their time in the calls and set-up of two kernels per row (LayerNorm
// backward F32 65536x16: 15 ns a row on 2 threads, 3.3x torch's).
template <typename Sums, typename Apply, typename FinishColumns, typename BlockRows>
bool runRows(const RowPlan &plan, PairSums *scratch, Sums &&sums, Apply &&apply, FinishColumns &&finish_columns,
             BlockRows &&block_rows) {
    if (plan.dim == 0 || plan.rows == 0) return false; // nothing to reduce or write (and the data may be NULL)
    const size_t threads = threadsFor(plan.rows * plan.dim); // small ops stay on fewer threads, or the caller's
    if (plan.short_rows) {
        parallelFor(plan.blocks.count, [&](size_t block) {
            block_rows(block, plan.blocks.begin(block), plan.blocks.end(block, plan.rows));
            if (plan.stream_output) fenceStreams();
        }, threads);
        return false;
    }
    auto finishThenReduceNext = [&](size_t block, size_t row, const PairSums &total, size_t begin, size_t n,
                                    bool has_next) {
        if (plan.reduce_alongside && has_next) return apply(block, row, total, begin, n, true);
        PairSums next;
        if (has_next && plan.reduce_next_first) next = sums(row + 1, begin, n);
        apply(block, row, total, begin, n, false);
        if (has_next && !plan.reduce_next_first) next = sums(row + 1, begin, n);
        return next;
    };
    if (plan.blocks.count >= 2 * threads || threads == 1) {
        parallelFor(plan.blocks.count, [&](size_t block) {
            const size_t first = plan.blocks.begin(block), end = plan.blocks.end(block, plan.rows);
            PairSums total = sums(first, 0, plan.dim);
            for (size_t row = first; row < end; ++row) {
                total = finishThenReduceNext(block, row, total, 0, plan.dim, row + 1 < end);
            }
            if (plan.stream_output) fenceStreams();
        }, threads);
        return false;
    }
    if (plan.sliced() && plan.rows >= threads && plan.chunks.count < 2 * threads) {
        // Rows too short to split by chunks. Every row's sums first, threads over rows; then each thread takes a
        // slice of the columns down all rows in block order (its slice of the partials stays in its L1). Apply
        // never reduces here: reduce_alongside is off for cached plans, so no schedule pairs their partials.
        PairSums *row_sums = scratch;
        parallelRegion(threads, [&](size_t thread, size_t team) {
            for (size_t row = plan.rows * thread / team; row < plan.rows * (thread + 1) / team; ++row) {
                row_sums[row] = sums(row, 0, plan.dim);
            }
            barrier();
            auto sliceStart = [&](size_t t) {
                return t == team ? plan.dim : plan.dim * t / team / kSliceAlignment * kSliceAlignment;
            };
            const size_t begin = sliceStart(thread), end = sliceStart(thread + 1);
            if (begin == end) return;
            for (size_t row = 0; row < plan.rows; ++row) {
                apply(row / plan.blocks.per_block, row, row_sums[row], begin, end - begin, false);
            }
            // Its slice of the partials is in its own caches: summed here, not by one thread after the region
            // (2026-11-28, A/B in alternating processes, after a 256 MiB copy: LayerNorm BF16 16x4096 0.87 of the
            // time, F16 32x4096 0.91, RMSNorm BF16 16x4096 0.95; the same bits).
            finish_columns(begin, end - begin);
        });
        return true;
    }
    // One region for all rows (a region per pass cost more than it saved). Each thread keeps the same chunks of
    // every row; chunk sums alternate between two buffers, so one barrier per row keeps a fast thread from
    // overwriting sums another is still adding up.
    parallelRegion(threads, [&](size_t thread, size_t team) {
        const size_t first = plan.chunks.count * thread / team, last = plan.chunks.count * (thread + 1) / team;
        for (size_t c = first; c < last; ++c) {
            size_t begin = plan.chunks.begin(c);
            scratch[c] = sums(0, begin, plan.chunks.end(c, plan.dim) - begin);
        }
        for (size_t row = 0; row < plan.rows; ++row) {
            barrier();
            const PairSums *row_sums = scratch + (row % 2) * plan.chunks.count;
            PairSums *next_sums = scratch + ((row + 1) % 2) * plan.chunks.count;
            PairSums total;
            for (size_t c = 0; c < plan.chunks.count; ++c) {
                total.first += row_sums[c].first;
                total.second += row_sums[c].second;
            }
            const size_t block = row / plan.blocks.per_block;
            for (size_t c = first; c < last; ++c) {
                size_t begin = plan.chunks.begin(c);
                next_sums[c] = finishThenReduceNext(block, row, total, begin, plan.chunks.end(c, plan.dim) - begin,
                                                    row + 1 < plan.rows);
            }
        }
        if (plan.stream_output) fenceStreams();
    });
    return false;
}

// Where an elementwise pass puts one weight gradient's terms of the elements it covers; both NULL: the gradient
// is not wanted.
template <typename C, typename W>
struct GradientTerms {
    C *partial = nullptr;  // added to the row block's partial (written, for the block's first row: `starts`)
    W *gradient = nullptr; // or, for a 16-bit gradient of a single row, rounded straight into the gradient
};

// BlockPartials' rule (below) without the types, for sizing the workspace: whether a wanted gradient's partials
// take `blocks` rows at `scratch`. of_compute_type: the gradient is C; rounded_straight: it is what the kernels
// read the weight as (K, 16-bit), and its op has a single row.
inline bool partialsInScratch(size_t blocks, ptrdiff_t stride, bool of_compute_type, bool rounded_straight) {
    return blocks != 1 || stride != 1 || !(of_compute_type || rounded_straight);
}

// The row-block partials of one weight gradient W, for kernels that read the parameters as K (W itself, or the
// compute type C). Nothing zeroes them: each block's first row writes them (the kernels' `starts`: +0.0 plus the
// row's terms, the bits of adding them to zeros), which every schedule does over all columns before the block's
// later rows add. Where there is one block and the gradient is a contiguous vector, they need no summing, which
// (from +0.0 in F64, then rounding) would give the one block's partials bit for bit, since additions that start
// from +0.0 never give -0.0: a gradient of C takes them in place; a 16-bit one, where its single row is the only
// one (`single_row`) and the kernels write that type, takes the row's terms rounded (single rows of a million
// elements spent a quarter of their time writing, reading and rounding an F32 partial). Else the partials take
// `blocks` rows of `dim` at `scratch`, and finish() sums them into the gradient.
template <typename C, typename K>
class BlockPartials {
  public:
    template <typename W>
    BlockPartials(size_t blocks, size_t dim, W *gradient, ptrdiff_t stride, bool single_row, C *scratch)
        : blocks_(blocks), dim_(dim) {
        if (gradient == nullptr) return;
        constexpr bool kOfComputeType = std::is_same_v<W, C>, kRoundable = !kOfComputeType && std::is_same_v<W, K>;
        if (partialsInScratch(blocks, stride, kOfComputeType, kRoundable && single_row)) {
            data_ = scratch;
        } else if constexpr (kOfComputeType) {
            data_ = gradient;
            in_gradient_ = true;
        } else if constexpr (kRoundable) {
            rounded_ = gradient;
        }
    }

    // Where block `block`'s terms of the elements from `begin` go.
    GradientTerms<C, K> at(size_t block, size_t begin) const {
        return {data_ == nullptr ? nullptr : data_ + block * dim_ + begin,
                rounded_ == nullptr ? nullptr : rounded_ + begin};
    }

    template <typename W>
    void finish(W *gradient, ptrdiff_t stride) const {
        if (needsSumming()) sumBlockPartials(data_, blocks_, dim_, gradient, stride);
    }

    // finish() of columns [begin, begin + n) only, on the calling thread: the same bits, column by column.
    template <typename W>
    void finishColumns(W *gradient, ptrdiff_t stride, size_t begin, size_t n) const {
        if (needsSumming()) sumBlockPartialColumns(data_, blocks_, dim_, begin, n, gradient, stride);
    }

  private:
    // Partials in scratch: neither taken in place nor rounded straight, and the gradient is wanted.
    bool needsSumming() const { return data_ != nullptr && !in_gradient_; }

    size_t blocks_, dim_;
    C *data_ = nullptr;
    K *rounded_ = nullptr;
    bool in_gradient_ = false;
};

} // namespace cpu

#endif
