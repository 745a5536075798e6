#pragma once
// Small helpers shared by the data tests: scratch folders and file writers.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "test_paths.h"

namespace yolo8::test {

// A fresh, empty folder under the build tree, private to the running test (ctest -j runs tests side by side).
inline std::string scratch_dir(const std::string& name) {
  namespace fs = std::filesystem;
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string test = info ? std::string(info->test_suite_name()) + "." + info->name() : "global";
  for (auto& c : test)
    if (c == '/') c = '_';
  fs::path p = fs::path(kBinaryDir) / "test_scratch" / "data" / test / name;
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}

inline void write_text(const std::string& path, const std::string& text) {
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream(path) << text;
}

}  // namespace yolo8::test
