// The HSV kernels for CPUs with AVX2 and FMA but no AVX-512 VBMI (AMD Zen 1-3, Intel before Ice Lake): the same
// arithmetic as the AVX-512 kernels in pixel_kernels.cpp, 16 pixels a step in registers, with the three gain tables
// looked up byte by byte (AVX2 has no 256-entry byte permute, and its gathers are slower than plain loads on these
// chips). Compiled with -ffp-contract=off, like pixel_kernels.cpp, so that only the two products OpenCV's AVX2
// build fuses are fused here.
#include <algorithm>
#include <cstdint>

#include "data/pixel_kernels.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define YOLO8_PIXEL_AVX2 1
#endif

namespace yolo8::data {

#ifdef YOLO8_PIXEL_AVX2

namespace {

#define YOLO8_AVX2_TARGET __attribute__((target("avx2,fma")))

constexpr int kShift = 12;  // OpenCV's hsv_shift
constexpr int kHalf = 1 << (kShift - 1);
constexpr float kSatNumerator = 255 << kShift;        // sdiv_table[v] = round(255 * 4096 / v)
constexpr float kHueNumerator = (180 << kShift) / 6;  // hdiv_table[d] = round(180 * 4096 / 6d)
constexpr int64_t kBlock = 16;                        // pixels per step: one pshufb split

// pshufb masks between 16 interleaved BGR pixels (three 16-byte chunks) and three 16-byte planes.
struct Shuffles {
  alignas(16) uint8_t split[3][3][16];  // [plane c][chunk q]: lane i <- byte 3i + c - 16q of chunk q, else zero
  alignas(16) uint8_t merge[3][3][16];  // [chunk q][plane c]: byte j of chunk q <- pixel (16q + j) / 3 of plane c
  Shuffles() {
    for (int c = 0; c < 3; ++c)
      for (int q = 0; q < 3; ++q)
        for (int i = 0; i < 16; ++i) {
          const int at = 3 * i + c - 16 * q;
          split[c][q][i] = at >= 0 && at < 16 ? static_cast<uint8_t>(at) : 0x80;
        }
    for (int q = 0; q < 3; ++q)
      for (int c = 0; c < 3; ++c)
        for (int j = 0; j < 16; ++j) {
          const int at = 16 * q + j;
          merge[q][c][j] = at % 3 == c ? static_cast<uint8_t>(at / 3) : 0x80;
        }
  }
};

const Shuffles& shuffles() {
  static const Shuffles s;
  return s;
}

// Three channels of 8 pixels, one 32-bit lane each.
struct Lanes8 {
  __m256i c[3];
};

struct Kernel {
  __m128i split[3][3], merge[3][3];

  YOLO8_AVX2_TARGET Kernel() {
    const Shuffles& s = shuffles();
    for (int a = 0; a < 3; ++a)
      for (int b = 0; b < 3; ++b) {
        split[a][b] = _mm_load_si128(reinterpret_cast<const __m128i*>(s.split[a][b]));
        merge[a][b] = _mm_load_si128(reinterpret_cast<const __m128i*>(s.merge[a][b]));
      }
  }

  // 16 interleaved pixels (48 bytes) -> the 32-bit lanes of pixels 0..7 and 8..15, and back. Everything stays in
  // registers: planes written byte by byte and read back whole would stall on store forwarding.
  YOLO8_AVX2_TARGET void load(const uint8_t* p, Lanes8& lo, Lanes8& hi) const {
    const __m128i q0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    const __m128i q1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16));
    const __m128i q2 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 32));
    for (int c = 0; c < 3; ++c) {
      const __m128i plane =
          _mm_or_si128(_mm_or_si128(_mm_shuffle_epi8(q0, split[c][0]), _mm_shuffle_epi8(q1, split[c][1])),
                       _mm_shuffle_epi8(q2, split[c][2]));
      lo.c[c] = _mm256_cvtepu8_epi32(plane);
      hi.c[c] = _mm256_cvtepu8_epi32(_mm_srli_si128(plane, 8));
    }
  }
  YOLO8_AVX2_TARGET void store(uint8_t* p, const Lanes8& lo, const Lanes8& hi) const {
    __m128i plane[3];
    for (int c = 0; c < 3; ++c) {
      // Lanes hold 0..255: 32 -> 16 bits (the two halves' 128-bit lanes interleaved, put back in order) -> 8 bits.
      const __m256i words = _mm256_permute4x64_epi64(_mm256_packus_epi32(lo.c[c], hi.c[c]), 0xD8);
      plane[c] = _mm_packus_epi16(_mm256_castsi256_si128(words), _mm256_extracti128_si256(words, 1));
    }
    for (int q = 0; q < 3; ++q) {
      const __m128i x =
          _mm_or_si128(_mm_or_si128(_mm_shuffle_epi8(plane[0], merge[q][0]), _mm_shuffle_epi8(plane[1], merge[q][1])),
                       _mm_shuffle_epi8(plane[2], merge[q][2]));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(p + 16 * q), x);
    }
  }
};

