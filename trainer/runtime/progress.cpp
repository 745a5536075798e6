#include "trainer/runtime/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <utility>

namespace yolo8 {

ProgressBar::ProgressBar(std::string prefix, long total, int interactive, std::FILE* out)
    : prefix_(std::move(prefix)),
      total_(std::max(total, 1L)),
      interactive_(interactive < 0 ? out != nullptr && isatty(fileno(out)) != 0 : interactive != 0),
      out_(out),
      start_(std::chrono::steady_clock::now()),
      last_draw_(start_) {}

ProgressBar::ProgressBar(std::string prefix, long total, const Console& console, int interactive)
    : ProgressBar(std::move(prefix), total, interactive, console.out_file()) {}

std::string ProgressBar::format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const long total = std::lround(seconds);
  char text[32];
  if (total >= 3600) {
    std::snprintf(text, sizeof(text), "%ld:%02ld:%02ld", total / 3600, (total / 60) % 60, total % 60);
  } else {
    std::snprintf(text, sizeof(text), "%02ld:%02ld", total / 60, total % 60);
  }
  return text;
}

void ProgressBar::update(long done, const std::string& fields) {
  if (out_ == nullptr) return;
  const auto now = std::chrono::steady_clock::now();
  if (interactive_) {
    // Redraw at most 10 times a second; the terminal is not the bottleneck we want.
    if (now - last_draw_ < std::chrono::milliseconds(100) && done < total_) return;
    last_draw_ = now;
    draw(done, fields, false);
    return;
  }
  // Logs: a line every 10 % or every 30 s, whichever comes first.
  const long percent = done * 100 / total_;
  const bool step = percent / 10 > last_logged_percent_ / 10;
  if (step || now - last_draw_ > std::chrono::seconds(30)) {
    last_logged_percent_ = percent;
    last_draw_ = now;
    draw(done, fields, true);
  }
}

void ProgressBar::finish(const std::string& fields) {
  if (out_ == nullptr) return;
  if (interactive_) {
    draw(total_, fields, false);
    std::fputc('\n', out_);
  } else if (last_logged_percent_ < 100) {
    draw(total_, fields, true);
  }
  std::fflush(out_);
}

void ProgressBar::draw(long done, const std::string& fields, bool final_line) {
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const double rate = elapsed > 0 ? done / elapsed : 0.0;
  const double eta = rate > 0 ? (total_ - done) / rate : NAN;
  const long percent = done * 100 / total_;
  char tail[160];
  std::snprintf(tail, sizeof(tail), "%3ld%% %ld/%ld [%s<%s, %.2fit/s]", percent, done, total_,
                format_duration(elapsed).c_str(), format_duration(eta).c_str(), rate);
  if (interactive_) {
    constexpr int kWidth = 20;
    const int filled = static_cast<int>(kWidth * done / total_);
    std::string bar(filled, '#');
    bar.resize(kWidth, '.');
    std::fprintf(out_, "\r\033[K%s %s |%s| %s", prefix_.c_str(), fields.c_str(), bar.c_str(), tail);
  } else {
    std::fprintf(out_, "%s %s %s\n", prefix_.c_str(), fields.c_str(), tail);
  }
  if (final_line || interactive_) std::fflush(out_);
}

}  // namespace yolo8
