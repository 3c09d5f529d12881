// How the NVIDIA backends lay out a caller's workspace: the pointer is aligned up before use and every region starts
// at a multiple of kWorkspaceAlign (cudaMalloc's own alignment, so any vector or double2 region is aligned). A
// workspace size therefore counts kWorkspaceAlign once for the caller's pointer plus each region rounded up.
#ifndef INFINI_DEVICES_NVIDIA_WORKSPACE_H
#define INFINI_DEVICES_NVIDIA_WORKSPACE_H

#include <cstddef>
#include <cstdint>

namespace nvidia {

constexpr size_t kWorkspaceAlign = 256;

inline size_t alignUp(size_t bytes) { return (bytes + kWorkspaceAlign - 1) / kWorkspaceAlign * kWorkspaceAlign; }

// The first aligned byte of the caller's workspace.
inline char *alignedBase(void *workspace) {
    return reinterpret_cast<char *>(alignUp(reinterpret_cast<uintptr_t>(workspace)));
}

} // namespace nvidia

#endif