YOLO8_AVX2_TARGET inline __m256i to_byte_range(__m256i x) {
  return _mm256_min_epi32(_mm256_max_epi32(x, _mm256_setzero_si256()), _mm256_set1_epi32(255));
}

// (num * round(numerator / index) + half) >> shift, 0 where index is 0: OpenCV's division tables computed in
// place, as the AVX-512 kernel does (a float quotient rounds to the tables' integer; tested on every input).
YOLO8_AVX2_TARGET inline __m256i scaled(__m256i num, __m256i index, float numerator) {
  const __m256 quotient = _mm256_div_ps(_mm256_set1_ps(numerator), _mm256_cvtepi32_ps(index));
  const __m256i nonzero = _mm256_cmpgt_epi32(index, _mm256_setzero_si256());
  const __m256i div = _mm256_and_si256(_mm256_cvtps_epi32(quotient), nonzero);
  return _mm256_srai_epi32(_mm256_add_epi32(_mm256_mullo_epi32(num, div), _mm256_set1_epi32(kHalf)), kShift);
}

// table[index] for 8 lanes: plain byte loads (a gather is slower than these on the chips this file is for).
YOLO8_AVX2_TARGET inline __m256i lookup(const uint8_t* table, __m256i index) {
  alignas(32) int32_t i[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(i), index);
  return _mm256_setr_epi32(table[i[0]], table[i[1]], table[i[2]], table[i[3]], table[i[4]], table[i[5]], table[i[6]],
                           table[i[7]]);
}

// BGR -> HSV of 8 pixels, OpenCV's 8-bit algorithm with hue range 180, then the three tables.
YOLO8_AVX2_TARGET inline Lanes8 forward(const Lanes8& bgr, const HsvTables& t) {
  const __m256i b = bgr.c[0], g = bgr.c[1], r = bgr.c[2];
  const __m256i v = _mm256_max_epi32(b, _mm256_max_epi32(g, r));
  const __m256i diff = _mm256_sub_epi32(v, _mm256_min_epi32(b, _mm256_min_epi32(g, r)));
  const __m256i s = scaled(diff, v, kSatNumerator);
  // The hue's sector by which channel is the maximum, red first, then green (OpenCV's order for ties).
  const __m256i gb = _mm256_sub_epi32(g, b);
  const __m256i br = _mm256_add_epi32(_mm256_sub_epi32(b, r), _mm256_slli_epi32(diff, 1));
  const __m256i rg = _mm256_add_epi32(_mm256_sub_epi32(r, g), _mm256_slli_epi32(diff, 2));
  const __m256i v_is_r = _mm256_cmpeq_epi32(v, r), v_is_g = _mm256_cmpeq_epi32(v, g);
  const __m256i num = _mm256_blendv_epi8(_mm256_blendv_epi8(rg, br, v_is_g), gb, v_is_r);
  __m256i h = scaled(num, diff, kHueNumerator);
  h = _mm256_add_epi32(h, _mm256_and_si256(_mm256_cmpgt_epi32(_mm256_setzero_si256(), h), _mm256_set1_epi32(180)));
  return {{lookup(t.h, to_byte_range(h)), lookup(t.s, to_byte_range(s)), lookup(t.v, v)}};
}

YOLO8_AVX2_TARGET inline __m256 sector_is(__m256i sector, int k) {
  return _mm256_castsi256_ps(_mm256_cmpeq_epi32(sector, _mm256_set1_epi32(k)));
}

