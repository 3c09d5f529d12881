// BatchNorm forward on Ascend: not implemented yet (aclnnBatchNorm is the building block, issue 54). Create
// returns NOT_IMPLEMENTED, so callers learn it before any run.
#include "../batch_norm.h"

namespace op::batch_norm {

infiniStatus_t Backends::ascend(const Info &, int, Descriptor **) { return INFINI_STATUS_NOT_IMPLEMENTED; }

} // namespace op::batch_norm
