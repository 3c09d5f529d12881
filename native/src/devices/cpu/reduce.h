// Reductions shared by the CPU kernels. Orders are fixed by the code, never by the thread count.
#ifndef INFINI_DEVICES_CPU_REDUCE_H
#define INFINI_DEVICES_CPU_REDUCE_H

#include "convert_simd.h"
#include "half.h"
#include "parallel.h"

#include <cstddef>
#include <type_traits>

namespace cpu {

// A pair of sums over a row segment (which two depends on the op).
struct PairSums {
    double first = 0.0, second = 0.0;
};

// The row forwards' block_rows kernels take groups of at most kBlockRows rows of at most kBlockRowsMaxDim elements
// whole (simd::RowBlock): a lane per row in their sums across lanes, up to 8 vectors a row.
constexpr size_t kBlockRows = 16, kBlockRowsMaxDim = 128;

// out[j * out_stride] = sum over blocks b (in order, in F64) of partials[b * dim + j], for j in [begin, begin + n),
// on the calling thread.
template <typename T>
void sumBlockPartialColumns(const float *partials, size_t blocks, size_t dim, size_t begin, size_t n, T *out,
                            ptrdiff_t out_stride) {
    selectedTable<Conversions<T>>().narrowSum(n, partials + begin, blocks, dim,
                                              out + static_cast<ptrdiff_t>(begin) * out_stride, out_stride);
}

// F64 data: the partials and the result stay F64.
template <typename T>
void sumBlockPartialColumns(const double *partials, size_t blocks, size_t dim, size_t begin, size_t n, T *out,
                            ptrdiff_t out_stride) {
    static_assert(std::is_same_v<T, double>, "F64 partials are summed into F64 outputs");
    for (size_t j = begin; j < begin + n; ++j) {
        double acc = 0.0;
        for (size_t b = 0; b < blocks; ++b) acc += partials[b * dim + j];
        out[static_cast<ptrdiff_t>(j) * out_stride] = acc;
    }
}

// The same for every column, which go to the threads in pieces of 512, so that rows of 1024-4096 split too: with
// pieces of 4096 one thread summed all 64 blocks of LayerNorm F32 512x4096 (2 MiB of partials) while the other
// waited, and splitting them took 0.86 of the op's time back to back, 0.96 after a 256 MiB copy (LayerNorm BF16
// 1024x4096 1.00 and 0.89; 2026-11-28, 2 threads, A/B in alternating processes, same bits).
template <typename P, typename T>
void sumBlockPartials(const P *partials, size_t blocks, size_t dim, T *out, ptrdiff_t out_stride) {
    constexpr size_t piece = 512;
    parallelFor((dim + piece - 1) / piece, [&](size_t c) {
        const size_t begin = c * piece;
        sumBlockPartialColumns(partials, blocks, dim, begin, dim - begin < piece ? dim - begin : piece, out,
                               out_stride);
    }, threadsFor(blocks * dim));
}

} // namespace cpu

#endif
