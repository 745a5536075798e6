#include "data/pixel_kernels.h"

#include <algorithm>
#include <cmath>
#include <utility>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define YOLO8_PIXEL_AVX512 1
#endif

namespace yolo8::data {
namespace {

constexpr int kShift = 12;  // OpenCV's hsv_shift
constexpr int kHalf = 1 << (kShift - 1);
constexpr int kSatNumerator = 255 << kShift;        // sdiv_table[v] = round(kSatNumerator / v)
constexpr int kHueNumerator = (180 << kShift) / 6;  // hdiv_table[d] = round(kHueNumerator / d), 180 * 4096 / 6 exact

// OpenCV's division tables for 8-bit BGR -> HSV with hue range 180: round(255 * 4096 / v), round(180 * 4096 / 6d).
struct DivTables {
  alignas(64) int32_t sdiv[256];
  alignas(64) int32_t hdiv[256];
  DivTables() {
    sdiv[0] = hdiv[0] = 0;
    for (int i = 1; i < 256; ++i) {
      sdiv[i] = static_cast<int32_t>(std::lrint(kSatNumerator / (1.0 * i)));
      hdiv[i] = static_cast<int32_t>(std::lrint((180 << kShift) / (6.0 * i)));
    }
  }
};

const DivTables& div_tables() {
  static const DivTables tables;
  return tables;
}

}  // namespace

void bgr_to_hsv_tables_scalar(const uint8_t* bgr, uint8_t* hsv, int64_t n, const HsvTables& t) {
  const DivTables& d = div_tables();
  for (int64_t i = 0; i < n; ++i, bgr += 3, hsv += 3) {
    const int b = bgr[0], g = bgr[1], r = bgr[2];
    const int v = std::max(b, std::max(g, r));
    const int diff = v - std::min(b, std::min(g, r));
    const int s = (diff * d.sdiv[v] + kHalf) >> kShift;
    // Hue sector by which channel is the maximum, red first, then green (OpenCV's order for ties).
    int h = v == r ? g - b : (v == g ? b - r + 2 * diff : r - g + 4 * diff);
    h = (h * d.hdiv[diff] + kHalf) >> kShift;
    if (h < 0) h += 180;
    hsv[0] = t.h[std::clamp(h, 0, 255)];
    hsv[1] = t.s[s];
    hsv[2] = t.v[v];
  }
}

void mirror_row_scalar(uint8_t* row, int64_t n) {
  for (int64_t a = 0, b = n - 1; a < b; ++a, --b)
    for (int c = 0; c < 3; ++c) std::swap(row[3 * a + c], row[3 * b + c]);
}

void split_rgb_scalar(const uint8_t* bgr, int64_t n, uint8_t* r, uint8_t* g, uint8_t* b) {
  for (int64_t i = 0; i < n; ++i, bgr += 3) {
    b[i] = bgr[0];
    g[i] = bgr[1];
    r[i] = bgr[2];
  }
}

#ifdef YOLO8_PIXEL_AVX512

// GCC 12 takes the intrinsics' deliberately undefined pass-through operands (`__m512i __Y = __Y`) for uninitialised.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

namespace {

#define YOLO8_AVX512_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512vbmi")))

// Byte shuffles between 64 interleaved BGR pixels (three registers) and three planes.
struct ShuffleIndices {
  alignas(64) uint8_t split[3][64];   // plane c, lane i <- byte 3i + c of the first two registers (mod 128)
  alignas(64) uint8_t split3[3][64];  // ... or of the third register (3i + c - 128)
  uint64_t split_hi[3] = {0, 0, 0};   // lanes whose byte lies in the third register
  alignas(64) uint8_t merge[3][64];   // output register q, lane j <- pixel (64q + j) / 3 of plane H (or S, + 64)
  uint64_t merge_v[3] = {0, 0, 0};    // lanes of output register q that come from plane V
  ShuffleIndices() {
    for (int c = 0; c < 3; ++c)
      for (int i = 0; i < 64; ++i) {
        const int at = 3 * i + c;
        split[c][i] = static_cast<uint8_t>(at & 127);
        split3[c][i] = static_cast<uint8_t>(at >= 128 ? at - 128 : 0);
        if (at >= 128) split_hi[c] |= uint64_t{1} << i;
      }
    for (int q = 0; q < 3; ++q)
      for (int j = 0; j < 64; ++j) {
        const int at = 64 * q + j, pixel = at / 3, channel = at % 3;
        merge[q][j] = static_cast<uint8_t>(channel == 1 ? pixel + 64 : pixel);
        if (channel == 2) merge_v[q] |= uint64_t{1} << j;
      }
  }
};

const ShuffleIndices& shuffle_indices() {
  static const ShuffleIndices indices;
  return indices;
}

// A 256-entry byte table held in four registers, looked up for 64 bytes at once.
struct Table256 {
  __m512i q[4];
};

YOLO8_AVX512_TARGET inline Table256 load_table(const uint8_t* t) {
  return {
      {_mm512_loadu_si512(t), _mm512_loadu_si512(t + 64), _mm512_loadu_si512(t + 128), _mm512_loadu_si512(t + 192)}};
}

YOLO8_AVX512_TARGET inline __m512i lookup(const Table256& t, __m512i x) {
  const __m512i lo = _mm512_permutex2var_epi8(t.q[0], x, t.q[1]);
  const __m512i hi = _mm512_permutex2var_epi8(t.q[2], x, t.q[3]);
  return _mm512_mask_blend_epi8(_mm512_movepi8_mask(x), lo, hi);
}

// (num * round(numerator / index) + half) >> shift for 16 lanes (0 where index is 0): OpenCV's division tables
// computed in place, three times faster than gathering them. A float quotient rounds to the same integer as the
// tables' double one: its fraction is a multiple of 1 / index, at least 1 / (2 index) from one half unless exactly
// one half (which float holds exactly), and float's error is under numerator / index * 2^-24 (tested on every input).
YOLO8_AVX512_TARGET inline __m512i scaled(__m512i num, __m128i index, float numerator) {
  const __m512i idx = _mm512_cvtepu8_epi32(index);
  const __m512 quotient = _mm512_div_ps(_mm512_set1_ps(numerator), _mm512_cvtepi32_ps(idx));
  const __m512i div = _mm512_maskz_cvtps_epi32(_mm512_test_epi32_mask(idx, idx), quotient);
  return _mm512_srai_epi32(_mm512_add_epi32(_mm512_mullo_epi32(num, div), _mm512_set1_epi32(kHalf)), kShift);
}

YOLO8_AVX512_TARGET inline __m512i join(const __m128i q[4]) {
  return _mm512_inserti32x4(_mm512_inserti32x4(_mm512_inserti32x4(_mm512_castsi128_si512(q[0]), q[1], 1), q[2], 2),
                            q[3], 3);
}

// Hue and saturation of lanes 16k .. 16k + 15 (k = 2 kHalf + kQuarter); h16 holds the hue before the division.
template <int kHalfIndex, int kQuarter>
YOLO8_AVX512_TARGET inline void hue_sat_quarter(__m512i h16, __m512i v, __m512i diff, __m128i h8[4], __m128i s8[4]) {
  constexpr int k = 2 * kHalfIndex + kQuarter;
  const __m128i dk = _mm512_extracti32x4_epi32(diff, k), vk = _mm512_extracti32x4_epi32(v, k);
  __m512i h32 = scaled(_mm512_cvtepi16_epi32(_mm512_extracti64x4_epi64(h16, kQuarter)), dk, kHueNumerator);
  h32 = _mm512_mask_add_epi32(h32, _mm512_cmplt_epi32_mask(h32, _mm512_setzero_si512()), h32, _mm512_set1_epi32(180));
  h8[k] = _mm512_cvtusepi32_epi8(_mm512_max_epi32(h32, _mm512_setzero_si512()));
  s8[k] = _mm512_cvtusepi32_epi8(scaled(_mm512_cvtepu8_epi32(dk), vk, kSatNumerator));
}

// Lanes [32 kHalfIndex, 32 kHalfIndex + 32): the hue before the division in 16 bits (g - b, b - r + 2 diff or
// r - g + 4 diff by the maximum's channel, red first as OpenCV breaks ties), then both quarters.
template <int kHalfIndex>
YOLO8_AVX512_TARGET inline void hue_sat(__m512i b, __m512i g, __m512i r, __m512i v, __m512i diff, __mmask64 v_is_r,
                                        __mmask64 v_is_g, __m128i h8[4], __m128i s8[4]) {
  const __m512i b16 = _mm512_cvtepu8_epi16(_mm512_extracti64x4_epi64(b, kHalfIndex));
  const __m512i g16 = _mm512_cvtepu8_epi16(_mm512_extracti64x4_epi64(g, kHalfIndex));
  const __m512i r16 = _mm512_cvtepu8_epi16(_mm512_extracti64x4_epi64(r, kHalfIndex));
  const __m512i d16 = _mm512_cvtepu8_epi16(_mm512_extracti64x4_epi64(diff, kHalfIndex));
  const __m512i gb = _mm512_sub_epi16(g16, b16);
  const __m512i br = _mm512_add_epi16(_mm512_sub_epi16(b16, r16), _mm512_slli_epi16(d16, 1));
  const __m512i rg = _mm512_add_epi16(_mm512_sub_epi16(r16, g16), _mm512_slli_epi16(d16, 2));
  const auto is_r = static_cast<__mmask32>(v_is_r >> (32 * kHalfIndex));
  const auto is_g = static_cast<__mmask32>(v_is_g >> (32 * kHalfIndex));
  const __m512i h16 = _mm512_mask_blend_epi16(is_r, _mm512_mask_blend_epi16(is_g, rg, br), gb);
  hue_sat_quarter<kHalfIndex, 0>(h16, v, diff, h8, s8);
  hue_sat_quarter<kHalfIndex, 1>(h16, v, diff, h8, s8);
}

// HSV (bytes, hue < 180) -> B, G, R of 16 lanes as OpenCV's vector path for 8 bits computes them (color_hsv.simd.hpp,
// HSV2RGB_b with HSV2RGB_simd): in float, s and v scaled by 1/255, the hue's sector by truncation, every channel
// one of v, v(1 - s), v(1 - s f), v(1 - s(1 - f)), times 255 and truncated. Its scalar path for a row's last pixels
// rounds instead, so the caller leaves those to OpenCV. The file is compiled with -ffp-contract=off, so that no other
// product is fused than the two OpenCV's build fuses.
YOLO8_AVX512_TARGET inline void hsv_to_bgr16(__m128i h8, __m128i s8, __m128i v8, __m128i& b8, __m128i& g8,
                                             __m128i& r8) {
  const __m512 inv255 = _mm512_set1_ps(1.0f / 255.0f), one = _mm512_set1_ps(1.0f);
  __m512 h = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(h8)), _mm512_set1_ps(6.0f / 180));
  const __m512 s = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(s8)), inv255);
  const __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(v8)), inv255);
  // The sector is 0..5 for a hue below 180 (OpenCV's "minus 6 * trunc(sector / 6)" is then 0).
  const __m512i sector = _mm512_cvttps_epi32(h);
  h = _mm512_sub_ps(h, _mm512_cvtepi32_ps(sector));
  const __m512 tab0 = v;
  const __m512 tab1 = _mm512_mul_ps(v, _mm512_sub_ps(one, s));
  // OpenCV's build contracts 1 - s f into one fused multiply-add (its AVX2 path; -ffp-contract=fast, GCC's default),
  // and so does this: without it 1758 of the 180 * 256 * 256 inputs come out one lower or higher.
  const __m512 tab2 = _mm512_mul_ps(v, _mm512_fnmadd_ps(s, h, one));
  const __m512 tab3 = _mm512_mul_ps(v, _mm512_fnmadd_ps(s, _mm512_sub_ps(one, h), one));
  const __mmask16 s0 = _mm512_cmpeq_epi32_mask(sector, _mm512_set1_epi32(0));
  const __mmask16 s1 = _mm512_cmpeq_epi32_mask(sector, _mm512_set1_epi32(1));
  const __mmask16 s2 = _mm512_cmpeq_epi32_mask(sector, _mm512_set1_epi32(2));
  const __mmask16 s3 = _mm512_cmpeq_epi32_mask(sector, _mm512_set1_epi32(3));
  const __mmask16 s4 = _mm512_cmpeq_epi32_mask(sector, _mm512_set1_epi32(4));
  const __mmask16 s5 = _mm512_cmpeq_epi32_mask(sector, _mm512_set1_epi32(5));
  // Sectors 0..5: b = tab 1 1 3 0 0 2, g = tab 3 0 0 2 1 1, r = tab 0 2 1 1 3 0.
  __m512 b = _mm512_mask_blend_ps(s0 | s1, _mm512_mask_blend_ps(s2, _mm512_mask_blend_ps(s5, tab0, tab2), tab3), tab1);
  __m512 g = _mm512_mask_blend_ps(s0, _mm512_mask_blend_ps(s3, _mm512_mask_blend_ps(s4 | s5, tab0, tab1), tab2), tab3);
  __m512 r = _mm512_mask_blend_ps(s1, _mm512_mask_blend_ps(s2 | s3, _mm512_mask_blend_ps(s4, tab0, tab3), tab1), tab2);
  const __m512 k255 = _mm512_set1_ps(255.0f);
  const __m512i zero = _mm512_setzero_si512();
  b8 = _mm512_cvtusepi32_epi8(_mm512_max_epi32(_mm512_cvttps_epi32(_mm512_mul_ps(b, k255)), zero));
  g8 = _mm512_cvtusepi32_epi8(_mm512_max_epi32(_mm512_cvttps_epi32(_mm512_mul_ps(g, k255)), zero));
  r8 = _mm512_cvtusepi32_epi8(_mm512_max_epi32(_mm512_cvttps_epi32(_mm512_mul_ps(r, k255)), zero));
}

