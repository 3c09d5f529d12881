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

// to = 1/from^2 - eps, the variance whose 1/sqrt(var + eps) `from` is: aclnnDiv twice (std = 1/from, then
// std / from) and aclnnAdds(-eps) when eps > 0. `from` is F32. Each step rounds to F32, so var + eps keeps F32's
// relative precision (a few ulps) but var alone does not where it is small beside eps: below about eps * 1e-7 it
// is lost (may come out 0 or slightly negative). What reads it adds eps back, so that costs it nothing more.
void addVarianceOfInverseSqrt(Plan &plan, const TensorSpec &from, double eps, const TensorSpec &to);

// A (1,) F32 constant one, to broadcast (the plan's constants).
TensorSpec oneConstant(Plan &plan);

// to = dividend / divisor, broadcasting (aclnnDiv); to may take any type the promoted one converts to.
void addDiv(Plan &plan, const TensorSpec &dividend, const TensorSpec &divisor, const TensorSpec &to);

} // namespace ascend

#endif