// HSV of 8 pixels (hue < 180) -> B, G, R as OpenCV's vector path for 8 bits computes them: see hsv_to_bgr16 in
// pixel_kernels.cpp, whose every step this repeats on 8 lanes.
YOLO8_AVX2_TARGET inline Lanes8 back(const Lanes8& hsv) {
  const __m256 inv255 = _mm256_set1_ps(1.0f / 255.0f), one = _mm256_set1_ps(1.0f);
  __m256 h = _mm256_mul_ps(_mm256_cvtepi32_ps(hsv.c[0]), _mm256_set1_ps(6.0f / 180));
  const __m256 s = _mm256_mul_ps(_mm256_cvtepi32_ps(hsv.c[1]), inv255);
  const __m256 v = _mm256_mul_ps(_mm256_cvtepi32_ps(hsv.c[2]), inv255);
  const __m256i sector = _mm256_cvttps_epi32(h);
  h = _mm256_sub_ps(h, _mm256_cvtepi32_ps(sector));
  const __m256 tab0 = v;
  const __m256 tab1 = _mm256_mul_ps(v, _mm256_sub_ps(one, s));
  const __m256 tab2 = _mm256_mul_ps(v, _mm256_fnmadd_ps(s, h, one));  // fused, as OpenCV's AVX2 build
  const __m256 tab3 = _mm256_mul_ps(v, _mm256_fnmadd_ps(s, _mm256_sub_ps(one, h), one));
  const __m256 s0 = sector_is(sector, 0), s1 = sector_is(sector, 1), s2 = sector_is(sector, 2);
  const __m256 s3 = sector_is(sector, 3), s4 = sector_is(sector, 4), s5 = sector_is(sector, 5);
  // Sectors 0..5: b = tab 1 1 3 0 0 2, g = tab 3 0 0 2 1 1, r = tab 0 2 1 1 3 0.
  const __m256 b =
      _mm256_blendv_ps(_mm256_blendv_ps(_mm256_blendv_ps(tab0, tab2, s5), tab3, s2), tab1, _mm256_or_ps(s0, s1));
  const __m256 g =
      _mm256_blendv_ps(_mm256_blendv_ps(_mm256_blendv_ps(tab0, tab1, _mm256_or_ps(s4, s5)), tab2, s3), tab3, s0);
  const __m256 r =
      _mm256_blendv_ps(_mm256_blendv_ps(_mm256_blendv_ps(tab0, tab3, s4), tab1, _mm256_or_ps(s2, s3)), tab2, s1);
  const __m256 k255 = _mm256_set1_ps(255.0f);
  return {{to_byte_range(_mm256_cvttps_epi32(_mm256_mul_ps(b, k255))),
           to_byte_range(_mm256_cvttps_epi32(_mm256_mul_ps(g, k255))),
           to_byte_range(_mm256_cvttps_epi32(_mm256_mul_ps(r, k255)))}};
}

// The leading multiple of 64 of n pixels, as the AVX-512 kernels: OpenCV's vector step (16, 32 or 64 pixels)
// divides it, so the pixels left to OpenCV take the same path there as in a whole row.
constexpr int64_t vector_part(int64_t n) { return n / 64 * 64; }

}  // namespace

YOLO8_AVX2_TARGET void bgr_to_hsv_tables_avx2(const uint8_t* bgr, uint8_t* hsv, int64_t n, const HsvTables& t) {
  const Kernel k;
  int64_t i = 0;
  for (; i + kBlock <= n; i += kBlock, bgr += 3 * kBlock, hsv += 3 * kBlock) {
    Lanes8 lo, hi;
    k.load(bgr, lo, hi);
    k.store(hsv, forward(lo, t), forward(hi, t));
  }
  bgr_to_hsv_tables_scalar(bgr, hsv, n - i, t);
}

YOLO8_AVX2_TARGET int64_t hsv_to_bgr_avx2(const uint8_t* hsv, uint8_t* bgr, int64_t n) {
  const Kernel k;
  const int64_t done = vector_part(n);
  for (int64_t i = 0; i < done; i += kBlock, bgr += 3 * kBlock, hsv += 3 * kBlock) {
    Lanes8 lo, hi;
    k.load(hsv, lo, hi);
    k.store(bgr, back(lo), back(hi));
  }
  return done;
}

YOLO8_AVX2_TARGET int64_t augment_hsv_avx2(uint8_t* bgr, int64_t n, const HsvTables& t) {
  const Kernel k;
  const int64_t done = vector_part(n);
  for (int64_t i = 0; i < done; i += kBlock, bgr += 3 * kBlock) {
    Lanes8 lo, hi;
    k.load(bgr, lo, hi);
    k.store(bgr, back(forward(lo, t)), back(forward(hi, t)));
  }
  return done;
}

bool avx2_fma_supported() {
  static const bool supported = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return supported;
}

#else

void bgr_to_hsv_tables_avx2(const uint8_t* bgr, uint8_t* hsv, int64_t n, const HsvTables& t) {
  bgr_to_hsv_tables_scalar(bgr, hsv, n, t);
}
int64_t hsv_to_bgr_avx2(const uint8_t*, uint8_t*, int64_t) { return 0; }
int64_t augment_hsv_avx2(uint8_t*, int64_t, const HsvTables&) { return 0; }
bool avx2_fma_supported() { return false; }

#endif

}  // namespace yolo8::data