// The registers both kernels keep for a whole run: the byte shuffles and the three tables.
struct Kernel {
  __m512i split[3], split3[3], merge[3];
  __mmask64 split_hi[3], merge_v[3];
  Table256 th, ts, tv;

  YOLO8_AVX512_TARGET explicit Kernel(const HsvTables& t)
      : th(load_table(t.h)), ts(load_table(t.s)), tv(load_table(t.v)) {
    const ShuffleIndices& ix = shuffle_indices();
    for (int c = 0; c < 3; ++c) {
      split[c] = _mm512_load_si512(ix.split[c]);
      split3[c] = _mm512_load_si512(ix.split3[c]);
      merge[c] = _mm512_load_si512(ix.merge[c]);
      split_hi[c] = ix.split_hi[c];
      merge_v[c] = ix.merge_v[c];
    }
  }

  // 64 interleaved pixels (192 bytes) -> three planes of 64 bytes, and back.
  YOLO8_AVX512_TARGET void load(const uint8_t* p, __m512i plane[3]) const {
    const __m512i a0 = _mm512_loadu_si512(p), a1 = _mm512_loadu_si512(p + 64), a2 = _mm512_loadu_si512(p + 128);
    for (int c = 0; c < 3; ++c)
      plane[c] = _mm512_mask_permutexvar_epi8(_mm512_permutex2var_epi8(a0, split[c], a1), split_hi[c], split3[c], a2);
  }
  YOLO8_AVX512_TARGET void store(uint8_t* p, const __m512i plane[3]) const {
    for (int q = 0; q < 3; ++q)
      _mm512_storeu_si512(
          p + 64 * q, _mm512_mask_permutexvar_epi8(_mm512_permutex2var_epi8(plane[0], merge[q], plane[1]), merge_v[q],
                                                   merge[q], plane[2]));
  }

