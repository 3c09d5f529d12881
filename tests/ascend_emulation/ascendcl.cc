// Emulated libascendcl: the ACL runtime calls the backend makes, on host memory (device memory is host memory).
// Checks what the runtime documents: aclInit before use, a device set on the calling thread before allocating or
// creating streams and events, device ids in range, copy sizes within destMax.
// Streams are asynchronous, as on the NPU, and adversarially so: each stream has a worker thread, but queued
// work runs only when someone synchronizes (the stream, an event recorded on it, or its device). So a caller
// that frees or reads what queued work uses before synchronizing is caught every time, never by timing; and a
// stream destroyed with work not yet synchronized is refused, as CANN's restrictions ask.
// aclrtFree gives memory back at once, with no implicit synchronization, as the real one does: the block is
// poisoned (0xff bytes: NaN) and kept out of reuse, and queued work that touches it fails its stream with
// ACL_ERROR_RT_AICORE_EXCEPTION at the next synchronization.
#include "emulation.h"

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

using namespace emu;

namespace {

bool initialized = false;
thread_local int current_device = -1;

uint32_t deviceCount() {
    const char *value = std::getenv("ASCEND_EMULATION_DEVICE_COUNT");
    return value == nullptr ? 1u : static_cast<uint32_t>(std::atoi(value));
}

// ---------------------------------------------------------------- memory

struct Block {
    size_t bytes;
    int device; // -1: host (aclrtMallocHost)
};

std::mutex memory_mutex;
std::map<const char *, Block> live_blocks, freed_blocks; // by start address

bool overlaps(const std::map<const char *, Block> &blocks, const char *begin, size_t bytes) {
    auto after = blocks.upper_bound(begin + bytes - 1); // first block starting past the range
    if (after == blocks.begin()) return false;
    auto block = std::prev(after);
    return block->first + block->second.bytes > begin;
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
    std::memset(ptr, 0xff, block->second.bytes);
    freed_blocks.insert(*block); // never reused, so a late access is always seen (test processes are short)
    live_blocks.erase(block);
    return kSuccess;
}

// ---------------------------------------------------------------- streams

class Stream {
  public:
    explicit Stream(int device) : device(device), worker_([this] { work(); }) {}
    ~Stream() { stop(); }

    const int device;

    // Queues a task; returns its position (1-based) in the stream's order.
    uint64_t push(std::function<int()> task) {
        std::lock_guard<std::mutex> lock(mutex_);
        queue_.push_back(std::move(task));
        return ++queued_;
    }
    uint64_t queued() {
        std::lock_guard<std::mutex> lock(mutex_);
        return queued_;
    }
    bool reached(uint64_t position) {
        std::lock_guard<std::mutex> lock(mutex_);
        return done_ >= position;
    }
    bool idle() { return reached(queued()); }
    // Lets the worker run everything up to `position`, waits for it, and returns (and clears) the stream's error.
    int waitFor(uint64_t position) {
        std::unique_lock<std::mutex> lock(mutex_);
        released_ = std::max(released_, position);
        changed_.notify_all();
        changed_.wait(lock, [&] { return done_ >= position; });
        int error = error_;
        error_ = kSuccess;
        return error;
    }
    int drain() { return waitFor(queued()); }
    // Lets the worker run everything up to `position` and waits for it; the stream's error stays for its owner.
    void reach(uint64_t position) {
        std::unique_lock<std::mutex> lock(mutex_);
        released_ = std::max(released_, position);
        changed_.notify_all();
        changed_.wait(lock, [&] { return done_ >= position; });
    }
    void stop() {
        {
            std::lock_guard<std::mutex> lock(mutex_);
            if (stopping_) return;
            released_ = queued_;
            stopping_ = true;
        }
        changed_.notify_all();
        worker_.join();
    }

  private:
    void work() {
        std::unique_lock<std::mutex> lock(mutex_);
        for (;;) {
            changed_.wait(lock, [&] { return done_ < released_ || (stopping_ && done_ == queued_); });
            if (done_ == released_) return; // stopping, with nothing left
            std::function<int()> task = std::move(queue_.front());
            queue_.pop_front();
            lock.unlock();
            int status = task();
            lock.lock();
            if (status != kSuccess && error_ == kSuccess) error_ = status;
            ++done_;
            changed_.notify_all();
        }
    }

