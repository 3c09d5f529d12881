#ifndef INFINIOP_CPU_ISA_H
#define INFINIOP_CPU_ISA_H

#include "../infinicore.h"

/* Ex. The instruction set of this process's CPU kernels: *name is set to a static string, "avx512bf16",
 * "avx512", "avx2" or "generic". Chosen once per process, at the first call of any CPU operator or of this
 * function: the best the CPU has, or the lower one INFINIOP_CPU_ISA names. NULL name: NULL_POINTER. */
__C __export infiniStatus_t infiniopGetCpuIsaEx(const char **name);

#endif /* INFINIOP_CPU_ISA_H */