  // B, G, R planes -> H, S, V planes with the tables applied.
  YOLO8_AVX512_TARGET void forward(const __m512i bgr[3], __m512i hsv[3]) const {
    const __m512i b = bgr[0], g = bgr[1], r = bgr[2];
    const __m512i v = _mm512_max_epu8(b, _mm512_max_epu8(g, r));
    const __m512i diff = _mm512_sub_epi8(v, _mm512_min_epu8(b, _mm512_min_epu8(g, r)));
    const __mmask64 v_is_r = _mm512_cmpeq_epi8_mask(v, r), v_is_g = _mm512_cmpeq_epi8_mask(v, g);
    __m128i h8[4], s8[4];
    hue_sat<0>(b, g, r, v, diff, v_is_r, v_is_g, h8, s8);
    hue_sat<1>(b, g, r, v, diff, v_is_r, v_is_g, h8, s8);
    hsv[0] = lookup(th, join(h8));
    hsv[1] = lookup(ts, join(s8));
    hsv[2] = lookup(tv, v);
  }

  // H, S, V planes -> B, G, R planes.
  YOLO8_AVX512_TARGET static void back(const __m512i hsv[3], __m512i bgr[3]) {
    __m128i b8[4], g8[4], r8[4];
    hsv_to_bgr16(_mm512_extracti32x4_epi32(hsv[0], 0), _mm512_extracti32x4_epi32(hsv[1], 0),
                 _mm512_extracti32x4_epi32(hsv[2], 0), b8[0], g8[0], r8[0]);
    hsv_to_bgr16(_mm512_extracti32x4_epi32(hsv[0], 1), _mm512_extracti32x4_epi32(hsv[1], 1),
                 _mm512_extracti32x4_epi32(hsv[2], 1), b8[1], g8[1], r8[1]);
    hsv_to_bgr16(_mm512_extracti32x4_epi32(hsv[0], 2), _mm512_extracti32x4_epi32(hsv[1], 2),
                 _mm512_extracti32x4_epi32(hsv[2], 2), b8[2], g8[2], r8[2]);
    hsv_to_bgr16(_mm512_extracti32x4_epi32(hsv[0], 3), _mm512_extracti32x4_epi32(hsv[1], 3),
                 _mm512_extracti32x4_epi32(hsv[2], 3), b8[3], g8[3], r8[3]);
    bgr[0] = join(b8);
    bgr[1] = join(g8);
    bgr[2] = join(r8);
  }
};

}  // namespace

