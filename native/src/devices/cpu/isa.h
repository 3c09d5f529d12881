// Which instruction set the CPU kernels use, chosen once per process from what the CPU supports.
#ifndef INFINI_DEVICES_CPU_ISA_H
#define INFINI_DEVICES_CPU_ISA_H

#include "half.h"

#include <type_traits>

namespace cpu {

// In order of preference. avx512bf16 differs from avx512 only in converting F32 to BF16 with one instruction.
enum class Isa { generic, avx2, avx512, avx512bf16 };

// Whether a kernel table deals in BF16 (has bf16_t among its template arguments). Only those are built for
// avx512bf16 (simd.h's SIMD_NON_BF16_TABLES): the others would compile to avx512's code, so they are avx512's.
template <typename Table>
struct HasBf16 : std::false_type {};
template <template <typename...> class Kernels, typename... Types>
struct HasBf16<Kernels<Types...>> : std::bool_constant<(std::is_same_v<Types, bf16_t> || ...)> {};

// The best ISA this CPU supports; INFINIOP_CPU_ISA=generic|avx2|avx512|avx512bf16 asks for a lower one (for testing
// every path on one machine); asking for more than the CPU has gives what it has. Empty is unset; any other value
// is reported on stderr and ignored.
Isa selectedIsa();

// The name INFINIOP_CPU_ISA takes for it ("avx512bf16", ...), a static string.
const char *isaName(Isa isa);

// A table of kernel functions compiled for one ISA: each *_simd.cc file, built once per ISA, specializes
// this for its own ISA (x86-64 builds all four, avx512bf16 only for HasBf16 tables; other machines only generic).
template <Isa isa, typename Table>
const Table &isaTable();

// The table of the ISA selected for this process.
template <typename Table>
const Table &selectedTable() {
#ifdef INFINI_CPU_MULTI_ISA
    switch (selectedIsa()) {
    case Isa::avx512bf16:
        if constexpr (HasBf16<Table>::value) return isaTable<Isa::avx512bf16, Table>();
        return isaTable<Isa::avx512, Table>();
    case Isa::avx512: return isaTable<Isa::avx512, Table>();
    case Isa::avx2: return isaTable<Isa::avx2, Table>();
    default: break;
    }
#endif
    return isaTable<Isa::generic, Table>();
}

} // namespace cpu

#endif
