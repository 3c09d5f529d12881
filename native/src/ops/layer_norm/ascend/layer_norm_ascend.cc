// LayerNorm forward on Ascend: not implemented yet (aclnnLayerNorm(input, normalizedShape, weight, bias, eps, out,
// meanOut, rstdOut) is the building block, issue 54). Create returns NOT_IMPLEMENTED, so callers learn it before
// any run.
#include "../layer_norm.h"

namespace op::layer_norm {

infiniStatus_t Backends::ascend(const Info &, int, Descriptor **) { return INFINI_STATUS_NOT_IMPLEMENTED; }

} // namespace op::layer_norm
