#include "trainer/runtime/console.h"

#include <unistd.h>

#include <cstdarg>

namespace yolo8 {
namespace {

// Unbuffered: every write goes straight to the FILE, so stream and printf-style lines keep their order.
class FileBuffer : public std::streambuf {
 public:
  explicit FileBuffer(std::FILE* file) : file_(file) {}

 protected:
  int_type overflow(int_type c) override {
    if (traits_type::eq_int_type(c, traits_type::eof())) return traits_type::not_eof(c);
    return std::fputc(c, file_) == EOF ? traits_type::eof() : c;
  }
  std::streamsize xsputn(const char* text, std::streamsize n) override {
    return static_cast<std::streamsize>(std::fwrite(text, 1, static_cast<size_t>(n), file_));
  }
  int sync() override { return std::fflush(file_) == 0 ? 0 : -1; }

 private:
  std::FILE* file_;
};

// Accepts and drops everything.
class NullBuffer : public std::streambuf {
 protected:
  int_type overflow(int_type c) override { return traits_type::not_eof(c); }
  std::streamsize xsputn(const char*, std::streamsize n) override { return n; }
};

std::unique_ptr<std::streambuf> buffer_for(bool quiet, std::FILE* file) {
  if (quiet) return std::make_unique<NullBuffer>();
  return std::make_unique<FileBuffer>(file);
}

}  // namespace

void line_buffer_stdout() {
  if (isatty(fileno(stdout)) == 0) std::setvbuf(stdout, nullptr, _IOLBF, BUFSIZ);
}

Console::Console(int rank, std::FILE* out, std::FILE* err)
    : quiet_(rank != 0),
      out_file_(out),
      out_buffer_(buffer_for(quiet_, out)),
      err_buffer_(buffer_for(quiet_, err)),
      out_stream_(out_buffer_.get()),
      err_stream_(err_buffer_.get()) {}

Console::~Console() {
  out_stream_.flush();
  err_stream_.flush();
}

void Console::printf(const char* format, ...) {
  if (quiet_) return;
  std::va_list args;
  va_start(args, format);
  std::vfprintf(out_file_, format, args);
  va_end(args);
}

}  // namespace yolo8
