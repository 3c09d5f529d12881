// Emulated libascendcl: the ACL runtime calls the backend makes, on host memory. Device memory is host memory,
// streams are tokens, every call is synchronous. Checks what the runtime documents: aclInit before use, a
// device set on the calling thread before allocation, device ids in range, copy sizes within destMax.
#include "emulation.h"

#include <cstdlib>
#include <mutex>
#include <set>

using namespace emu;

namespace {

bool initialized = false;
thread_local int current_device = -1;
std::mutex memory_mutex;
std::set<void *> device_blocks, host_blocks;

uint32_t deviceCount() {
    const char *value = std::getenv("ASCEND_EMULATION_DEVICE_COUNT");
    return value == nullptr ? 1u : static_cast<uint32_t>(std::atoi(value));
}

int allocate(void **ptr, size_t size, std::set<void *> &blocks) {
    if (ptr == nullptr || size == 0) return kInvalidParam;
    if (!initialized) return kUninitialized;
    if (current_device < 0) return kContextNull;
    void *block = std::aligned_alloc(512, (size + 511) / 512 * 512);
    if (block == nullptr) return kBadAlloc;
    std::lock_guard<std::mutex> lock(memory_mutex);
    blocks.insert(block);
    *ptr = block;
    return kSuccess;
}

int release(void *ptr, std::set<void *> &blocks) {
    std::lock_guard<std::mutex> lock(memory_mutex);
    if (ptr == nullptr || blocks.erase(ptr) == 0) return kInvalidParam; // not from the matching malloc
    std::free(ptr);
    return kSuccess;
}

} // namespace

extern "C" {

aclError aclInit(const char *) {
    if (initialized) return kRepeatInitialize;
    initialized = true;
    return kSuccess;
}

aclError aclrtGetDeviceCount(uint32_t *count) {
    if (count == nullptr) return kInvalidParam;
    *count = deviceCount();
    return kSuccess;
}

aclError aclrtSetDevice(int32_t device_id) {
    if (!initialized) return kUninitialized;
    if (device_id < 0 || static_cast<uint32_t>(device_id) >= deviceCount()) return kInvalidDevice;
    current_device = device_id;
    return kSuccess;
}

aclError aclrtSynchronizeDevice() { return current_device < 0 ? kContextNull : kSuccess; }

aclError aclrtCreateStream(aclrtStream *stream) {
    if (stream == nullptr) return kInvalidParam;
    if (current_device < 0) return kContextNull;
    *stream = new int(current_device);
    return kSuccess;
}

aclError aclrtDestroyStream(aclrtStream stream) {
    if (stream == nullptr) return kInvalidParam;
    delete static_cast<int *>(stream);
    return kSuccess;
}

aclError aclrtSynchronizeStream(aclrtStream) { return kSuccess; }

aclError aclrtMalloc(void **ptr, size_t size, int) { return allocate(ptr, size, device_blocks); }
aclError aclrtMallocHost(void **ptr, size_t size) { return allocate(ptr, size, host_blocks); }
aclError aclrtFree(void *ptr) { return release(ptr, device_blocks); }
aclError aclrtFreeHost(void *ptr) { return release(ptr, host_blocks); }

aclError aclrtMemcpy(void *dst, size_t dest_max, const void *src, size_t count, int kind) {
    if (dst == nullptr || src == nullptr || count > dest_max || kind < 0 || kind > 3) return kInvalidParam;
    std::memmove(dst, src, count);
    return kSuccess;
}

aclError aclrtMemcpyAsync(void *dst, size_t dest_max, const void *src, size_t count, int kind, aclrtStream) {
    return aclrtMemcpy(dst, dest_max, src, count, kind);
}

aclError aclrtMemset(void *ptr, size_t max_count, int32_t value, size_t count) {
    if (ptr == nullptr || count > max_count) return kInvalidParam;
    std::memset(ptr, value, count);
    return kSuccess;
}

aclError aclrtMemsetAsync(void *ptr, size_t max_count, int32_t value, size_t count, aclrtStream) {
    return aclrtMemset(ptr, max_count, value, count);
}

} // extern "C"
