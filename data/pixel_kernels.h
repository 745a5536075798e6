#pragma once
// Vector kernels of the augmentation on BGR uint8 pixels, each equal bit for bit to the OpenCV calls it replaces.
// HSV: BGR -> HSV (OpenCV's 8-bit algorithm, hue range 180) with the three gain tables applied on the way out,
// HSV -> BGR, and both fused. Mirror: a row reversed in place (cv::flip around the vertical axis). Split: BGR pixels
// into RGB planes (cv::split).
#include <cstdint>

namespace yolo8::data {

// The gain tables of one image: hue, saturation, value.
struct HsvTables {
  uint8_t h[256], s[256], v[256];
};

// n pixels, BGR in, HSV out (interleaved, 3 bytes each). The portable kernel is slower than OpenCV's conversion
// followed by a table pass, and is there for the vector kernel's last pixels; the AVX-512 VBMI kernel (64 pixels a
// step, the tables held in registers, about 6x faster than that pair at 640 x 640) may be called only where
// avx512_vbmi_supported() is true (as every *_avx512 kernel here).
void bgr_to_hsv_tables_scalar(const uint8_t* bgr, uint8_t* hsv, int64_t n, const HsvTables& t);
void bgr_to_hsv_tables_avx512(const uint8_t* bgr, uint8_t* hsv, int64_t n, const HsvTables& t);
bool avx512_vbmi_supported();

// The second half, HSV -> BGR, as OpenCV's vector path computes it, for the leading multiple of 64 of n pixels;
// returns how many it converted. OpenCV's scalar path for a row's last pixels rounds where its vector path
// truncates, so the rest is left to cv::cvtColor on a row that starts at a multiple of 64 (where OpenCV, whose
// vector step of 16, 32 or 64 pixels divides 64, makes the same choice per pixel as on the whole row).
int64_t hsv_to_bgr_avx512(const uint8_t* hsv, uint8_t* bgr, int64_t n);

// Both halves in place and in registers (BGR -> HSV -> tables -> BGR), the same leading multiple of 64 of n pixels;
// returns how many it converted.
int64_t augment_hsv_avx512(uint8_t* bgr, int64_t n, const HsvTables& t);

// The same three HSV kernels for CPUs with AVX2 and FMA but no AVX-512 VBMI (data/pixel_kernels_avx2.cpp), with the
// same contracts, 16 pixels a step; 3.4 instead of 4.1 ms (OpenCV's conversions and a table pass) at 640 x 640 on an
// AMD Zen 1, whose 256-bit operations are two 128-bit halves. Call them only where avx2_fma_supported() is true.
void bgr_to_hsv_tables_avx2(const uint8_t* bgr, uint8_t* hsv, int64_t n, const HsvTables& t);
int64_t hsv_to_bgr_avx2(const uint8_t* hsv, uint8_t* bgr, int64_t n);
int64_t augment_hsv_avx2(uint8_t* bgr, int64_t n, const HsvTables& t);
bool avx2_fma_supported();

// Reverses the order of n 3-byte pixels in place: cv::flip(row, row, 1). OpenCV's flip moves 3-byte pixels one by
// one (0.55 ms at 640x640, more than the resize before it); the vector kernel does 64 at a time.
void mirror_row_scalar(uint8_t* row, int64_t n);
void mirror_row_avx512(uint8_t* row, int64_t n);

// n BGR pixels into three planes r, g, b (the batch tensor's RGB channels): cv::split with the planes swapped.
void split_rgb_scalar(const uint8_t* bgr, int64_t n, uint8_t* r, uint8_t* g, uint8_t* b);
void split_rgb_avx512(const uint8_t* bgr, int64_t n, uint8_t* r, uint8_t* g, uint8_t* b);

}  // namespace yolo8::data