YOLO8_AVX512_TARGET void bgr_to_hsv_tables_avx512(const uint8_t* bgr, uint8_t* hsv, int64_t n, const HsvTables& t) {
  const Kernel k(t);
  int64_t i = 0;
  for (; i + 64 <= n; i += 64, bgr += 192, hsv += 192) {
    __m512i in[3], out[3];
    k.load(bgr, in);
    k.forward(in, out);
    k.store(hsv, out);
  }
  bgr_to_hsv_tables_scalar(bgr, hsv, n - i, t);
}

YOLO8_AVX512_TARGET int64_t hsv_to_bgr_avx512(const uint8_t* hsv, uint8_t* bgr, int64_t n) {
  const Kernel k(HsvTables{});
  int64_t i = 0;
  for (; i + 64 <= n; i += 64, bgr += 192, hsv += 192) {
    __m512i in[3], out[3];
    k.load(hsv, in);
    Kernel::back(in, out);
    k.store(bgr, out);
  }
  return i;
}

YOLO8_AVX512_TARGET int64_t augment_hsv_avx512(uint8_t* bgr, int64_t n, const HsvTables& t) {
  const Kernel k(t);
  int64_t i = 0;
  for (; i + 64 <= n; i += 64, bgr += 192) {
    __m512i pixels[3], hsv[3];
    k.load(bgr, pixels);
    k.forward(pixels, hsv);
    Kernel::back(hsv, pixels);
    k.store(bgr, pixels);
  }
  return i;
}

