/* infiniop: umbrella header of the operator library. */
#ifndef INFINIOP_H
#define INFINIOP_H

#include "infiniop/handle.h"
#include "infiniop/cpu_isa.h"
#include "infiniop/tensor_descriptor.h"
#include "infiniop/operator_descriptor.h"
#include "infiniop/ops/batch_norm.h"
#include "infiniop/ops/rms_norm.h"
#include "infiniop/ops/rms_norm_backward.h"
#include "infiniop/ops/layer_norm.h"
#include "infiniop/ops/layer_norm_backward.h"
#include "infiniop/ops/batch_norm_backward.h"

#endif /* INFINIOP_H */
