// Emulated libnnopbase: aclTensor / aclIntArray / aclBoolArray / aclScalar objects and executor reuse.
// Documented checks: non-negative strides, a view that fits its storage, and for re-pointing a repeatable
// executor an index in range (absent optional tensors count), a tensor that was not nullptr when planned
// (161002) and a 32-byte aligned address. The emulation also requires the tensor passed
// with an index to be the one the executor was planned with at that index (the documented intent).
// aclSetAclOpExecutorRepeatable fails for some executors, as CANN's does in some modes, so callers' fallback is
// exercised: ASCEND_EMULATION_NO_REPEATABLE=1 refuses every executor, =0 none, and unset every second one (so a
// plan mixes reused and re-planned calls).
#include "emulation.h"

#include <atomic>
#include <cstdlib>

using namespace emu;

namespace {

int setAddress(aclOpExecutor *executor, size_t index, aclTensor *tensor, void *addr, bool output) {
    if (executor == nullptr || tensor == nullptr) return kInnerNullptr;
    const std::vector<const aclTensor *> &tensors = output ? executor->outputs : executor->inputs;
    if (!executor->repeatable || index >= tensors.size() || tensors[index] != tensor) return kParamInvalid;
    if (reinterpret_cast<uintptr_t>(addr) % 32 != 0) return kParamInvalid;
    executor->captured[(output ? executor->inputs.size() : 0) + index].data = addr;
    return kSuccess;
}

} // namespace

extern "C" {

aclTensor *aclCreateTensor(const int64_t *view_dims, uint64_t view_dims_num, int dtype, const int64_t *stride,
                           int64_t offset, int format, const int64_t *storage_dims, uint64_t storage_dims_num,
                           void *data) {
    if ((view_dims_num > 0 && (view_dims == nullptr || stride == nullptr)) || view_dims_num > 8) return nullptr;
    if (storage_dims_num > 0 && storage_dims == nullptr) return nullptr;
    auto *t = new aclTensor{{view_dims, view_dims + view_dims_num},
                            {stride, stride + view_dims_num},
                            {storage_dims, storage_dims + storage_dims_num},
                            dtype,
                            format,
                            offset,
                            data};
    // The furthest element the view reaches must lie inside its storage.
    int64_t storage = 1, last = offset;
    bool empty = false;
    for (int64_t d : t->storage) storage *= d;
    for (size_t i = 0; i < view_dims_num; ++i) {
        if (t->shape[i] < 0 || t->strides[i] < 0 || offset < 0) {
            delete t;
            return nullptr;
        }
        if (t->shape[i] == 0) empty = true;
        else last += (t->shape[i] - 1) * t->strides[i];
    }
    if (!empty && last >= storage) {
        delete t;
        return nullptr;
    }
    return t;
}

aclnnStatus aclDestroyTensor(const aclTensor *tensor) {
    delete tensor;
    return kSuccess;
}

aclIntArray *aclCreateIntArray(const int64_t *value, uint64_t size) {
    if (value == nullptr && size > 0) return nullptr;
    return new aclIntArray{std::vector<int64_t>(value, value + size)};
}

aclnnStatus aclDestroyIntArray(const aclIntArray *array) {
    delete array;
    return kSuccess;
}

aclBoolArray *aclCreateBoolArray(const bool *value, uint64_t size) {
    if (value == nullptr && size > 0) return nullptr;
    return new aclBoolArray{std::vector<bool>(value, value + size)};
}

aclnnStatus aclDestroyBoolArray(const aclBoolArray *array) {
    delete array;
    return kSuccess;
}

// A host scalar, copied when created; FLOAT and DOUBLE are the types this emulation's callers use.
aclScalar *aclCreateScalar(void *value, int dtype) {
    if (value == nullptr) return nullptr;
    if (dtype == kFloat) return new aclScalar{*static_cast<const float *>(value)};
    if (dtype == kDouble) return new aclScalar{*static_cast<const double *>(value)};
    return nullptr;
}

aclnnStatus aclDestroyScalar(const aclScalar *scalar) {
    delete scalar;
    return kSuccess;
}

aclnnStatus aclSetAclOpExecutorRepeatable(aclOpExecutor *executor) {
    if (executor == nullptr) return kInnerNullptr;
    static std::atomic<unsigned> asked{0};
    const char *refuse = std::getenv("ASCEND_EMULATION_NO_REPEATABLE");
    bool refused = refuse == nullptr ? asked++ % 2 == 1 : std::atoi(refuse) != 0;
    if (refused) return kInner;
    executor->repeatable = true;
    return kSuccess;
}

aclnnStatus aclDestroyAclOpExecutor(aclOpExecutor *executor) {
    delete executor;
    return kSuccess;
}

aclnnStatus aclSetInputTensorAddr(aclOpExecutor *executor, size_t index, aclTensor *tensor, void *addr) {
    return setAddress(executor, index, tensor, addr, false);
}

aclnnStatus aclSetOutputTensorAddr(aclOpExecutor *executor, size_t index, aclTensor *tensor, void *addr) {
    return setAddress(executor, index, tensor, addr, true);
}

} // extern "C"
