#pragma once
// The first half of the HSV augmentation in one pass: BGR -> HSV (OpenCV's 8-bit algorithm, hue range 180) with the
// three gain tables applied on the way out. Equal bit for bit to cv::cvtColor(COLOR_BGR2HSV) then the tables.
#include <cstdint>

namespace yolo8::data {

// The gain tables of one image: hue, saturation, value.
struct HsvTables {
  uint8_t h[256], s[256], v[256];
};

// n pixels, BGR in, HSV out (interleaved, 3 bytes each). The portable kernel is slower than OpenCV's conversion
// followed by a table pass, and is there for the vector kernel's last pixels; the AVX-512 VBMI kernel (64 pixels a
// step, the tables held in registers, about 6x faster than that pair at 640 x 640) may be called only where
// hsv_avx512_supported() is true.
void bgr_to_hsv_tables_scalar(const uint8_t* bgr, uint8_t* hsv, int64_t n, const HsvTables& t);
void bgr_to_hsv_tables_avx512(const uint8_t* bgr, uint8_t* hsv, int64_t n, const HsvTables& t);
bool hsv_avx512_supported();

// The second half, HSV -> BGR, as OpenCV's vector path computes it, for the leading multiple of 64 of n pixels;
// returns how many it converted. OpenCV's scalar path for a row's last pixels rounds where its vector path
// truncates, so the rest is left to cv::cvtColor on a row that starts at a multiple of 64 (where OpenCV, whose
// vector step of 16, 32 or 64 pixels divides 64, makes the same choice per pixel as on the whole row).
int64_t hsv_to_bgr_avx512(const uint8_t* hsv, uint8_t* bgr, int64_t n);

// Both halves in place and in registers (BGR -> HSV -> tables -> BGR), the same leading multiple of 64 of n pixels;
// returns how many it converted.
int64_t augment_hsv_avx512(uint8_t* bgr, int64_t n, const HsvTables& t);

}  // namespace yolo8::data
