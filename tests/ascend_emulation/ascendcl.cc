// Emulated libascendcl: the ACL runtime calls the backend makes, on host memory. Device memory is host memory,
// streams are tokens of their device, every call is synchronous. Checks what the runtime documents: aclInit
// before use, a device set on the calling thread before allocation, device ids in range, copy sizes within
// destMax; and that work runs on the current device, on a stream of that device, touching no other device's
// memory (CANN's state is per thread).
#include "emulation.h"

#include <cstdlib>
#include <map>
#include <mutex>

using namespace emu;

namespace {

bool initialized = false;
thread_local int current_device = -1;
struct Block {
    size_t bytes;
    int device; // -1: host (aclrtMallocHost)
};

std::mutex memory_mutex;
std::map<const char *, Block> live_blocks; // by start address

uint32_t deviceCount() {
    const char *value = std::getenv("ASCEND_EMULATION_DEVICE_COUNT");
    return value == nullptr ? 1u : static_cast<uint32_t>(std::atoi(value));
}

int allocate(void **ptr, size_t size, int device) {
    if (ptr == nullptr || size == 0) return kInvalidParam;
    if (!initialized) return kUninitialized;
    if (current_device < 0) return kContextNull;
    size_t bytes = (size + 511) / 512 * 512;
    void *block = std::aligned_alloc(512, bytes);
    if (block == nullptr) return kBadAlloc;
    std::lock_guard<std::mutex> lock(memory_mutex);
    live_blocks[static_cast<const char *>(block)] = {bytes, device};
    *ptr = block;
    return kSuccess;
}

int release(void *ptr, bool host) {
    std::lock_guard<std::mutex> lock(memory_mutex);
    auto block = live_blocks.find(static_cast<const char *>(ptr));
    if (ptr == nullptr || block == live_blocks.end() || (block->second.device < 0) != host) {
        return kInvalidParam; // not from the matching malloc
    }
    live_blocks.erase(block);
    std::free(ptr);
    return kSuccess;
}

} // namespace

namespace emu {

int enqueue(aclrtStream stream, std::function<int()> task) {
    if (current_device < 0) return kContextNull;
    if (stream != nullptr && *static_cast<int *>(stream) != current_device) return kStreamContext;
    return task();
}

int currentDevice() { return current_device; }

bool onOtherDevice(const void *data, int device) {
    std::lock_guard<std::mutex> lock(memory_mutex);
    auto after = live_blocks.upper_bound(static_cast<const char *>(data));
    if (after == live_blocks.begin()) return false;
    auto block = std::prev(after);
    bool inside = block->first + block->second.bytes > static_cast<const char *>(data);
    return inside && block->second.device >= 0 && block->second.device != device;
}

} // namespace emu

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

aclError aclrtGetDevice(int32_t *device_id) {
    if (device_id == nullptr) return kInvalidParam;
    if (current_device < 0) return kContextNull;
    *device_id = current_device;
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

aclError aclrtMalloc(void **ptr, size_t size, int) { return allocate(ptr, size, current_device); }
aclError aclrtMallocHost(void **ptr, size_t size) { return allocate(ptr, size, -1); }
aclError aclrtFree(void *ptr) { return release(ptr, false); }
aclError aclrtFreeHost(void *ptr) { return release(ptr, true); }

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
