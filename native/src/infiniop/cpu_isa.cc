// infiniopGetCpuIsaEx here, in the shared library's own files: the backends' static libraries export nothing
// (--exclude-libs).
#include "infiniop/cpu_isa.h"

#include "common/status.h"
#ifdef ENABLE_CPU_API
#include "devices/cpu/isa.h"
#endif

__C infiniStatus_t infiniopGetCpuIsaEx(const char **name) {
    return infini::guarded([&] {
        if (name == nullptr) return INFINI_STATUS_NULL_POINTER;
#ifdef ENABLE_CPU_API
        *name = cpu::isaName(cpu::selectedIsa());
        return INFINI_STATUS_SUCCESS;
#else
        return INFINI_STATUS_DEVICE_TYPE_NOT_SUPPORTED;
#endif
    });
}
