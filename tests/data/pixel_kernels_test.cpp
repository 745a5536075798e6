// The pixel kernels against the OpenCV calls they replace: HSV (BGR -> HSV with the gain tables, HSV -> BGR, both
// fused) against cv::cvtColor, the row mirror against cv::flip, the
// RGB split against cv::split.
#include "data/pixel_kernels.h"

#include <gtest/gtest.h>
#include <opencv2/core.hpp>
#include <opencv2/imgproc.hpp>

#include <algorithm>
#include <cmath>
#include <ostream>
#include <string>
#include <vector>

#include "data/augment.h"

namespace yolo8::data {
namespace {

// Every 24-bit BGR value once, as a 4096 x 4096 image.
cv::Mat every_colour() {
  cv::Mat all(4096, 4096, CV_8UC3);
  for (int i = 0; i < 4096 * 4096; ++i) {
    uint8_t* p = all.data + 3 * static_cast<size_t>(i);
    p[0] = static_cast<uint8_t>(i & 255);
    p[1] = static_cast<uint8_t>((i >> 8) & 255);
    p[2] = static_cast<uint8_t>(i >> 16);
  }
  return all;
}

HsvTables random_tables(uint64_t seed) {
  cv::RNG rng(seed);
  HsvTables t;
  for (int x = 0; x < 256; ++x) {
    t.h[x] = static_cast<uint8_t>(rng.uniform(0, 180));
    t.s[x] = static_cast<uint8_t>(rng.uniform(0, 256));
    t.v[x] = static_cast<uint8_t>(rng.uniform(0, 256));
  }
  return t;
}

cv::Mat reference(const cv::Mat& bgr, const HsvTables& t) {
  cv::Mat hsv;
  cv::cvtColor(bgr, hsv, cv::COLOR_BGR2HSV);
  for (size_t i = 0; i < hsv.total(); ++i) {
    uint8_t* p = hsv.data + 3 * i;
    p[0] = t.h[p[0]];
    p[1] = t.s[p[1]];
    p[2] = t.v[p[2]];
  }
  return hsv;
}

// The augmentation's tables for gains r0, r1, r2 (hue wraps at 180, saturation and value clip at 255).
HsvTables gain_tables(double r0, double r1, double r2) {
  HsvTables t;
  for (int x = 0; x < 256; ++x) {
    t.h[x] = static_cast<uint8_t>(std::fmod(x * r0, 180.0));
    t.s[x] = static_cast<uint8_t>(std::clamp(x * r1, 0.0, 255.0));
    t.v[x] = static_cast<uint8_t>(std::clamp(x * r2, 0.0, 255.0));
  }
  return t;
}

TEST(DataHsvKernel, ScalarEqualsOpenCvOnEveryColour) {
  const cv::Mat all = every_colour();
  const HsvTables t = random_tables(3);
  cv::Mat got(all.size(), CV_8UC3);
  bgr_to_hsv_tables_scalar(all.data, got.data, static_cast<int64_t>(all.total()), t);
  EXPECT_EQ(cv::norm(got, reference(all, t), cv::NORM_INF), 0);
}

// The vector kernels of each instruction set, tested where this CPU runs them.
struct HsvIsa {
  const char* name;
  bool (*supported)();
  void (*to_hsv)(const uint8_t*, uint8_t*, int64_t, const HsvTables&);
  int64_t (*back)(const uint8_t*, uint8_t*, int64_t);
  int64_t (*fused)(uint8_t*, int64_t, const HsvTables&);
};

void PrintTo(const HsvIsa& isa, std::ostream* out) { *out << isa.name; }

class DataHsvVector : public ::testing::TestWithParam<HsvIsa> {
 protected:
  void SetUp() override {
    if (!GetParam().supported()) GTEST_SKIP() << "this CPU has no " << GetParam().name;
  }
};

INSTANTIATE_TEST_SUITE_P(Isa, DataHsvVector,
                         ::testing::Values(HsvIsa{"Avx512Vbmi", avx512_vbmi_supported, bgr_to_hsv_tables_avx512,
                                                  hsv_to_bgr_avx512, augment_hsv_avx512},
                                           HsvIsa{"Avx2Fma", avx2_fma_supported, bgr_to_hsv_tables_avx2,
                                                  hsv_to_bgr_avx2, augment_hsv_avx2}),
                         [](const ::testing::TestParamInfo<HsvIsa>& isa) { return std::string(isa.param.name); });

TEST_P(DataHsvVector, EqualsOpenCvOnEveryColour) {
  const cv::Mat all = every_colour();
  for (uint64_t seed : {3, 4}) {
    const HsvTables t = random_tables(seed);
    cv::Mat got(all.size(), CV_8UC3);
    GetParam().to_hsv(all.data, got.data, static_cast<int64_t>(all.total()), t);
    EXPECT_EQ(cv::norm(got, reference(all, t), cv::NORM_INF), 0) << "seed " << seed;
  }
}

// HSV -> BGR on every HSV value with a hue below 180 (the only hues the tables produce), rows a multiple of 64 wide.
TEST_P(DataHsvVector, BackEqualsOpenCvOnEveryHsv) {
  cv::Mat all(2880, 4096, CV_8UC3);
  for (int i = 0; i < 180 * 65536; ++i) {
    uint8_t* p = all.data + 3 * static_cast<size_t>(i);
    p[0] = static_cast<uint8_t>(i % 180);
    p[1] = static_cast<uint8_t>((i / 180) & 255);
    p[2] = static_cast<uint8_t>(i / (180 * 256));
  }
  cv::Mat want, got(all.size(), CV_8UC3);
  cv::cvtColor(all, want, cv::COLOR_HSV2BGR);
  ASSERT_EQ(GetParam().back(all.data, got.data, static_cast<int64_t>(all.total())), static_cast<int64_t>(all.total()));
  EXPECT_EQ(cv::norm(got, want, cv::NORM_INF), 0);
}

// Lengths around the vector step: the last pixels go through the portable kernel, nothing is written past n.
TEST_P(DataHsvVector, TailsAndBounds) {
  cv::Mat img(1, 300, CV_8UC3);
  cv::randu(img, cv::Scalar::all(0), cv::Scalar::all(256));
  const HsvTables t = random_tables(7);
  for (int n : {0, 1, 31, 32, 33, 63, 64, 65, 127, 128, 129, 200, 300}) {
    std::vector<uint8_t> got(3 * 300 + 64, 0xAB), want(3 * 300 + 64, 0xAB);
    GetParam().to_hsv(img.data, got.data(), n, t);
    bgr_to_hsv_tables_scalar(img.data, want.data(), n, t);
    EXPECT_EQ(got, want) << "n " << n;
    EXPECT_EQ(got[3 * n], 0xAB) << "n " << n;
  }
}

// The fused pass converts the leading multiple of 64 pixels in place, equal to the recipe there, and leaves the rest
// of the row as it was.
TEST_P(DataHsvVector, FusedConvertsTheLeadingMultipleOf64) {
  const HsvTables t = random_tables(9);
  for (int width : {1, 32, 63, 64, 65, 96, 127, 128, 200, 640}) {
    cv::Mat img(3, width, CV_8UC3);
    cv::randu(img, cv::Scalar::all(0), cv::Scalar::all(256));
    cv::Mat got = img.clone();
    int64_t done = 0;
    for (int r = 0; r < got.rows; ++r) done = GetParam().fused(got.ptr<uint8_t>(r), width, t);
    ASSERT_EQ(done, width / 64 * 64) << "width " << width;
    if (done == 0) {
      EXPECT_EQ(cv::norm(got, img, cv::NORM_INF), 0) << "width " << width;
      continue;
    }
    const cv::Rect head(0, 0, static_cast<int>(done), img.rows);
    cv::Mat expected;
    cv::cvtColor(reference(img(head).clone(), t), expected, cv::COLOR_HSV2BGR);
    EXPECT_EQ(cv::norm(got(head), expected, cv::NORM_INF), 0) << "width " << width;
    if (done < width) {
      const cv::Rect tail(static_cast<int>(done), 0, width - static_cast<int>(done), img.rows);
      EXPECT_EQ(cv::norm(got(tail), img(tail), cv::NORM_INF), 0) << "width " << width;
    }
  }
}

// The fused pass (both conversions, the tables between) equals the recipe on images of every width around the
// 64-pixel step, whose last pixels of each row go through OpenCV.
TEST(DataHsvKernel, FusedEqualsRecipeAcrossWidths) {
  for (int width : {1, 37, 53, 63, 64, 65, 100, 128, 191, 320, 640, 643}) {
    cv::Mat img(23, width, CV_8UC3);
    cv::randu(img, cv::Scalar::all(0), cv::Scalar::all(256));
    cv::Mat got = img.clone();
    Rng a(static_cast<uint64_t>(width)), b(static_cast<uint64_t>(width));
    augment_hsv(got, 0.015, 0.7, 0.4, a);
    const double r0 = b.uniform(-1, 1) * 0.015 + 1, r1 = b.uniform(-1, 1) * 0.7 + 1, r2 = b.uniform(-1, 1) * 0.4 + 1;
    cv::Mat expected;
    cv::cvtColor(reference(img, gain_tables(r0, r1, r2)), expected, cv::COLOR_HSV2BGR);
    EXPECT_EQ(cv::norm(got, expected, cv::NORM_INF), 0) << "width " << width;
  }
}

// augment_hsv on a strided view (the warp's output has a margin) equals the recipe on a continuous copy.
TEST(DataHsvKernel, AugmentOnViewEqualsRecipe) {
  cv::Mat buffer(100, 150, CV_8UC3);
  cv::randu(buffer, cv::Scalar::all(0), cv::Scalar::all(256));
  cv::Mat view = buffer(cv::Rect(3, 2, 130, 90));
  cv::Mat copy = view.clone();
  const cv::Mat outside = buffer.clone();
  Rng a(11), b(11);
  augment_hsv(view, 0.015, 0.7, 0.4, a);
  const double r0 = b.uniform(-1, 1) * 0.015 + 1, r1 = b.uniform(-1, 1) * 0.7 + 1, r2 = b.uniform(-1, 1) * 0.4 + 1;
  cv::Mat expected;
  cv::cvtColor(reference(copy, gain_tables(r0, r1, r2)), expected, cv::COLOR_HSV2BGR);
  EXPECT_EQ(cv::norm(view, expected, cv::NORM_INF), 0);
  EXPECT_GT(cv::norm(view, copy, cv::NORM_INF), 0);
  view.setTo(cv::Scalar::all(0));
  cv::Mat outside_now = buffer.clone();
  outside_now(cv::Rect(3, 2, 130, 90)).setTo(cv::Scalar::all(0));
  cv::Mat outside_then = outside.clone();
  outside_then(cv::Rect(3, 2, 130, 90)).setTo(cv::Scalar::all(0));
  EXPECT_EQ(cv::norm(outside_now, outside_then, cv::NORM_INF), 0);  // the margin untouched
}

// Reversing rows in place equals cv::flip around the vertical axis, for widths around the 64-pixel step (the
// middle of a row, under 128 pixels, is reversed one pixel at a time), on a strided view.
TEST(DataMirrorKernel, EqualsCvFlipAcrossWidths) {
  for (int width : {1, 2, 63, 64, 65, 127, 128, 129, 191, 255, 320, 640, 643}) {
    cv::Mat buffer(9, width + 5, CV_8UC3);
    cv::randu(buffer, cv::Scalar::all(0), cv::Scalar::all(256));
    cv::Mat view = buffer(cv::Rect(2, 1, width, 7));
    cv::Mat want;
    cv::flip(view, want, 1);
    const cv::Mat before = buffer.clone();
    cv::Mat scalar = view.clone();
    for (int r = 0; r < scalar.rows; ++r) mirror_row_scalar(scalar.ptr<uint8_t>(r), width);
    EXPECT_EQ(cv::norm(scalar, want, cv::NORM_INF), 0) << "width " << width;
    if (!avx512_vbmi_supported()) continue;
    for (int r = 0; r < view.rows; ++r) mirror_row_avx512(view.ptr<uint8_t>(r), width);
    EXPECT_EQ(cv::norm(view, want, cv::NORM_INF), 0) << "width " << width;
    cv::Mat outside = buffer.clone(), outside_before = before.clone();
    outside(cv::Rect(2, 1, width, 7)).setTo(cv::Scalar::all(0));
    outside_before(cv::Rect(2, 1, width, 7)).setTo(cv::Scalar::all(0));
    EXPECT_EQ(cv::norm(outside, outside_before, cv::NORM_INF), 0) << "width " << width;  // nothing else written
  }
}

// Splitting into RGB planes equals cv::split with the planes swapped, around the 64-pixel step.
TEST(DataSplitKernel, EqualsCvSplit) {
  for (int n : {0, 1, 63, 64, 65, 640, 703}) {
    cv::Mat img(1, std::max(n, 1), CV_8UC3);
    cv::randu(img, cv::Scalar::all(0), cv::Scalar::all(256));
    cv::Mat want[3];
    cv::split(img, want);
    const bool vector = avx512_vbmi_supported();
    for (int kernel = 0; kernel < (vector ? 2 : 1); ++kernel) {
      std::vector<uint8_t> planes(3 * static_cast<size_t>(n) + 1, 0xAB);
      uint8_t* p = planes.data();
      if (kernel == 0)
        split_rgb_scalar(img.data, n, p, p + n, p + 2 * n);
      else
        split_rgb_avx512(img.data, n, p, p + n, p + 2 * n);
      for (int i = 0; i < n; ++i) {
        ASSERT_EQ(p[i], want[2].data[i]) << "n " << n << " kernel " << kernel;
        ASSERT_EQ(p[n + i], want[1].data[i]) << "n " << n << " kernel " << kernel;
        ASSERT_EQ(p[2 * n + i], want[0].data[i]) << "n " << n << " kernel " << kernel;
      }
      EXPECT_EQ(planes.back(), 0xAB) << "n " << n << " kernel " << kernel;
    }
  }
}

// flip_lr (which the rectangular training batches use) still equals cv::flip and moves the boxes.
TEST(DataMirrorKernel, FlipLrEqualsCvFlip) {
  cv::Mat img(31, 200, CV_8UC3);
  cv::randu(img, cv::Scalar::all(0), cv::Scalar::all(256));
  cv::Mat want;
  cv::flip(img, want, 1);
  std::vector<PixBox> boxes = {{1.f, 10.f, 2.f, 30.f, 20.f}};
  flip_lr(img, boxes);
  EXPECT_EQ(cv::norm(img, want, cv::NORM_INF), 0);
  EXPECT_FLOAT_EQ(boxes[0].x1, 170.f);
  EXPECT_FLOAT_EQ(boxes[0].x2, 190.f);
}

}  // namespace
}  // namespace yolo8::data
