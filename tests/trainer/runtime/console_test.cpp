// The rank-aware console: rank 0 prints through every path a run uses, other ranks print nothing.
#include "trainer/runtime/console.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "trainer/runtime/progress.h"

namespace yolo8 {
namespace {

std::string read_all(std::FILE* file) {
  std::fflush(file);
  std::rewind(file);
  std::string text;
  char buffer[256];
  while (std::fgets(buffer, sizeof(buffer), file)) text += buffer;
  return text;
}

// Streams, printf-style lines and the progress bar, as a training epoch writes them.
void write_everything(Console& console) {
  console.out() << "Settings:" << 3 << "\n";
  console.err() << "warning\n";
  console.printf("Cost: %.2f GPU-hours\n", 1.5);
  ProgressBar bar("1/2", 4, console, /*interactive=*/0);
  for (long i = 1; i <= 4; ++i) bar.update(i, "box 1.0");
  bar.finish("box 1.0");
  console.out() << std::flush;
}

TEST(Console, MainRankPrintsThroughEveryPath) {
  std::FILE* out = std::tmpfile();
  std::FILE* err = std::tmpfile();
  {
    Console console(0, out, err);
    EXPECT_FALSE(console.quiet());
    write_everything(console);
  }
  const std::string text = read_all(out);
  EXPECT_NE(text.find("Settings:3\n"), std::string::npos) << text;
  EXPECT_NE(text.find("Cost: 1.50 GPU-hours\n"), std::string::npos) << text;
  EXPECT_NE(text.find("1/2 box 1.0 100% 4/4"), std::string::npos) << text;
  // Stream and printf-style writes keep their order.
  EXPECT_LT(text.find("Settings:"), text.find("Cost:"));
  EXPECT_EQ(read_all(err), "warning\n");
  std::fclose(out);
  std::fclose(err);
}

TEST(Console, OtherRanksPrintNothing) {
  std::FILE* out = std::tmpfile();
  std::FILE* err = std::tmpfile();
  {
    Console console(1, out, err);
    EXPECT_TRUE(console.quiet());
    write_everything(console);
  }
  EXPECT_EQ(read_all(out), "");
  EXPECT_EQ(read_all(err), "");
  std::fclose(out);
  std::fclose(err);
}

}  // namespace
}  // namespace yolo8
