#include "trainer/runtime/torch_warnings.h"

#include <gtest/gtest.h>

#include <sstream>
#include <string>

namespace yolo8 {
namespace {

int64_t occurrences(const std::string& text, const std::string& what) {
  int64_t count = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++count;
  return count;
}

TEST(TorchWarnings, EachDistinctWarningIsPrintedOnce) {
  std::ostringstream out;
  OnceWarningHandler handler(out);
  c10::WarningUtils::WarningHandlerGuard guard(&handler);
  for (int i = 0; i < 5; ++i) TORCH_WARN("upsample_nearest2d_backward_out_cuda does not have a deterministic kernel");
  TORCH_WARN("another warning");
  EXPECT_EQ(occurrences(out.str(), "upsample_nearest2d_backward_out_cuda"), 1) << out.str();
  EXPECT_EQ(occurrences(out.str(), "another warning"), 1) << out.str();
  EXPECT_EQ(handler.repeats(), 4);
  EXPECT_NE(out.str().find("LibTorch warning (shown once)"), std::string::npos);
}

}  // namespace
}  // namespace yolo8
