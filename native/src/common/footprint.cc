#include "footprint.h"

#include <algorithm>
#include <cstdint>

namespace infini {

Footprint footprintOf(const InfiniopTensorDescriptor *t) {
    Footprint footprint;
    if (t == nullptr || t->numel() == 0) return footprint;
    footprint.itemsize = dtypeSize(t->dtype);
    ptrdiff_t low = 0, high = 0; // element offsets; tensor_descriptor.cc keeps them (in bytes) within int64
    for (size_t i = 0; i < t->ndim(); ++i) {
        if (t->shape[i] <= 1) continue;
        ptrdiff_t reach = t->strides[i] * static_cast<ptrdiff_t>(t->shape[i] - 1);
        (reach < 0 ? low : high) += reach;
        footprint.stepped.emplace_back(t->shape[i], t->strides[i]);
    }
    const auto itemsize = static_cast<ptrdiff_t>(footprint.itemsize);
    footprint.empty = false;
    footprint.first = low * itemsize;
    footprint.last = high * itemsize + itemsize - 1;
    return footprint;
}

const Footprint &footprintAt(const std::vector<Footprint> &footprints, size_t index) {
    static const Footprint absent;
    return index < footprints.size() ? footprints[index] : absent;
}

namespace {

// Absolute byte ranges, in 128 bits: a pointer plus a signed offset may leave the 64-bit range.
struct Range {
    __int128 first, last;
};

Range rangeOf(const void *data, const Footprint &footprint) {
    auto base = static_cast<__int128>(reinterpret_cast<uintptr_t>(data));
    return {base + footprint.first, base + footprint.last};
}

bool intersect(Range a, Range b) { return a.first <= b.last && b.first <= a.last; }

bool touches(const void *data, const Footprint &footprint) { return data != nullptr && !footprint.empty; }

bool isAllowedInPlace(size_t output, size_t other, const void *const *data, const std::vector<Footprint> &footprints,
                      std::initializer_list<InPlacePair> in_place) {
    bool named = std::any_of(in_place.begin(), in_place.end(), [&](InPlacePair pair) {
        return (pair.first == output && pair.second == other) || (pair.first == other && pair.second == output);
    });
    const Footprint &a = footprintAt(footprints, output), &b = footprintAt(footprints, other);
    return named && data[output] == data[other] && a.stepped == b.stepped && a.itemsize == b.itemsize;
}

} // namespace

infiniStatus_t checkNoAliasing(const std::vector<Footprint> &footprints, const void *workspace,
                               size_t workspace_bytes, std::initializer_list<const void *> data, size_t outputs,
                               std::initializer_list<InPlacePair> in_place) {
    if (data.size() < footprints.size() || outputs > data.size()) return INFINI_STATUS_INTERNAL_ERROR;
    const void *const *pointers = data.begin();
    const bool has_workspace = workspace != nullptr && workspace_bytes > 0;
    const auto workspace_base = static_cast<__int128>(reinterpret_cast<uintptr_t>(workspace));
    const Range workspace_range{workspace_base, workspace_base + static_cast<__int128>(workspace_bytes) - 1};
    for (size_t i = 0; i < data.size(); ++i) {
        const Footprint &footprint = footprintAt(footprints, i);
        if (!touches(pointers[i], footprint)) continue;
        // The kernels load and store whole elements through typed pointers: an address that is not a multiple of
        // the element size is undefined behaviour there, so it is refused (no kernel pays for unaligned loads).
        if (reinterpret_cast<uintptr_t>(pointers[i]) % footprint.itemsize != 0) return INFINI_STATUS_BAD_PARAM;
        Range range = rangeOf(pointers[i], footprint);
        if (has_workspace && intersect(range, workspace_range)) return INFINI_STATUS_BAD_PARAM;
        if (i >= outputs) continue;
        for (size_t j = 0; j < data.size(); ++j) {
            if (j == i || !touches(pointers[j], footprintAt(footprints, j))) continue;
            if (intersect(range, rangeOf(pointers[j], footprintAt(footprints, j))) &&
                !isAllowedInPlace(i, j, pointers, footprints, in_place)) {
                return INFINI_STATUS_BAD_PARAM;
            }
        }
    }
    return INFINI_STATUS_SUCCESS;
}

} // namespace infini
