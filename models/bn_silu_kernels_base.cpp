// The fused BN+SiLU loops for baseline x86-64; flags in models/CMakeLists.txt.
#define YOLO8_BN_SILU_ISA base
#include "models/bn_silu_kernels.inc"
