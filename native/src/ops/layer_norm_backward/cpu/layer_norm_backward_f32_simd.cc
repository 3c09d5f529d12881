// This ISA's LayerNorm backward tables for F32 data (layer_norm_backward_simd_kernels.h).
#include "layer_norm_backward_simd_kernels.h"

namespace cpu {
#if SIMD_NON_BF16_TABLES
LAYER_NORM_BACKWARD_ISA_TABLE(float, float)
#endif
} // namespace cpu
