// The two phases every emulated aclnn operator shares (opapi_nn.cc, opapi_math.cc): plan() captures the
// tensors and the computation in an executor on the current device; launch() queues it on a stream.
#ifndef ASCEND_EMULATION_OPAPI_H
#define ASCEND_EMULATION_OPAPI_H

#include "emulation.h"

#include <cstdlib>
#include <utility>
#include <vector>

namespace emu {

constexpr uint64_t kWorkspace = 96; // every op asks for some, to exercise the caller's plumbing

// Internal linkage throughout: several operator libraries built from this header may be loaded at once.

// An absent optional tensor (nullptr) keeps its position, captured as an empty placeholder.
static const aclTensor kAbsent{{0}, {1}, {0}, kFloat, kNd, 0, nullptr};

// ASCEND_EMULATION_TILING_MAX_COLS: the longest reduced length the norm kernels' tiling takes (unset: any), so
// a caller can meet the 561002 a real kernel answers for a shape it cannot tile.
static inline bool tilable(int64_t length) {
    const char *limit = std::getenv("ASCEND_EMULATION_TILING_MAX_COLS");
    return limit == nullptr || length <= std::atoll(limit);
}

// Captures the tensors (inputs then outputs, in prototype order) for `compute`, which reads them by position.
// CANN's first phase queries the current device's context: none is ACLNN_ERR_RUNTIME_ERROR.
// Built with ASCEND_EMULATION_DECOY, it is a stale library that must never be preferred: every call fails.
static inline int plan(std::vector<const aclTensor *> inputs, std::vector<const aclTensor *> outputs,
                       std::function<void(aclTensor *)> compute, uint64_t *workspace, aclOpExecutor **executor) {
#ifdef ASCEND_EMULATION_DECOY
    return kInner;
#endif
    if (currentDevice() < 0) return kRuntimeError;
    auto *ex = new aclOpExecutor;
    ex->inputs = inputs;
    ex->outputs = outputs;
    for (const auto *group : {&inputs, &outputs}) {
        for (const aclTensor *t : *group) ex->captured.push_back(t != nullptr ? *t : kAbsent);
    }
    ex->compute = std::move(compute);
    ex->workspace = kWorkspace;
    ex->device = currentDevice();
    *workspace = kWorkspace;
    *executor = ex;
    return kSuccess;
}

// Queues the executor's kernel on `stream`, with its tensors as they are now (a later re-pointing changes the
// next launch only). It must run on the device it was planned on; when it runs, it fails its stream if it would
// touch freed memory or another device's, else scribbles over its workspace (no caller may rely on its contents)
// and computes. A one-shot executor is consumed by its launch.
static inline int launch(void *workspace, uint64_t size, aclOpExecutor *ex, aclrtStream stream) {
    if (ex == nullptr) return kInnerNullptr;
    if (size < ex->workspace || (ex->workspace > 0 && workspace == nullptr)) return kParamInvalid;
    for (const aclTensor &t : ex->captured) {
        if (numel(&t) > 0 && t.data == nullptr) return kParamNullptr;
    }
    if (currentDevice() != ex->device) return kRuntimeError;
    std::vector<aclTensor> tensors = ex->captured;
    const std::function<void(aclTensor *)> compute = ex->compute;
    const uint64_t bytes = ex->workspace;
    const int device = ex->device;
    int status = enqueue(stream, [tensors, compute, workspace, bytes, device]() mutable {
        for (const aclTensor &t : tensors) {
            if (touchesFreed(t.data, spanBytes(&t)) || (t.data && onOtherDevice(t.data, device))) {
                return kTaskException;
            }
        }
        if (touchesFreed(workspace, bytes) || (workspace && onOtherDevice(workspace, device))) return kTaskException;
        std::memset(workspace, 0xab, bytes);
        compute(tensors.data());
        return kSuccess;
    });
    if (!ex->repeatable) delete ex;
    return status == kSuccess ? kSuccess : kRuntimeError;
}

} // namespace emu

// Defines the second phase of aclnn operator `name`: every one is the same launch.
#define EMULATED_SECOND_PHASE(name)                                                                            \
    aclnnStatus name(void *workspace, uint64_t size, aclOpExecutor *ex, aclrtStream stream) {                 \
        return emu::launch(workspace, size, ex, stream);                                                       \
    }

#endif
