// This ISA's LayerNorm backward tables for F16 data (layer_norm_backward_simd_kernels.h).
#include "layer_norm_backward_simd_kernels.h"

namespace cpu {
#if SIMD_NON_BF16_TABLES
LAYER_NORM_BACKWARD_ISA_TABLE(f16_t, float)
LAYER_NORM_BACKWARD_ISA_TABLE(f16_t, f16_t)
#endif
} // namespace cpu
