#pragma once
// Image decoding for the loader: the same pixels as cv::imread(path, IMREAD_COLOR or IMREAD_REDUCED_COLOR_N),
// EXIF orientation included, with less overhead for JPEG (one read of the file, libjpeg-turbo straight to BGR).
#include <opencv2/core.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace yolo8::data {

// Decodes `path` to BGR uint8. `reduce` is 1, 2, 4 or 8: JPEG is scaled by 1/reduce inside the DCT, other formats
// are decoded and shrunk by OpenCV as cv::imread does. Returns an empty Mat when the file cannot be read or decoded.
cv::Mat read_image(const std::string& path, int reduce = 1);

// The same from bytes already in memory.
cv::Mat decode_image(const std::vector<uint8_t>& bytes, int reduce = 1);

// How a JPEG stream ends. A file cut inside its scan data still "decodes" (libjpeg fills the missing rows with
// grey), so only kEndMarkerMissing (every row present, just no FFD9) is usable as it is.
enum class JpegEnding { kNotJpeg, kComplete, kEndMarkerMissing, kScanDataMissing };
JpegEnding jpeg_ending(const std::vector<uint8_t>& bytes);

}  // namespace yolo8::data
