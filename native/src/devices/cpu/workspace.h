// The CPU kernels keep doubles and vectors in the workspace, but a caller may pass any address: each CPU
// descriptor asks for alignment slack on top of what it uses and works from the first aligned address.
#ifndef INFINI_DEVICES_CPU_WORKSPACE_H
#define INFINI_DEVICES_CPU_WORKSPACE_H

#include "common/checked.h"

#include <cstddef>
#include <cstdint>

namespace cpu {

constexpr size_t kWorkspaceAlignment = 64;

// The workspace size to ask callers for, given the bytes the kernels use (none stays none); an overflow stays
// one (the descriptor is refused).
inline infini::CheckedSize withAlignmentSlack(infini::CheckedSize bytes) {
    return bytes.value() == 0 && !bytes.overflowed() ? bytes : bytes + (kWorkspaceAlignment - 1);
}

inline void *alignedWorkspace(void *workspace) {
    auto address = reinterpret_cast<uintptr_t>(workspace);
    return reinterpret_cast<void *>((address + kWorkspaceAlignment - 1) / kWorkspaceAlignment * kWorkspaceAlignment);
}

} // namespace cpu

#endif
