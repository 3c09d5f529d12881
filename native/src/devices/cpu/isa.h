// Which instruction set the CPU kernels use, chosen once per process from what the CPU supports.
#ifndef INFINI_DEVICES_CPU_ISA_H
#define INFINI_DEVICES_CPU_ISA_H

namespace cpu {

enum class Isa { generic, avx2, avx512 };

// The best ISA this CPU supports; INFINIOP_CPU_ISA=generic|avx2|avx512 asks for a lower one (for testing
// every path on one machine); asking for more than the CPU has gives what it has.
Isa selectedIsa();

// The kernel table of the selected ISA, from one table per ISA built in (all three on x86-64).
template <typename Table>
const Table &pickIsa(const Table &avx512, const Table &avx2, const Table &generic) {
    switch (selectedIsa()) {
    case Isa::avx512: return avx512;
    case Isa::avx2: return avx2;
    default: return generic;
    }
}

} // namespace cpu

#endif
