// How a row kernel's elementwise pass runs: whether it streams its output (never changing a result), which row
// it reduces alongside, and which it fetches.
#ifndef INFINI_DEVICES_CPU_ROW_HINTS_H
#define INFINI_DEVICES_CPU_ROW_HINTS_H

#include <cstddef>
#include <cstdint>

namespace cpu {

// Outputs of at least this many bytes are streamed past the caches (simd::storeStream): a consumer could not
// find them there anyway. Smaller ones stay cached for it.
constexpr size_t kStreamOutputBytes = size_t(8) << 20;
// Contiguous runs of at least this many bytes are long: aligning each for the streamed stores (a padded
// partial vector at its head) costs little against the run.
constexpr size_t kLongRunBytes = 4096;

// Whether to stream an output of total_bytes written in contiguous runs of run_bytes: large, in long runs.
inline bool streamLongRuns(size_t total_bytes, size_t run_bytes) {
    return total_bytes >= kStreamOutputBytes && run_bytes >= kLongRunBytes;
}

// The same, but runs of any length also stream when they are all aligned for the streamed stores (16 elements of
// element_bytes, simd::kWidth) from `out`.
inline bool streamOutput(const void *out, size_t total_bytes, size_t run_bytes, size_t element_bytes) {
    const size_t vector_bytes = 16 * element_bytes;
    const bool runs_aligned = reinterpret_cast<uintptr_t>(out) % vector_bytes == 0 && run_bytes % vector_bytes == 0;
    return streamLongRuns(total_bytes, run_bytes) || (total_bytes >= kStreamOutputBytes && runs_aligned);
}

template <typename T>
struct RowHints {
    bool stream_output = false;             // write the output past the caches: it is large, not read again soon
    // The next row's two inputs, reduced during this pass (NULL: none): the pass reads this row from the caches,
    // and would leave DRAM idle if the next one were not read meanwhile.
    const T *next_a = nullptr, *next_b = nullptr;
    // The same elements of the row after next, fetched into L2 during this pass (NULL: none).
    const T *fetch_a = nullptr, *fetch_b = nullptr;
};

} // namespace cpu

#endif
