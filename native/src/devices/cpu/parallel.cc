// Whether this process is a child forked after the library started OpenMP threads (parallel.h).
#include "parallel.h"

#ifdef ENABLE_OMP
#include <atomic>

#include <pthread.h>

namespace cpu {
namespace {

std::atomic<bool> threads_started{false}, forked_after_start{false};

void onForkInChild() {
    if (threads_started.load(std::memory_order_relaxed)) forked_after_start.store(true, std::memory_order_relaxed);
}

// Registered when the library is loaded; the handler runs in every child of fork() (os.fork, multiprocessing's
// fork start method, DataLoader workers), in the forking thread, before fork returns there.
[[maybe_unused]] const int registered = pthread_atfork(nullptr, nullptr, onForkInChild);

} // namespace

bool forkedAfterThreadsStarted() { return forked_after_start.load(std::memory_order_relaxed); }

void noteThreadsStarted() {
    if (!threads_started.load(std::memory_order_relaxed)) threads_started.store(true, std::memory_order_relaxed);
}

} // namespace cpu
#endif
