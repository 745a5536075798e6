#pragma once
// The run's text output, aware of the data-parallel rank: rank 0 prints, the other ranks print nothing (they
// would repeat rank 0's lines). Every path a run writes through (streams, printf-style lines, the progress bar)
// goes through one Console, so no rank needs std::cout muted.

#include <cstdio>
#include <memory>
#include <ostream>
#include <streambuf>

namespace yolo8 {

// Makes stdout line-buffered when it is not a terminal (a pipe to `kubectl logs`, a file), so each line shows as
// it is written rather than a block later. Call first in main, before anything is written.
void line_buffer_stdout();

class Console {
 public:
  // Quiet unless `rank` is 0. `out` and `err` default to the process's stdout and stderr.
  explicit Console(int rank = 0, std::FILE* out = stdout, std::FILE* err = stderr);
  ~Console();
  Console(const Console&) = delete;
  Console& operator=(const Console&) = delete;

  bool quiet() const { return quiet_; }
  std::ostream& out() { return out_stream_; }
  std::ostream& err() { return err_stream_; }
  // A printf-style write to out().
  void printf(const char* format, ...) __attribute__((format(printf, 2, 3)));
  // Where a progress bar draws: null when quiet (see ProgressBar).
  std::FILE* out_file() const { return quiet_ ? nullptr : out_file_; }

 private:
  bool quiet_;
  std::FILE* out_file_;
  std::unique_ptr<std::streambuf> out_buffer_;
  std::unique_ptr<std::streambuf> err_buffer_;
  std::ostream out_stream_;
  std::ostream err_stream_;
};

}  // namespace yolo8
