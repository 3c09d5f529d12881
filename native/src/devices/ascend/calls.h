// The elementwise aclnn calls the plans add around the norm operators, each reading and writing TensorSpecs. An
// operator this CANN install lacks leaves its call without a launch: the plan's build is then NOT_IMPLEMENTED.
#ifndef INFINI_DEVICES_ASCEND_CALLS_H
#define INFINI_DEVICES_ASCEND_CALLS_H

#include "plan.h"

namespace ascend {

// to = from converted to to's dtype (aclnnCast).
void addCast(Plan &plan, const TensorSpec &from, const TensorSpec &to);

// to = 1/sqrt(from + eps): aclnnRsqrt, after aclnnAdds into a workspace copy when eps > 0. `from` is F32.
void addInverseSqrt(Plan &plan, const TensorSpec &from, double eps, const TensorSpec &to);

// to = dividend / divisor, broadcasting (aclnnDiv); to may take any type the promoted one converts to.
void addDiv(Plan &plan, const TensorSpec &dividend, const TensorSpec &divisor, const TensorSpec &to);

} // namespace ascend

#endif
