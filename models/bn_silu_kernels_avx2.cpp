// The fused BN+SiLU loops for AVX2; flags in models/CMakeLists.txt.
#define YOLO8_BN_SILU_ISA avx2
#include "models/bn_silu_kernels.inc"
