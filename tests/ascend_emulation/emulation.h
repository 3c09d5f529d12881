// Test-only emulation of the documented CANN contract (ACL runtime + aclnn operators) on host memory.
// Not the runtime: it exists so the Ascend backend's calls can be checked without Ascend hardware.
// Shared by the emulated libraries: the object layouts, the element access helpers, and the few hooks
// libascendcl exports to the operator libraries (streams, the freed-memory check).
#ifndef ASCEND_EMULATION_H
#define ASCEND_EMULATION_H

#include <cstdint>
#include <cstring>
#include <functional>
#include <vector>

extern "C" {
typedef int aclError;
typedef int32_t aclnnStatus;
typedef void *aclrtStream;
const char *aclrtGetSocName(); // the emulated libascendcl's; the operator libraries read the product from it
}

namespace emu {

// Documented status codes.
constexpr int kSuccess = 0;
constexpr int kInvalidParam = 100000;     // ACL_ERROR_INVALID_PARAM
constexpr int kUninitialized = 100001;    // ACL_ERROR_UNINITIALIZE
constexpr int kRepeatInitialize = 100002; // ACL_ERROR_REPEAT_INITIALIZE
constexpr int kInvalidDevice = 107001;    // ACL_ERROR_RT_INVALID_DEVICEID
constexpr int kContextNull = 107002;      // ACL_ERROR_RT_CONTEXT_NULL
constexpr int kStreamContext = 107003;    // ACL_ERROR_RT_STREAM_CONTEXT: a stream of another device
constexpr int kBadAlloc = 200000;         // ACL_ERROR_BAD_ALLOC
constexpr int kParamNullptr = 161001;     // ACLNN_ERR_PARAM_NULLPTR
constexpr int kParamInvalid = 161002;     // ACLNN_ERR_PARAM_INVALID
constexpr int kRuntimeError = 361001;     // ACLNN_ERR_RUNTIME_ERROR: a runtime call inside aclnn failed
constexpr int kInner = 561000;            // ACLNN_ERR_INNER
constexpr int kTilingError = 561002;      // ACLNN_ERR_INNER_TILING_ERROR: where CANN's kernels check shapes
constexpr int kInnerNullptr = 561103;     // executor is a null pointer
constexpr int kTaskException = 507015;    // ACL_ERROR_RT_AICORE_EXCEPTION: a queued kernel failed

// aclDataType / aclFormat values used here.
enum DataType { kFloat = 0, kFloat16 = 1, kDouble = 11, kBf16 = 27 };
enum Format { kNchw = 0, kNd = 2, kNcdhw = 30, kNc = 35, kNcl = 47 };

} // namespace emu

struct aclTensor {
    std::vector<int64_t> shape, strides, storage;
    int dtype;
    int format;
    int64_t offset;
    void *data;
};
struct aclIntArray {
    std::vector<int64_t> values;
};
struct aclBoolArray {
    std::vector<bool> values;
};
struct aclScalar {
    double value;
};
// Like the real one, an executor captures its tensors (addresses included) when planned; only
// aclSetInputTensorAddr / aclSetOutputTensorAddr change the captured addresses afterwards.
struct aclOpExecutor {
    std::vector<const aclTensor *> inputs, outputs; // identities, for the re-pointing checks
    std::vector<aclTensor> captured;                // inputs then outputs, as planned
    std::function<void(aclTensor *captured)> compute;
    uint64_t workspace = 0;
    bool repeatable = false;
    int device = -1; // current when planned: launches must run there
};

namespace emu {

// Exported by the emulated libascendcl for the operator libraries (the real ones share a runtime too).
// Queues `task` on `stream` (NULL: the current device's default stream) to run on that stream's worker
// when someone synchronizes; a non-zero result is the stream's error, reported by that synchronization.
// Refused (non-zero) without a current device or for a stream of another device.
int enqueue(aclrtStream stream, std::function<int()> task);
// Whether [begin, begin + bytes) overlaps device memory already given back with aclrtFree.
bool touchesFreed(const void *begin, size_t bytes);
// The device current on this thread, or -1 (aclrtGetDevice's answer, without its status).
int currentDevice();
// Whether `data` lies in a block aclrtMalloc gave out on a device other than `device`.
bool onOtherDevice(const void *data, int device);

inline bool isFloat(int dtype) { return dtype == kFloat || dtype == kFloat16 || dtype == kBf16; }
inline size_t dtypeBits(int dtype) { return dtype == kFloat ? 32 : 16; }

inline int64_t numel(const aclTensor *t) {
    int64_t n = 1;
    for (int64_t d : t->shape) n *= d;
    return n;
}

// Bytes from a tensor's data pointer to the end of the furthest element its view reaches (0 when empty).
inline size_t spanBytes(const aclTensor *t) {
    if (t->data == nullptr || numel(t) == 0) return 0;
    int64_t last = t->offset;
    for (size_t i = 0; i < t->shape.size(); ++i) last += (t->shape[i] - 1) * t->strides[i];
    return static_cast<size_t>(last + 1) * dtypeBits(t->dtype) / 8;
}

inline bool isContiguous(const aclTensor *t) {
    int64_t expected = 1;
    for (size_t i = t->shape.size(); i-- > 0;) {
        if (t->shape[i] != 1 && t->strides[i] != expected) return false;
        expected *= t->shape[i];
    }
    return true;
}

// Element offset of the flat row-major index `flat` of the view.
inline int64_t elementOffset(const aclTensor *t, int64_t flat) {
    int64_t offset = t->offset;
    for (size_t i = t->shape.size(); i-- > 0;) {
        int64_t extent = t->shape[i];
        offset += (flat % extent) * t->strides[i];
        flat /= extent;
    }
    return offset;
}

inline double load(const aclTensor *t, int64_t flat) {
    int64_t at = elementOffset(t, flat);
    switch (t->dtype) {
    case kFloat: return static_cast<const float *>(t->data)[at];
    case kFloat16: return static_cast<float>(static_cast<const _Float16 *>(t->data)[at]);
    default: {
        uint32_t bits = static_cast<uint32_t>(static_cast<const uint16_t *>(t->data)[at]) << 16;
        float value;
        std::memcpy(&value, &bits, 4);
        return value;
    }
    }
}

inline void store(aclTensor *t, int64_t flat, double value) {
    int64_t at = elementOffset(t, flat);
    float f = static_cast<float>(value);
    switch (t->dtype) {
    case kFloat: static_cast<float *>(t->data)[at] = f; break;
    case kFloat16: static_cast<_Float16 *>(t->data)[at] = static_cast<_Float16>(f); break;
    default: {
        uint32_t bits;
        std::memcpy(&bits, &f, 4);
        if ((bits & 0x7fffffffu) > 0x7f800000u) {
            bits = 0x7fc00000u; // NaN stays NaN
        } else {
            bits += 0x7fffu + ((bits >> 16) & 1u); // round to nearest even
        }
        static_cast<uint16_t *>(t->data)[at] = static_cast<uint16_t>(bits >> 16);
    }
    }
}

} // namespace emu

#endif
