// The fused BN+SiLU loops for autocast's bfloat16 activations, channels-last rows whose channel count is a multiple
// of 16: one 512-bit vector is 16 channels of one row. Values are read as bfloat16, computed in float and written
// back rounded to nearest even (vcvtneps2bf16). Built with AVX512-BF16 flags (models/CMakeLists.txt) and called only
// where the CPU has it, which is also where CPU autocast runs in bfloat16 (trainer/core/autocast.h).
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "models/bn_silu_kernels.h"

namespace yolo8 {
namespace {

constexpr int64_t kLanes = 16;
// Float partial sums cover this many rows before they are added into double: 16 bfloat16 values (8 significant
// bits) and their squares (16) add up in float's 24 bits without loss unless their magnitudes differ a lot.
constexpr int64_t kRowsPerFloatSum = 16;

inline __m512 load_bf16(const uint16_t* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

inline void store_bf16(uint16_t* p, __m512 v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v)));
}

// exp(v) as 2^n · p(r), Cephes' polynomial on the reduced argument; callers keep v under 80 (scalef takes a very
// negative v to 0).
inline __m512 exp_ps(__m512 v) {
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(v, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), v);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(p, n);
}

// 1 / (1 + exp(-z)). Below -80 the sigmoid is under 2e-35 and taken there, so that exp(-z) stays finite (the
// reciprocal step would turn an infinity into NaN); above, exp(-z) only shrinks and scalef takes it to 0.
inline __m512 sigmoid_ps(__m512 z) {
  const __m512 clamped = _mm512_max_ps(z, _mm512_set1_ps(-80.0f));
  const __m512 d = _mm512_add_ps(_mm512_set1_ps(1.0f), exp_ps(_mm512_sub_ps(_mm512_setzero_ps(), clamped)));
  const __m512 r = _mm512_rcp14_ps(d);  // then one Newton step: full float precision
  return _mm512_mul_ps(r, _mm512_fnmadd_ps(d, r, _mm512_set1_ps(2.0f)));
}

// d silu(z) / dz = s · (1 + z · (1 − s)), s = sigmoid(z).
inline __m512 silu_grad_ps(__m512 z) {
  const __m512 s = sigmoid_ps(z);
  const __m512 one = _mm512_set1_ps(1.0f);
  return _mm512_mul_ps(s, _mm512_fmadd_ps(z, _mm512_sub_ps(one, s), one));
}

// Adds a float vector's 16 lanes into 16 doubles in memory.
inline void add_to_doubles(double* out, __m512 v) {
  const __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(v));
  const __m512d hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
  _mm512_storeu_pd(out, _mm512_add_pd(_mm512_loadu_pd(out), lo));
  _mm512_storeu_pd(out + 8, _mm512_add_pd(_mm512_loadu_pd(out + 8), hi));
}

// Per channel, for each vector of 16 channels: float sums over runs of kRowsPerFloatSum rows, added into `a`, `b`
// in row order. `terms(row_pointer_offset)` returns the pair of values to add for one row.
template <typename Terms>
void channel_vector_sums(int64_t rows, int64_t c, double* a, double* b, Terms terms) {
  for (int64_t j = 0; j < c; j += kLanes) {
    for (int64_t r0 = 0; r0 < rows; r0 += kRowsPerFloatSum) {
      __m512 sa = _mm512_setzero_ps(), sb = _mm512_setzero_ps();
      const int64_t r1 = std::min(rows, r0 + kRowsPerFloatSum);
      for (int64_t r = r0; r < r1; ++r) terms(r * c + j, j, sa, sb);
      add_to_doubles(a + j, sa);
      add_to_doubles(b + j, sb);
    }
  }
}

void rows_stats(const uint16_t* x, int64_t rows, int64_t c, double* sum, double* sq) {
  channel_vector_sums(rows, c, sum, sq, [x](int64_t at, int64_t, __m512& s, __m512& q) {
    const __m512 v = load_bf16(x + at);
    s = _mm512_add_ps(s, v);
    q = _mm512_fmadd_ps(v, v, q);
  });
}

void rows_forward(const uint16_t* x, uint16_t* y, int64_t rows, int64_t c, const float* alpha, const float* beta) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < c; j += kLanes) {
      const int64_t at = r * c + j;
      const __m512 z = _mm512_fmadd_ps(load_bf16(x + at), _mm512_loadu_ps(alpha + j), _mm512_loadu_ps(beta + j));
      store_bf16(y + at, _mm512_mul_ps(z, sigmoid_ps(z)));
    }
  }
}

void rows_backward_sums(const uint16_t* x, const uint16_t* gy, int64_t rows, int64_t c, const float* alpha,
                        const float* beta, const float* mean, double* sum_g, double* sum_gx, float* g_out) {
  channel_vector_sums(rows, c, sum_g, sum_gx, [&](int64_t at, int64_t j, __m512& sg, __m512& sx) {
    // upstream gradient times SiLU's derivative at the recomputed BN output
    const __m512 xv = load_bf16(x + at);
    const __m512 z = _mm512_fmadd_ps(xv, _mm512_loadu_ps(alpha + j), _mm512_loadu_ps(beta + j));
    const __m512 g = _mm512_mul_ps(load_bf16(gy + at), silu_grad_ps(z));
    _mm512_storeu_ps(g_out + at, g);
    sg = _mm512_add_ps(sg, g);
    sx = _mm512_fmadd_ps(g, _mm512_sub_ps(xv, _mm512_loadu_ps(mean + j)), sx);
  });
}

void rows_backward_input(const uint16_t* x, const float* g, uint16_t* gx, int64_t rows, int64_t c, const float* mean,
                         const float* proj, const float* grad_mean, const float* scale) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < c; j += kLanes) {
      const int64_t at = r * c + j;
      // (g - (x - mean) * proj - grad_mean) * scale
      const __m512 centred = _mm512_sub_ps(load_bf16(x + at), _mm512_loadu_ps(mean + j));
      const __m512 inner = _mm512_sub_ps(_mm512_fnmadd_ps(centred, _mm512_loadu_ps(proj + j), _mm512_loadu_ps(g + at)),
                                         _mm512_loadu_ps(grad_mean + j));
      store_bf16(gx + at, _mm512_mul_ps(inner, _mm512_loadu_ps(scale + j)));
    }
  }
}

}  // namespace

const BnSiluBf16Kernels& bn_silu_bf16_kernels_avx512() {
  static const BnSiluBf16Kernels kernels{rows_stats, rows_forward, rows_backward_sums, rows_backward_input};
  return kernels;
}

}  // namespace yolo8
