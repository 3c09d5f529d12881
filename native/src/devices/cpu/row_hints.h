// How a row kernel's elementwise pass treats memory: decided per descriptor and row, never changing a result.
#ifndef INFINI_DEVICES_CPU_ROW_HINTS_H
#define INFINI_DEVICES_CPU_ROW_HINTS_H

namespace cpu {

template <typename T>
struct RowHints {
    bool stream_output = false;             // write the output past the caches: it is large, not read again soon
    const T *next_a = nullptr, *next_b = nullptr; // the next row's two inputs, to fetch ahead (NULL: none)
};

} // namespace cpu

#endif
