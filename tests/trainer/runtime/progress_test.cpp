#include "trainer/runtime/progress.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <string>

namespace yolo8 {
namespace {

std::string read_all(std::FILE* file) {
  std::rewind(file);
  std::string text;
  char buffer[256];
  while (std::fgets(buffer, sizeof(buffer), file)) text += buffer;
  return text;
}

TEST(ProgressBar, PlainLinesWhenNotATerminal) {
  std::FILE* file = std::tmpfile();
  ProgressBar bar("1/3", 100, /*interactive=*/0, file);
  for (long i = 1; i <= 100; ++i) bar.update(i, "box 1.0");
  bar.finish("box 1.0");
  const std::string text = read_all(file);
  std::fclose(file);
  size_t lines = 0;
  for (char c : text) lines += c == '\n';
  EXPECT_EQ(lines, 10u);  // one per 10 %
  EXPECT_EQ(text.find('\r'), std::string::npos);
  EXPECT_NE(text.find("100% 100/100"), std::string::npos);
}

TEST(ProgressBar, RedrawsInPlaceOnATerminal) {
  std::FILE* file = std::tmpfile();
  ProgressBar bar("1/3", 4, /*interactive=*/1, file);
  bar.update(4, "x");
  bar.finish("x");
  const std::string text = read_all(file);
  std::fclose(file);
  EXPECT_NE(text.find('\r'), std::string::npos);
  EXPECT_NE(text.find("####"), std::string::npos);
}

TEST(ProgressBar, DurationFormat) {
  EXPECT_EQ(ProgressBar::format_duration(65), "01:05");
  EXPECT_EQ(ProgressBar::format_duration(3725), "1:02:05");
  EXPECT_EQ(ProgressBar::format_duration(-1), "?");
}

}  // namespace
}  // namespace yolo8
