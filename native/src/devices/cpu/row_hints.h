// How a row kernel's elementwise pass runs: whether it streams its output (never changing a result), which row
// it reduces alongside, and which it fetches.
#ifndef INFINI_DEVICES_CPU_ROW_HINTS_H
#define INFINI_DEVICES_CPU_ROW_HINTS_H

#include <cstddef>
#include <cstdint>

namespace cpu {

// Elements a streamed store writes (simd::kWidth): its address must be aligned to as many elements.
constexpr size_t kStreamElements = 16;
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

// The same, but runs of any length also stream when they are all aligned for the streamed stores (kStreamElements
// of element_bytes) from `out`.
inline bool streamOutput(const void *out, size_t total_bytes, size_t run_bytes, size_t element_bytes) {
    const size_t vector_bytes = kStreamElements * element_bytes;
    const bool runs_aligned = reinterpret_cast<uintptr_t>(out) % vector_bytes == 0 && run_bytes % vector_bytes == 0;
    return streamLongRuns(total_bytes, run_bytes) || (total_bytes >= kStreamOutputBytes && runs_aligned);
}

// Rows shorter than kLongRunBytes stream their output from this many bytes, more than kStreamOutputBytes: calls back
// to back on a smaller x and y find much of them in the caches, and streamed stores would send y to DRAM instead.
// Streamed against cached, 2 threads, A/B in alternating processes, back to back: LayerNorm forward F32 rows of 16,
// a 16 MiB y took 1.45x as long on an AVX2 EPYC with 32 MiB of L3, 32 MiB 0.87x there. On an AVX-512 Xeon with
// cpu::runRows fencing once per thread's run of rows or row block (2026-12-06): 16 MiB 1.03-1.14x (LayerNorm
// forward F32 32768x128, BF16 131072x64, RMSNorm forward and backward F32 65536x64), 32 MiB 0.93-0.98x forward
// (LayerNorm F32 65536x128 and 131072x64, BF16 65536x256 and 262144x64) and 0.71-0.72x backward (LayerNorm F32
// 65536x128, RMSNorm F32 131072x64), 48 MiB 0.70x (LayerNorm forward F32 98304x128). A fence per group of 16 rows
// of 16 had doubled the time of a 32 MiB y. tests/test_streamed_short_rows.py and test_streamed_rows.py write
// outputs of this size.
constexpr size_t kStreamShortRowsBytes = size_t(32) << 20;

// Whether short rows of dim elements can stream their output `out` (NULL: none, nothing to hold back): not in place
// over their input `in` (there is no read for ownership to save), each row whole vectors for the streamed stores
// (kStreamElements of element_bytes), the first aligned for them and every other a whole number of them from it
// (rows_aligned). Whether they do is RowPlan::streams'.
inline bool shortRowsStreamable(const void *out, const void *in, size_t dim, size_t element_bytes, bool rows_aligned) {
    const bool out_aligned = reinterpret_cast<uintptr_t>(out) % (kStreamElements * element_bytes) == 0;
    return out == nullptr || (out != in && out_aligned && dim % kStreamElements == 0 && rows_aligned);
}

// Streamed stores are weakly ordered: make this thread's visible before anyone else may read the output. An x86
// sfence (baseline SSE), so that code built for any ISA can fence what the simd code of its ISA streamed.
inline void fenceStreams() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_sfence();
#endif
}

template <typename T>
struct RowHints {
    // Write the output past the caches: it is large, not read again soon. The kernel does not fence: its caller
    // does once per run of rows (cpu::runRows), as a fence per row of 512 bytes nearly tripled the time.
    bool stream_output = false;
    // The next row's two inputs, reduced during this pass (NULL: none): the pass reads this row from the caches,
    // and would leave DRAM idle if the next one were not read meanwhile.
    const T *next_a = nullptr, *next_b = nullptr;
    // The same elements of the row after next, fetched into L2 during this pass (NULL: none).
    const T *fetch_a = nullptr, *fetch_b = nullptr;
};

} // namespace cpu

#endif
