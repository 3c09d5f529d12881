// BatchNorm forward on NVIDIA GPUs: not implemented yet (issue 54). Create returns NOT_IMPLEMENTED, so callers
// learn it before any run.
#include "../batch_norm.h"

namespace op::batch_norm {

infiniStatus_t Backends::nvidia(const Info &, int, Descriptor **) { return INFINI_STATUS_NOT_IMPLEMENTED; }

} // namespace op::batch_norm
