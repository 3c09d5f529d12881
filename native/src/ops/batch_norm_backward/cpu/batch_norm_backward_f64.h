// BatchNorm backward with F64 activations: F64 throughout, for reference-grade use; scalar, either layout.
#ifndef INFINIOP_SRC_OPS_BATCH_NORM_BACKWARD_CPU_F64_H
#define INFINIOP_SRC_OPS_BATCH_NORM_BACKWARD_CPU_F64_H

#include "batch_norm_backward_channels.h"

namespace op::batch_norm_backward {

// One channel per task, its sums taken in (n, l) order: results do not depend on the thread count.
// grad_input may be grad_output; NULL in the reduce phase.
void runF64(const Info &info, const Phase &phase, const ChannelVectors &vectors, double *grad_input,
            const double *input, const double *grad_output);

} // namespace op::batch_norm_backward

#endif
