#include "data/image_io.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <opencv2/imgcodecs.hpp>

#include <csetjmp>
#include <cstdio>

#ifdef YOLO8_HAVE_LIBJPEG
#include <jpeglib.h>
#endif

namespace yolo8::data {
namespace {

bool read_file(const std::string& path, std::vector<uint8_t>& bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  struct stat st {};
  if (::fstat(fd, &st) != 0 || st.st_size <= 0) {
    ::close(fd);
    return false;
  }
  bytes.resize(static_cast<size_t>(st.st_size));
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::read(fd, bytes.data() + done, bytes.size() - done);
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  bytes.resize(done);
  return done > 0;
}

bool is_jpeg_stream(const std::vector<uint8_t>& bytes) {
  return bytes.size() > 3 && bytes[0] == 0xFF && bytes[1] == 0xD8 && bytes[2] == 0xFF;
}

uint32_t read_u16(const uint8_t* p, bool little) { return little ? p[0] | p[1] << 8 : p[0] << 8 | p[1]; }
uint32_t read_u32(const uint8_t* p, bool little) {
  return little ? read_u16(p, true) | read_u16(p + 2, true) << 16 : read_u16(p, false) << 16 | read_u16(p + 2, false);
}

// Orientation tag (0x0112) of IFD0 in an APP1 payload ("Exif\0\0" + TIFF); 1 when absent or malformed.
int orientation_from_app1(const uint8_t* data, size_t size) {
  if (size < 14 || std::string(reinterpret_cast<const char*>(data), 4) != "Exif") return 1;
  const uint8_t* tiff = data + 6;
  const size_t n = size - 6;
  const bool little = tiff[0] == 'I' && tiff[1] == 'I';
  if (!little && !(tiff[0] == 'M' && tiff[1] == 'M')) return 1;
  const size_t ifd = read_u32(tiff + 4, little);  // size_t: an offset near 4 GiB must not wrap past the check
  if (ifd + 2 > n) return 1;
  const size_t entries = read_u16(tiff + ifd, little);
  for (size_t e = 0; e < entries; ++e) {
    const size_t at = ifd + 2 + 12 * e;
    if (at + 12 > n) return 1;
    if (read_u16(tiff + at, little) == 0x0112) {
      const uint32_t value = read_u16(tiff + at + 8, little);
      return value >= 1 && value <= 8 ? static_cast<int>(value) : 1;
    }
  }
  return 1;
}

// What cv::imread does for each EXIF orientation.
void apply_orientation(cv::Mat& img, int orientation) {
  switch (orientation) {
    case 2: cv::flip(img, img, 1); break;
    case 3: cv::flip(img, img, -1); break;
    case 4: cv::flip(img, img, 0); break;
    case 5: cv::transpose(img, img); break;
    case 6:
      cv::transpose(img, img);
      cv::flip(img, img, 1);
      break;
    case 7:
      cv::transpose(img, img);
      cv::flip(img, img, -1);
      break;
    case 8:
      cv::transpose(img, img);
      cv::flip(img, img, 0);
      break;
    default: break;
  }
}

#ifdef YOLO8_HAVE_LIBJPEG
struct JpegErrorJump {
  jpeg_error_mgr manager;
  std::jmp_buf jump;
};

void jpeg_error_to_jump(j_common_ptr info) { std::longjmp(reinterpret_cast<JpegErrorJump*>(info->err)->jump, 1); }
// Recoverable corruption (a truncated scan) keeps the decoded rows, like OpenCV, but without printing.
void jpeg_silent_message(j_common_ptr, int) {}

// Only plain C state lives in this frame: longjmp out of libjpeg skips no destructor. `out` belongs to the caller.
bool decode_jpeg(const std::vector<uint8_t>& bytes, int reduce, cv::Mat& out, int& orientation) {
  jpeg_decompress_struct info;
  JpegErrorJump error;
  info.err = jpeg_std_error(&error.manager);
  error.manager.error_exit = jpeg_error_to_jump;
  error.manager.emit_message = jpeg_silent_message;
  if (setjmp(error.jump)) {
    jpeg_destroy_decompress(&info);
    return false;
  }
  jpeg_create_decompress(&info);
  // Older libjpeg declares the buffer non-const; it is only read.
  jpeg_mem_src(&info, const_cast<unsigned char*>(bytes.data()), static_cast<unsigned long>(bytes.size()));
  jpeg_save_markers(&info, JPEG_APP0 + 1, 0xFFFF);
  jpeg_read_header(&info, TRUE);
  orientation = 1;
  for (jpeg_saved_marker_ptr m = info.marker_list; m; m = m->next) {
    if (m->marker == JPEG_APP0 + 1) orientation = orientation_from_app1(m->data, m->data_length);
  }
  // Colour spaces libjpeg-turbo cannot turn into BGR (CMYK, YCCK) go to OpenCV.
  if (info.jpeg_color_space == JCS_CMYK || info.jpeg_color_space == JCS_YCCK) {
    jpeg_destroy_decompress(&info);
    return false;
  }
  info.out_color_space = JCS_EXT_BGR;
  info.scale_num = 1;
  info.scale_denom = static_cast<unsigned int>(reduce);
  jpeg_start_decompress(&info);
  out.create(static_cast<int>(info.output_height), static_cast<int>(info.output_width), CV_8UC3);
  while (info.output_scanline < info.output_height) {
    JSAMPROW row = out.ptr<uint8_t>(static_cast<int>(info.output_scanline));
    if (jpeg_read_scanlines(&info, &row, 1) != 1) break;
  }
  jpeg_finish_decompress(&info);
  jpeg_destroy_decompress(&info);
  return true;
}
#endif

#ifdef YOLO8_HAVE_LIBJPEG
// Counts libjpeg's warnings (a premature end of data, a marker inside the scan) instead of printing them.
void jpeg_count_warning(j_common_ptr info, int level) {
  if (level < 0) ++info->err->num_warnings;
}

// Decodes (at 1/8 scale: the entropy decoding is the same, the IDCT cheaper) and returns libjpeg's warning count,
// or -1 when it fails outright. As in decode_jpeg, only C state lives in this frame (the row is libjpeg's).
long jpeg_warnings(const std::vector<uint8_t>& bytes) {
  jpeg_decompress_struct info;
  JpegErrorJump error;
  info.err = jpeg_std_error(&error.manager);
  error.manager.error_exit = jpeg_error_to_jump;
  error.manager.emit_message = jpeg_count_warning;
  if (setjmp(error.jump)) {
    jpeg_destroy_decompress(&info);
    return -1;
  }
  jpeg_create_decompress(&info);
  jpeg_mem_src(&info, const_cast<unsigned char*>(bytes.data()), static_cast<unsigned long>(bytes.size()));
  jpeg_read_header(&info, TRUE);
  info.scale_num = 1;
  info.scale_denom = 8;
  jpeg_start_decompress(&info);
  JSAMPARRAY row = (*info.mem->alloc_sarray)(reinterpret_cast<j_common_ptr>(&info), JPOOL_IMAGE,
                                             info.output_width * static_cast<JDIMENSION>(info.output_components), 1);
  while (info.output_scanline < info.output_height) {
    if (jpeg_read_scanlines(&info, row, 1) != 1) break;
  }
  jpeg_finish_decompress(&info);
  const long warnings = error.manager.num_warnings;
  jpeg_destroy_decompress(&info);
  return warnings;
}
#endif

int reduced_flag(int reduce) {
  switch (reduce) {
    case 2: return cv::IMREAD_REDUCED_COLOR_2;
    case 4: return cv::IMREAD_REDUCED_COLOR_4;
    case 8: return cv::IMREAD_REDUCED_COLOR_8;
    default: return cv::IMREAD_COLOR;
  }
}

}  // namespace

cv::Mat decode_image(const std::vector<uint8_t>& bytes, int reduce) {
  if (reduce != 1 && reduce != 2 && reduce != 4 && reduce != 8) reduce = 1;
  cv::Mat img;
#ifdef YOLO8_HAVE_LIBJPEG
  int orientation = 1;
  if (is_jpeg_stream(bytes) && decode_jpeg(bytes, reduce, img, orientation)) {
    apply_orientation(img, orientation);
    return img;
  }
  img.release();
#endif
  if (bytes.empty()) return img;
  return cv::imdecode(bytes, reduced_flag(reduce));
}

JpegEnding jpeg_ending(const std::vector<uint8_t>& bytes) {
  if (!is_jpeg_stream(bytes)) return JpegEnding::kNotJpeg;
  const size_t n = bytes.size();
  if (n >= 4 && bytes[n - 2] == 0xFF && bytes[n - 1] == 0xD9) return JpegEnding::kComplete;
#ifdef YOLO8_HAVE_LIBJPEG
  // With the end marker put back, a file whose scans are whole decodes without a single warning; one cut inside
  // its scan data meets the marker early ("premature end of data segment").
  std::vector<uint8_t> closed = bytes;
  closed.push_back(0xFF);
  closed.push_back(0xD9);
  if (jpeg_warnings(closed) == 0) return JpegEnding::kEndMarkerMissing;
#endif
  return JpegEnding::kScanDataMissing;
}

cv::Mat read_image(const std::string& path, int reduce) {
  thread_local std::vector<uint8_t> bytes;
  if (!read_file(path, bytes)) return {};
  cv::Mat img = decode_image(bytes, reduce);
  // Keep the buffer for the next file, unless one huge image would pin memory for the thread's lifetime.
  if (bytes.capacity() > (size_t{64} << 20)) std::vector<uint8_t>().swap(bytes);
  return img;
}

}  // namespace yolo8::data
