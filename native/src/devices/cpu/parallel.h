// Static work sharing over [0, count): the same task always covers the same indices, so results that are
// combined per task in a fixed order do not depend on the number of threads.
#ifndef INFINI_DEVICES_CPU_PARALLEL_H
#define INFINI_DEVICES_CPU_PARALLEL_H

#include <cstddef>
#include <cstdint>

#ifdef ENABLE_OMP
#include <omp.h>
#endif

namespace cpu {

#ifdef ENABLE_OMP
// A process forked after this library started OpenMP threads has none of them, and GNU OpenMP waits forever for
// them in the child's first parallel region. Such a child runs every operator on its calling thread, as
// PyTorch's CPU operators do after a fork (parallel.cc notes the start and the fork).
bool forkedAfterThreadsStarted();
void noteThreadsStarted();
#endif

inline size_t maxThreads() {
#ifdef ENABLE_OMP
    return forkedAfterThreadsStarted() ? 1 : static_cast<size_t>(omp_get_max_threads());
#else
    return 1;
#endif
}

// Elements of streaming work worth a thread of their own: below it, waking a thread and joining it (and, on a
// loaded machine, waiting for its time slice) costs more than the split saves.
constexpr size_t kMinThreadElements = 32768;

// The threads to run `elements` of work on: one per kMinThreadElements, at least one, at most maxThreads().
inline size_t threadsFor(size_t elements) {
    const size_t wanted = elements / kMinThreadElements, most = maxThreads();
    return wanted < 1 ? 1 : wanted < most ? wanted : most;
}

// body(i, slot) for i in [0, count) on at most `slots` threads, slot < slots being the calling thread's: scratch
// sized for `slots` when the work was planned stays private to one thread however many the caller allows now.
template <typename Body>
void parallelForSlots(size_t count, size_t slots, Body &&body) {
    const int64_t n = static_cast<int64_t>(count);
#ifdef ENABLE_OMP
    const int threads = static_cast<int>(slots < maxThreads() ? slots : maxThreads());
    if (threads > 1 && n > 1) { // one thread never enters the OpenMP runtime (see forkedAfterThreadsStarted)
        noteThreadsStarted();
#pragma omp parallel for schedule(static) num_threads(threads)
        for (int64_t i = 0; i < n; ++i) body(static_cast<size_t>(i), static_cast<size_t>(omp_get_thread_num()));
        return;
    }
#endif
    for (int64_t i = 0; i < n; ++i) body(static_cast<size_t>(i), size_t(0));
}

// body(i) for i in [0, count) on at most `threads` threads.
template <typename Body>
void parallelFor(size_t count, Body &&body, size_t threads = maxThreads()) {
    parallelForSlots(count, threads, [&](size_t i, size_t) { body(i); });
}

// body(thread, threads) once on each of at most `threads` threads of one parallel region (on the caller alone
// for one); barrier() inside it waits for all of them.
template <typename Body>
void parallelRegion(size_t threads, Body &&body) {
#ifdef ENABLE_OMP
    const int wanted = static_cast<int>(threads < maxThreads() ? threads : maxThreads());
    if (wanted > 1) {
        noteThreadsStarted();
#pragma omp parallel num_threads(wanted)
        body(static_cast<size_t>(omp_get_thread_num()), static_cast<size_t>(omp_get_num_threads()));
        return;
    }
#endif
    body(size_t(0), size_t(1));
}

// Only inside parallelRegion's body (outside an OpenMP region, on one thread, it has nobody to wait for).
inline void barrier() {
#ifdef ENABLE_OMP
    if (omp_in_parallel()) {
#pragma omp barrier
    }
#endif
}

// Fixed-size groups of consecutive items: the unit whose partial sums are kept, independent of threads.
struct Blocks {
    size_t per_block;
    size_t count;

    // At most max_blocks groups of at least one item each.
    static Blocks split(size_t items, size_t max_blocks) {
        if (items == 0) return Blocks{1, 0};
        size_t per_block = (items + max_blocks - 1) / max_blocks;
        return Blocks{per_block, (items + per_block - 1) / per_block};
    }

    // Groups of exactly per_block items (the last may be shorter).
    static Blocks ofSize(size_t items, size_t per_block) { return Blocks{per_block, (items + per_block - 1) / per_block}; }

    size_t begin(size_t block) const { return block * per_block; }
    size_t end(size_t block, size_t items) const {
        size_t stop = begin(block) + per_block;
        return stop < items ? stop : items;
    }
};

} // namespace cpu

#endif