YOLO8_AVX512_TARGET void split_rgb_avx512(const uint8_t* bgr, int64_t n, uint8_t* r, uint8_t* g, uint8_t* b) {
  const Kernel k(HsvTables{});
  int64_t i = 0;
  for (; i + 64 <= n; i += 64, bgr += 192) {
    __m512i plane[3];
    k.load(bgr, plane);
    _mm512_storeu_si512(b + i, plane[0]);
    _mm512_storeu_si512(g + i, plane[1]);
    _mm512_storeu_si512(r + i, plane[2]);
  }
  split_rgb_scalar(bgr, n - i, r + i, g + i, b + i);
}

namespace {

// Byte shuffles that reverse the order of 64 pixels held in three registers (bytes keep their order within a pixel).
struct MirrorIndices {
  alignas(64) uint8_t pair[3][64];   // output register q, lane l <- byte (mod 128) of the first two registers
  alignas(64) uint8_t third[3][64];  // ... or of the third one
  uint64_t from_third[3] = {0, 0, 0};
  MirrorIndices() {
    for (int q = 0; q < 3; ++q)
      for (int l = 0; l < 64; ++l) {
        const int at = 64 * q + l, from = 3 * (63 - at / 3) + at % 3;
        pair[q][l] = static_cast<uint8_t>(from & 127);
        third[q][l] = static_cast<uint8_t>(from >= 128 ? from - 128 : 0);
        if (from >= 128) from_third[q] |= uint64_t{1} << l;
      }
  }
};

struct Mirror {
  __m512i pair[3], third[3];
  __mmask64 from_third[3];
  YOLO8_AVX512_TARGET Mirror() {
    static const MirrorIndices ix;
    for (int q = 0; q < 3; ++q) {
      pair[q] = _mm512_load_si512(ix.pair[q]);
      third[q] = _mm512_load_si512(ix.third[q]);
      from_third[q] = ix.from_third[q];
    }
  }
  // Loads the 64 pixels at `from` and stores them reversed at `to` (which may be `from`).
  YOLO8_AVX512_TARGET void load(const uint8_t* from, __m512i a[3]) const {
    a[0] = _mm512_loadu_si512(from);
    a[1] = _mm512_loadu_si512(from + 64);
    a[2] = _mm512_loadu_si512(from + 128);
  }
  YOLO8_AVX512_TARGET void store_reversed(uint8_t* to, const __m512i a[3]) const {
    for (int q = 0; q < 3; ++q)
      _mm512_storeu_si512(to + 64 * q, _mm512_mask_permutexvar_epi8(_mm512_permutex2var_epi8(a[0], pair[q], a[1]),
                                                                    from_third[q], third[q], a[2]));
  }
};

}  // namespace