    std::mutex mutex_;
    std::condition_variable changed_;
    std::deque<std::function<int()>> queue_;
    uint64_t queued_ = 0, released_ = 0, done_ = 0;
    int error_ = kSuccess;
    bool stopping_ = false;
    std::thread worker_;
};

// Registries are never destroyed: a worker thread must not be joined from static destructors at exit.
std::mutex streams_mutex;
auto &created_streams = *new std::map<aclrtStream, std::shared_ptr<Stream>>;
auto &default_streams = *new std::map<int, std::shared_ptr<Stream>>;

// The stream a handle names (NULL: the current device's default one), or nullptr.
std::shared_ptr<Stream> streamOf(aclrtStream stream) {
    std::lock_guard<std::mutex> lock(streams_mutex);
    if (stream != nullptr) {
        auto found = created_streams.find(stream);
        return found == created_streams.end() ? nullptr : found->second;
    }
    if (current_device < 0) return nullptr;
    std::shared_ptr<Stream> &fallback = default_streams[current_device];
    if (!fallback) fallback = std::make_shared<Stream>(current_device);
    return fallback;
}

// A stream usable by the calling thread: a current device, and the stream on it.
int usableStream(aclrtStream handle, std::shared_ptr<Stream> *out) {
    if (current_device < 0) return kContextNull;
    std::shared_ptr<Stream> stream = streamOf(handle);
    if (!stream) return kInvalidParam;
    if (stream->device != current_device) return kStreamContext;
    *out = std::move(stream);
    return kSuccess;
}

struct Event {
    std::shared_ptr<Stream> stream; // kept alive past aclrtDestroyStream, as an event outlives its stream
    uint64_t position = 0;          // the stream's work queued when it was recorded
};

int copyNow(void *dst, size_t dest_max, const void *src, size_t count, int kind) {
    if (dst == nullptr || src == nullptr || count > dest_max || kind < 0 || kind > 3) return kInvalidParam;
    std::memmove(dst, src, count);
    return kSuccess;
}

} // namespace

