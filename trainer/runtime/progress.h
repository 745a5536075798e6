#pragma once
// Per-epoch progress: a redrawn bar on a terminal, plain periodic lines otherwise (Kubernetes logs).

#include <chrono>
#include <cstdio>
#include <string>

#include "trainer/runtime/console.h"

namespace yolo8 {

class ProgressBar {
 public:
  // `interactive` defaults to whether `out` is a terminal; a null `out` draws nothing.
  ProgressBar(std::string prefix, long total, int interactive = -1, std::FILE* out = stdout);
  // Draws on the console's out file: nothing on a quiet (non-main rank) console.
  ProgressBar(std::string prefix, long total, const Console& console, int interactive = -1);
  // `done` items finished; `fields` is the running text (losses, instances, memory).
  void update(long done, const std::string& fields);
  void finish(const std::string& fields);

  static std::string format_duration(double seconds);

 private:
  void draw(long done, const std::string& fields, bool final_line);

  std::string prefix_;
  long total_;
  bool interactive_;
  std::FILE* out_;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_draw_;
  long last_logged_percent_ = -1;
};

}  // namespace yolo8
