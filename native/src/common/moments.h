// The biased variance of a row or channel from its sums, one rule for every backend's forward.
#ifndef INFINI_COMMON_MOMENTS_H
#define INFINI_COMMON_MOMENTS_H

#include "common/host_device.h"

// mean(d^2) - mean(d)^2 of values d = x - shift (any shift near the mean keeps the difference exact enough).
// Rounding may leave it below 0, which is clamped; a NaN (a row or channel holding inf or NaN) stays NaN, so its
// rstd / invstd is NaN, as torch's is.
INFINI_HOST_DEVICE inline double biasedVariance(double mean_of_squares, double mean_offset) {
    const double variance = mean_of_squares - mean_offset * mean_offset;
    return variance < 0.0 ? 0.0 : variance;
}

#endif