namespace emu {

int enqueue(aclrtStream handle, std::function<int()> task) {
    std::shared_ptr<Stream> stream;
    int status = usableStream(handle, &stream);
    if (status == kSuccess) stream->push(std::move(task));
    return status;
}

bool touchesFreed(const void *begin, size_t bytes) {
    if (begin == nullptr || bytes == 0) return false;
    std::lock_guard<std::mutex> lock(memory_mutex);
    return overlaps(freed_blocks, static_cast<const char *>(begin), bytes);
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

typedef void *aclrtEvent;

aclError aclInit(const char *) {
    if (initialized) return kRepeatInitialize;
    initialized = true;
    return kSuccess;
}

// The SoC's name: ASCEND_EMULATION_SOC (an Atlas A2 one by default; set but empty: the query fails, NULL).
const char *aclrtGetSocName() {
    const char *name = std::getenv("ASCEND_EMULATION_SOC");
    if (name == nullptr) return "Ascend910B1";
    return *name == '\0' ? nullptr : name;
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

// Waits for every stream of the current device.
aclError aclrtSynchronizeDevice() {
    if (current_device < 0) return kContextNull;
    std::vector<std::shared_ptr<Stream>> streams;
    {
        std::lock_guard<std::mutex> lock(streams_mutex);
        for (const auto &entry : created_streams) streams.push_back(entry.second);
        auto fallback = default_streams.find(current_device);
        if (fallback != default_streams.end()) streams.push_back(fallback->second);
    }
    int error = kSuccess;
    for (const std::shared_ptr<Stream> &stream : streams) {
        if (stream->device != current_device) continue;
        int status = stream->drain();
        if (error == kSuccess) error = status;
    }
    return error;
}

aclError aclrtCreateStream(aclrtStream *stream) {
    if (stream == nullptr) return kInvalidParam;
    if (current_device < 0) return kContextNull;
    auto created = std::make_shared<Stream>(current_device);
    std::lock_guard<std::mutex> lock(streams_mutex);
    *stream = created.get();
    created_streams[*stream] = std::move(created);
    return kSuccess;
}

// CANN asks callers to synchronize the stream first, in its own device's context: refused otherwise.
aclError aclrtDestroyStream(aclrtStream stream) {
    if (current_device < 0) return kContextNull;
    std::shared_ptr<Stream> destroyed;
    {
        std::lock_guard<std::mutex> lock(streams_mutex);
        auto found = created_streams.find(stream);
        if (stream == nullptr || found == created_streams.end()) return kInvalidParam;
        if (found->second->device != current_device) return kStreamContext;
        if (!found->second->idle()) return kInvalidParam;
        destroyed = std::move(found->second);
        created_streams.erase(found);
    }
    destroyed->stop();
    return kSuccess;
}

aclError aclrtSynchronizeStream(aclrtStream stream) {
    std::shared_ptr<Stream> found = streamOf(stream);
    if (!found) return stream == nullptr ? kContextNull : kInvalidParam;
    return found->drain();
}

aclError aclrtCreateEvent(aclrtEvent *event) {
    if (event == nullptr) return kInvalidParam;
    if (current_device < 0) return kContextNull;
    *event = new Event;
    return kSuccess;
}

aclError aclrtDestroyEvent(aclrtEvent event) {
    if (event == nullptr) return kInvalidParam;
    delete static_cast<Event *>(event);
    return kSuccess;
}

aclError aclrtRecordEvent(aclrtEvent event, aclrtStream stream) {
    if (event == nullptr) return kInvalidParam;
    std::shared_ptr<Stream> target;
    int status = usableStream(stream, &target);
    if (status != kSuccess) return status;
    auto *recorded = static_cast<Event *>(event);
    recorded->position = target->queued();
    recorded->stream = std::move(target);
    return kSuccess;
}

// An event never recorded is complete, as documented.
aclError aclrtSynchronizeEvent(aclrtEvent event) {
    if (event == nullptr) return kInvalidParam;
    auto *recorded = static_cast<Event *>(event);
    return recorded->stream ? recorded->stream->waitFor(recorded->position) : kSuccess;
}

// *status: ACL_EVENT_RECORDED_STATUS_COMPLETE (1) once the work before the record ran, else NOT_READY (0).
aclError aclrtQueryEventStatus(aclrtEvent event, int *status) {
    if (event == nullptr || status == nullptr) return kInvalidParam;
    auto *recorded = static_cast<Event *>(event);
    *status = !recorded->stream || recorded->stream->reached(recorded->position) ? 1 : 0;
    return kSuccess;
}

// The stream's later work waits for the event's stream to reach the record (an event never recorded: no wait).
aclError aclrtStreamWaitEvent(aclrtStream stream, aclrtEvent event) {
    if (event == nullptr) return kInvalidParam;
    auto *recorded = static_cast<Event *>(event);
    std::shared_ptr<Stream> waited = recorded->stream;
    const uint64_t position = recorded->position;
    return emu::enqueue(stream, [waited, position] {
        if (waited) waited->reach(position);
        return kSuccess;
    });
}

aclError aclrtMalloc(void **ptr, size_t size, int) { return allocate(ptr, size, current_device); }
aclError aclrtMallocHost(void **ptr, size_t size) { return allocate(ptr, size, -1); }
aclError aclrtFree(void *ptr) { return release(ptr, false); }
aclError aclrtFreeHost(void *ptr) { return release(ptr, true); }

aclError aclrtMemcpy(void *dst, size_t dest_max, const void *src, size_t count, int kind) {
    return copyNow(dst, dest_max, src, count, kind);
}

aclError aclrtMemcpyAsync(void *dst, size_t dest_max, const void *src, size_t count, int kind, aclrtStream stream) {
    if (dst == nullptr || src == nullptr || count > dest_max || kind < 0 || kind > 3) return kInvalidParam;
    return enqueue(stream, [=] {
        if (touchesFreed(dst, count) || touchesFreed(src, count)) return kTaskException;
        return copyNow(dst, dest_max, src, count, kind);
    });
}

aclError aclrtMemset(void *ptr, size_t max_count, int32_t value, size_t count) {
    if (ptr == nullptr || count > max_count) return kInvalidParam;
    std::memset(ptr, value, count);
    return kSuccess;
}

aclError aclrtMemsetAsync(void *ptr, size_t max_count, int32_t value, size_t count, aclrtStream stream) {
    if (ptr == nullptr || count > max_count) return kInvalidParam;
    return enqueue(stream, [=] {
        if (touchesFreed(ptr, count)) return kTaskException;
        std::memset(ptr, value, count);
        return kSuccess;
    });
}

} // extern "C"
