// RMSNorm forward on Ascend: not implemented yet (aclnnRmsNorm(x, gamma, eps, yOut, rstdOut) is the building
// block, issue 54). Create returns NOT_IMPLEMENTED, so callers learn it before any run.
#include "../rms_norm.h"

namespace op::rms_norm {

infiniStatus_t Backends::ascend(const Info &, int, Descriptor **) { return INFINI_STATUS_NOT_IMPLEMENTED; }

} // namespace op::rms_norm
