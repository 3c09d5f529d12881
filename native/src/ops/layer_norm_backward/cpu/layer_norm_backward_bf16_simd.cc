// This ISA's LayerNorm backward tables for BF16 data (layer_norm_backward_simd_kernels.h).
#include "layer_norm_backward_simd_kernels.h"

namespace cpu {
LAYER_NORM_BACKWARD_ISA_TABLE(bf16_t, float)
LAYER_NORM_BACKWARD_ISA_TABLE(bf16_t, bf16_t)
} // namespace cpu
