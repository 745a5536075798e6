#pragma once
// The fused BN+SiLU loops (models/bn_silu_kernels.inc), one table per instruction set. Channels-last data
// is `rows` rows of c channels (per-channel arrays); contiguous data is one channel's plane of s values.
// The *_sums functions add into their double outputs.
#include <cstdint>

namespace yolo8 {

struct BnSiluKernels {
  void (*rows_stats)(const float* x, int64_t rows, int64_t c, double* sum, double* sq);
  void (*rows_forward)(const float* x, float* y, int64_t rows, int64_t c, const float* alpha, const float* beta);
  void (*rows_backward_sums)(const float* x, const float* gy, int64_t rows, int64_t c, const float* alpha,
                             const float* beta, const float* mean, double* sum_g, double* sum_gx);
  void (*rows_backward_input)(const float* x, const float* gy, float* gx, int64_t rows, int64_t c, const float* alpha,
                              const float* beta, const float* mean, const float* proj, const float* grad_mean,
                              const float* scale);
  void (*plane_stats)(const float* x, int64_t s, double* sum, double* sq);
  void (*plane_forward)(const float* x, float* y, int64_t s, float alpha, float beta);
  void (*plane_backward_sums)(const float* x, const float* gy, int64_t s, float alpha, float beta, float mean,
                              double* sum_g, double* sum_gx);
  void (*plane_backward_input)(const float* x, const float* gy, float* gx, int64_t s, float alpha, float beta,
                               float mean, float proj, float grad_mean, float scale);
};

// The same passes on bfloat16 storage (autocast's activations), channels-last rows only, c a multiple of 16.
// The backward's first pass keeps the gradient at the BN output in float (`g`, one value per x) for the second,
// which then needs no second sigmoid.
struct BnSiluBf16Kernels {
  void (*rows_stats)(const uint16_t* x, int64_t rows, int64_t c, double* sum, double* sq);
  void (*rows_forward)(const uint16_t* x, uint16_t* y, int64_t rows, int64_t c, const float* alpha, const float* beta);
  void (*rows_backward_sums)(const uint16_t* x, const uint16_t* gy, int64_t rows, int64_t c, const float* alpha,
                             const float* beta, const float* mean, double* sum_g, double* sum_gx, float* g);
  void (*rows_backward_input)(const uint16_t* x, const float* g, uint16_t* gx, int64_t rows, int64_t c,
                              const float* mean, const float* proj, const float* grad_mean, const float* scale);
};

const BnSiluKernels& bn_silu_kernels_base();
const BnSiluKernels& bn_silu_kernels_avx2();
const BnSiluKernels& bn_silu_kernels_avx512();
// The widest set this machine runs (AVX-512, AVX2+FMA, else baseline), chosen once.
const BnSiluKernels& bn_silu_kernels();
// The bfloat16 loops (AVX512-BF16); null on a CPU without it.
const BnSiluBf16Kernels* bn_silu_bf16_kernels();
#if defined(__x86_64__)
const BnSiluBf16Kernels& bn_silu_bf16_kernels_avx512();
#endif

}  // namespace yolo8
