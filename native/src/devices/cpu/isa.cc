#include "isa.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace cpu {
namespace {

struct IsaName {
    const char *name;
    Isa isa;
};
// The names INFINIOP_CPU_ISA takes and infiniopGetCpuIsaEx gives.
constexpr IsaName kIsaNames[] = {
    {"avx512bf16", Isa::avx512bf16}, {"avx512", Isa::avx512}, {"avx2", Isa::avx2}, {"generic", Isa::generic}};

Isa supportedIsa() {
#if defined(__x86_64__) && defined(INFINI_CPU_MULTI_ISA)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq")) {
        return __builtin_cpu_supports("avx512bf16") ? Isa::avx512bf16 : Isa::avx512;
    }
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c")) {
        return Isa::avx2;
    }
#endif
    return Isa::generic;
}

Isa requestedIsa() {
    const char *name = std::getenv("INFINIOP_CPU_ISA");
    if (name == nullptr || *name == '\0') return Isa::avx512bf16;
    for (const IsaName &known : kIsaNames) {
        if (std::strcmp(name, known.name) == 0) return known.isa;
    }
    // A misspelt name must not quietly select the scalar kernels, several times slower than the others.
    std::fprintf(stderr, "infiniop: INFINIOP_CPU_ISA=%s is not avx512bf16, avx512, avx2 or generic; using the best "
                         "ISA the CPU has\n", name);
    return Isa::avx512bf16;
}

} // namespace

Isa selectedIsa() {
    static const Isa isa = [] {
        Isa supported = supportedIsa(), requested = requestedIsa();
        return requested < supported ? requested : supported;
    }();
    return isa;
}

const char *isaName(Isa isa) {
    for (const IsaName &known : kIsaNames) {
        if (known.isa == isa) return known.name;
    }
    return "generic";
}

} // namespace cpu