YOLO8_AVX512_TARGET void mirror_row_avx512(uint8_t* row, int64_t n) {
  const Mirror m;
  int64_t left = 0, right = n - 64;  // pixel indices of the two blocks swapped next
  for (; left + 64 <= right; left += 64, right -= 64) {
    __m512i a[3], b[3];
    m.load(row + 3 * left, a);
    m.load(row + 3 * right, b);
    m.store_reversed(row + 3 * left, b);
    m.store_reversed(row + 3 * right, a);
  }
  mirror_row_scalar(row + 3 * left, right + 64 - left);
}

#pragma GCC diagnostic pop

bool avx512_vbmi_supported() {
  static const bool supported = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                                __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vbmi");
  return supported;
}

#else

void bgr_to_hsv_tables_avx512(const uint8_t* bgr, uint8_t* hsv, int64_t n, const HsvTables& t) {
  bgr_to_hsv_tables_scalar(bgr, hsv, n, t);
}
int64_t hsv_to_bgr_avx512(const uint8_t*, uint8_t*, int64_t) { return 0; }
int64_t augment_hsv_avx512(uint8_t*, int64_t, const HsvTables&) { return 0; }
void mirror_row_avx512(uint8_t* row, int64_t n) { mirror_row_scalar(row, n); }
void split_rgb_avx512(const uint8_t* bgr, int64_t n, uint8_t* r, uint8_t* g, uint8_t* b) {
  split_rgb_scalar(bgr, n, r, g, b);
}
bool avx512_vbmi_supported() { return false; }

#endif

}  // namespace yolo8::data
