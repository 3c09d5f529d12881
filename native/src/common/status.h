// Status plumbing shared by every exported function.
#ifndef INFINI_COMMON_STATUS_H
#define INFINI_COMMON_STATUS_H

#include "infinicore.h"

#include <new>

#define INFINI_CHECK(expr)                                                                                             \
    do {                                                                                                               \
        infiniStatus_t status_ = (expr);                                                                               \
        if (status_ != INFINI_STATUS_SUCCESS) return status_;                                                          \
    } while (0)

namespace infini {

// No C++ exception may cross the C boundary: every exported function runs its body through this.
template <typename Body>
infiniStatus_t guarded(Body &&body) noexcept {
    try {
        return body();
    } catch (...) {
        return INFINI_STATUS_INTERNAL_ERROR;
    }
}

} // namespace infini

#endif
