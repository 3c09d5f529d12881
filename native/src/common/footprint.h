// Which bytes each tensor argument of a run touches, and the run-time refusal of outputs that collide
// with another argument (the data pointers, hence the addresses, are known only at run time).
#ifndef INFINI_COMMON_FOOTPRINT_H
#define INFINI_COMMON_FOOTPRINT_H

#include "tensor.h"

#include <cstddef>
#include <initializer_list>
#include <utility>
#include <vector>

namespace infini {

// The bytes a tensor touches relative to its data pointer, recorded at create time.
struct Footprint {
    bool empty = true;                                  // no elements (or no descriptor): touches nothing
    ptrdiff_t first = 0, last = 0;                      // lowest and highest byte touched, inclusive
    std::vector<std::pair<size_t, ptrdiff_t>> stepped;  // (extent, stride) of dims of size > 1: the layout
    size_t itemsize = 0;
};

// nullptr gives an empty footprint, so optional tensors need no special case.
Footprint footprintOf(const InfiniopTensorDescriptor *t);

// footprints[index], or an empty footprint past their end (a seed-made descriptor run through a function with more
// data arguments: those tensors are absent, so they touch nothing).
const Footprint &footprintAt(const std::vector<Footprint> &footprints, size_t index);

// Indices (into the run's data arguments) of an output and the input it may share exactly: in place.
using InPlacePair = std::pair<size_t, size_t>;

// BAD_PARAM when a data pointer is not a multiple of its element size, when an output (the first `outputs` data
// arguments) shares a byte with any other argument, or when the `workspace_bytes` of the workspace share a byte
// with any argument. The one exception is an
// `in_place` pair given the same pointer with identical layouts. `footprints` are in argument order.
// NULL data pointers touch nothing (checkRunArgs refuses them where data is needed).
infiniStatus_t checkNoAliasing(const std::vector<Footprint> &footprints, const void *workspace,
                               size_t workspace_bytes, std::initializer_list<const void *> data, size_t outputs,
                               std::initializer_list<InPlacePair> in_place = {});

} // namespace infini

#endif
