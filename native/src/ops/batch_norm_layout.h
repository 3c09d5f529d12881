// The layout rules BatchNorm's forward and backward Ex creates share, written once: the big tensors (N, C,
// *spatial) of rank 2..5, all channels-first packed or all channels-last packed, seen as (N, C, L).
#ifndef INFINIOP_SRC_OPS_BATCH_NORM_LAYOUT_H
#define INFINIOP_SRC_OPS_BATCH_NORM_LAYOUT_H

#include "common/layout.h"

#include <initializer_list>

namespace op {

// How the big tensors lie in memory, seen as (N, C, L) with L = the spatial dims flattened.
enum class BatchNormLayout {
    channels_first, // (N, C, L) row-major: each (n, c) is a run of L elements
    channels_last,  // (N, L, C) row-major (NHWC): N*L rows of C contiguous channels
};

struct BatchNormShape {
    static constexpr size_t kMaxRank = 5;

    // Whether the rank of t is one the Ex creates take.
    static bool rankOk(infini::Tensor t) { return t->ndim() >= 2 && t->ndim() <= kMaxRank; }

    // The one layout all tensors (of one rank in 2..kMaxRank, one shape) have, channels-first preferred where
    // both fit (e.g. L == 1); false if none. Fixed arrays, not vectors: this header is compiled into the shared
    // library.
    static bool sharedLayout(std::initializer_list<infini::Tensor> tensors, BatchNormLayout *layout) {
        const size_t ndim = (*tensors.begin())->ndim();
        size_t first[kMaxRank], last[kMaxRank]; // innermost first: (..., 2, 1, 0) and (1, ..., 2, 0)
        last[0] = 1;
        for (size_t i = 0; i < ndim; ++i) first[i] = ndim - 1 - i;
        for (size_t i = 1; i + 1 < ndim; ++i) last[i] = ndim - i;
        last[ndim - 1] = 0;
        bool all_first = true, all_last = true;
        for (infini::Tensor t : tensors) {
            all_first = all_first && packedInOrder(t, first);
            all_last = all_last && packedInOrder(t, last);
        }
        *layout = all_first ? BatchNormLayout::channels_first : BatchNormLayout::channels_last;
        return all_first || all_last;
    }

  private:
    // Packed with the dims visited innermost first in order[0..ndim) (dims of size <= 1 never step; empty t
    // passes).
    static bool packedInOrder(infini::Tensor t, const size_t *order) {
        if (t->numel() == 0) return true;
        ptrdiff_t expected = 1;
        for (size_t i = 0; i < t->ndim(); ++i) {
            const size_t dim = order[i];
            if (t->shape[dim] > 1 && t->strides[dim] != expected) return false;
            expected *= static_cast<ptrdiff_t>(t->shape[dim]);
        }
        return true;
    }
};

} // namespace op

#endif
