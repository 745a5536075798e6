// The fused BN+SiLU loops for AVX512; flags in models/CMakeLists.txt.
#define YOLO8_BN_SILU_ISA avx512
#include "models/bn_silu_kernels.inc"
