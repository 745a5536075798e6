// The loader's decoder gives cv::imread's pixels: every EXIF orientation, DCT reduction, other formats, bad files.
#include "data/image_io.h"

#include <gtest/gtest.h>
#include <opencv2/core.hpp>
#include <opencv2/imgcodecs.hpp>
#include <opencv2/imgproc.hpp>

#include <fstream>
#include <string>
#include <vector>

#include "test_util.h"

namespace yolo8::data {
namespace {

cv::Mat test_picture(int h, int w) {
  cv::Mat img(h, w, CV_8UC3);
  cv::randu(img, cv::Scalar::all(0), cv::Scalar::all(255));
  cv::GaussianBlur(img, img, cv::Size(7, 7), 2);
  cv::rectangle(img, cv::Rect(3, 2, w / 3, h / 4), cv::Scalar(20, 220, 40), cv::FILLED);  // asymmetric marker
  return img;
}

// A JPEG with an APP1 segment holding only the EXIF orientation tag (little- or big-endian TIFF).
std::vector<uint8_t> jpeg_with_orientation(const cv::Mat& img, int orientation, bool big_endian) {
  std::vector<uint8_t> jpeg;
  cv::imencode(".jpg", img, jpeg, {cv::IMWRITE_JPEG_QUALITY, 92});
  auto u16 = [&](std::vector<uint8_t>& v, int x) {
    if (big_endian)
      v.insert(v.end(), {uint8_t(x >> 8), uint8_t(x)});
    else
      v.insert(v.end(), {uint8_t(x), uint8_t(x >> 8)});
  };
  auto u32 = [&](std::vector<uint8_t>& v, uint32_t x) {
    if (big_endian)
      v.insert(v.end(), {uint8_t(x >> 24), uint8_t(x >> 16), uint8_t(x >> 8), uint8_t(x)});
    else
      v.insert(v.end(), {uint8_t(x), uint8_t(x >> 8), uint8_t(x >> 16), uint8_t(x >> 24)});
  };
  std::vector<uint8_t> payload = {'E', 'x', 'i', 'f', 0, 0};
  if (big_endian)
    payload.insert(payload.end(), {'M', 'M'});
  else
    payload.insert(payload.end(), {'I', 'I'});
  u16(payload, 42);
  u32(payload, 8);
  u16(payload, 1);       // one entry
  u16(payload, 0x0112);  // orientation
  u16(payload, 3);       // SHORT
  u32(payload, 1);
  u16(payload, orientation);
  u16(payload, 0);
  u32(payload, 0);  // no next IFD
  std::vector<uint8_t> app1 = {0xFF, 0xE1};
  const int length = static_cast<int>(payload.size()) + 2;
  app1.insert(app1.end(), {uint8_t(length >> 8), uint8_t(length)});
  app1.insert(app1.end(), payload.begin(), payload.end());
  jpeg.insert(jpeg.begin() + 2, app1.begin(), app1.end());
  return jpeg;
}

std::string write_bytes(const std::string& dir, const std::string& name, const std::vector<uint8_t>& bytes) {
  const std::string path = dir + "/" + name;
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  return path;
}

TEST(DataImageIo, EveryExifOrientationMatchesImread) {
  const std::string dir = test::scratch_dir("exif");
  const cv::Mat img = test_picture(40, 64);
  for (int orientation = 1; orientation <= 8; ++orientation) {
    for (bool big_endian : {false, true}) {
      const auto bytes = jpeg_with_orientation(img, orientation, big_endian);
      const std::string path = write_bytes(dir, "o" + std::to_string(orientation) + ".jpg", bytes);
      const cv::Mat expected = cv::imread(path, cv::IMREAD_COLOR);
      const cv::Mat got = read_image(path);
      ASSERT_FALSE(got.empty()) << orientation;
      ASSERT_EQ(got.size(), expected.size()) << "orientation " << orientation;
      EXPECT_EQ(cv::norm(got, expected, cv::NORM_INF), 0) << "orientation " << orientation;
      // Orientations 5..8 swap the sides.
      EXPECT_EQ(got.rows, orientation >= 5 ? 64 : 40);
    }
  }
}

// An IFD offset near 4 GiB (or past the segment) is ignored: orientation 1, no read outside the buffer.
TEST(DataImageIo, HostileExifOffsetsAreIgnored) {
  const cv::Mat img = test_picture(24, 32);
  for (const uint32_t offset : {0xFFFFFFFEu, 0xFFFFFFF0u, 0x10000u, 30u}) {
    std::vector<uint8_t> bytes = jpeg_with_orientation(img, 6, false);
    // SOI, APP1 marker and length, "Exif\0\0", "II", 42: the IFD offset starts at byte 16.
    for (int k = 0; k < 4; ++k) bytes[16 + k] = static_cast<uint8_t>(offset >> (8 * k));
    const cv::Mat got = decode_image(bytes);
    ASSERT_EQ(got.size(), img.size()) << offset;  // orientation 6 would have swapped the sides
    EXPECT_EQ(cv::norm(got, decode_image(jpeg_with_orientation(img, 1, false)), cv::NORM_INF), 0) << offset;
  }
}

TEST(DataImageIo, ReducedDecodeMatchesImreadReduced) {
  const std::string dir = test::scratch_dir("reduced");
  const cv::Mat img = test_picture(203, 317);  // odd sizes: the reduced size rounds up
  std::vector<uint8_t> jpeg;
  cv::imencode(".jpg", img, jpeg);
  const std::string path = write_bytes(dir, "big.jpg", jpeg);
  const std::pair<int, int> cases[] = {{1, cv::IMREAD_COLOR},
                                       {2, cv::IMREAD_REDUCED_COLOR_2},
                                       {4, cv::IMREAD_REDUCED_COLOR_4},
                                       {8, cv::IMREAD_REDUCED_COLOR_8}};
  for (const auto& [reduce, flag] : cases) {
    const cv::Mat expected = cv::imread(path, flag);
    const cv::Mat got = read_image(path, reduce);
    ASSERT_EQ(got.size(), expected.size()) << "reduce " << reduce;
    EXPECT_EQ(cv::norm(got, expected, cv::NORM_INF), 0) << "reduce " << reduce;
  }
}

TEST(DataImageIo, OtherFormatsGoThroughOpenCv) {
  const std::string dir = test::scratch_dir("formats");
  const cv::Mat img = test_picture(30, 50);
  for (const std::string ext : {".png", ".bmp"}) {
    const std::string path = dir + "/a" + ext;
    ASSERT_TRUE(cv::imwrite(path, img));
    const cv::Mat full = read_image(path);
    ASSERT_EQ(full.size(), img.size()) << ext;
    EXPECT_EQ(cv::norm(full, img, cv::NORM_INF), 0) << ext;
    const cv::Mat reduced = read_image(path, 2);
    const cv::Mat expected = cv::imread(path, cv::IMREAD_REDUCED_COLOR_2);
    ASSERT_EQ(reduced.size(), expected.size()) << ext;
    EXPECT_EQ(cv::norm(reduced, expected, cv::NORM_INF), 0) << ext;
  }
  cv::Mat gray;
  cv::cvtColor(img, gray, cv::COLOR_BGR2GRAY);
  std::vector<uint8_t> jpeg;
  cv::imencode(".jpg", gray, jpeg);
  const std::string path = write_bytes(dir, "gray.jpg", jpeg);
  const cv::Mat got = read_image(path);
  ASSERT_EQ(got.type(), CV_8UC3);
  EXPECT_EQ(cv::norm(got, cv::imread(path, cv::IMREAD_COLOR), cv::NORM_INF), 0);
}

// Cut inside the scan data (baseline or progressive) vs only the end marker missing.
TEST(DataImageIo, JpegEndingTellsACutFileFromAMissingEndMarker) {
  for (const int progressive : {0, 1}) {
    std::vector<uint8_t> jpeg;
    cv::imencode(".jpg", test_picture(96, 64), jpeg, {cv::IMWRITE_JPEG_PROGRESSIVE, progressive});
    SCOPED_TRACE(progressive ? "progressive" : "baseline");
    EXPECT_EQ(jpeg_ending(jpeg), JpegEnding::kComplete);
    EXPECT_EQ(jpeg_ending({jpeg.begin(), jpeg.end() - 2}), JpegEnding::kEndMarkerMissing);
    EXPECT_EQ(jpeg_ending({jpeg.begin(), jpeg.begin() + static_cast<long>(jpeg.size() / 3)}),
              JpegEnding::kScanDataMissing);
    EXPECT_EQ(jpeg_ending({jpeg.begin(), jpeg.end() - 40}), JpegEnding::kScanDataMissing);
  }
  std::vector<uint8_t> png;
  cv::imencode(".png", test_picture(16, 16), png);
  EXPECT_EQ(jpeg_ending(png), JpegEnding::kNotJpeg);
}

TEST(DataImageIo, BadFilesGiveAnEmptyImageNotACrash) {
  const std::string dir = test::scratch_dir("bad");
  EXPECT_TRUE(read_image(dir + "/missing.jpg").empty());
  EXPECT_TRUE(read_image(write_bytes(dir, "empty.jpg", {})).empty());
  EXPECT_TRUE(read_image(write_bytes(dir, "text.jpg", {'h', 'e', 'l', 'l', 'o'})).empty());
  std::vector<uint8_t> jpeg;
  cv::imencode(".jpg", test_picture(64, 64), jpeg);
  // Only the header: libjpeg fails before any row; the fallback fails too; nothing throws.
  EXPECT_NO_THROW(read_image(write_bytes(dir, "header.jpg", {jpeg.begin(), jpeg.begin() + 20})));
  // A truncated scan keeps the rows that arrived, as cv::imread does.
  const std::vector<uint8_t> half(jpeg.begin(), jpeg.begin() + static_cast<long>(jpeg.size() / 2));
  const std::string path = write_bytes(dir, "half.jpg", half);
  const cv::Mat got = read_image(path);
  const cv::Mat expected = cv::imread(path, cv::IMREAD_COLOR);
  ASSERT_EQ(got.empty(), expected.empty());
  if (!got.empty()) {
    ASSERT_EQ(got.size(), expected.size());
    EXPECT_EQ(cv::norm(got, expected, cv::NORM_INF), 0);
  }
  // Random bit flips never crash: anywhere in the file, or in its EXIF segment.
  cv::RNG rng(3);
  const std::vector<uint8_t> with_exif = jpeg_with_orientation(test_picture(64, 64), 6, false);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<uint8_t> broken = trial % 2 ? jpeg : with_exif;
    const int end = trial % 2 ? static_cast<int>(broken.size()) : 38;  // the APP1 segment is bytes 2..37
    for (int k = 0; k < 4; ++k) {
      const auto at = static_cast<size_t>(rng.uniform(2, end));
      broken[at] = static_cast<uint8_t>(broken[at] ^ (1 << rng.uniform(0, 8)));
    }
    EXPECT_NO_THROW(decode_image(broken));
  }
}

}  // namespace
}  // namespace yolo8::data
