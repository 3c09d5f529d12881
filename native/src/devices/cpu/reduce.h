// Reductions shared by the CPU kernels. Orders are fixed by the code, never by the thread count.
#ifndef INFINI_DEVICES_CPU_REDUCE_H
#define INFINI_DEVICES_CPU_REDUCE_H

#include "half.h"
#include "parallel.h"

#include <cstddef>

namespace cpu {

// A pair of sums over a row segment (which two depends on the op).
struct PairSums {
    double first = 0.0, second = 0.0;
};

// out[j * out_stride] = sum over blocks b (in order) of partials[b * dim + j], for j in [0, dim).
template <typename T>
void sumBlockPartials(const float *partials, size_t blocks, size_t dim, T *out, ptrdiff_t out_stride) {
    constexpr size_t chunk = 512;
    parallelFor((dim + chunk - 1) / chunk, [&](size_t c) {
        size_t begin = c * chunk, width = dim - begin < chunk ? dim - begin : chunk;
        double acc[chunk] = {};
        for (size_t b = 0; b < blocks; ++b) {
            const float *row = partials + b * dim + begin;
            for (size_t j = 0; j < width; ++j) acc[j] += row[j];
        }
        for (size_t j = 0; j < width; ++j) {
            out[static_cast<ptrdiff_t>(begin + j) * out_stride] = fromFloat<T>(static_cast<float>(acc[j]));
        }
    });
}

} // namespace cpu

#endif
