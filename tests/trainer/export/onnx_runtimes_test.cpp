// The exported file in the runtimes users deploy with: OpenCV DNN 4.6 (cv::dnn::readNetFromONNX) and ONNX Runtime
// (onnxruntime-node, pinned in onnxruntime/package-lock.json and installed by scripts/setup.sh), each matching the
// LibTorch forward of the same weights (fused, eval) within 1e-3 relative.
#include <gtest/gtest.h>
#include <opencv2/dnn.hpp>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "onnx_test_util.h"
#include "trainer/export/onnx_export.h"

namespace yolo8 {
namespace {

constexpr double kRelTol = 1e-3;  // issue 17

struct Case {
  int64_t height, width, opset;
};

std::string out_path(const std::string& name) {
  const auto dir = std::filesystem::path(test::kBinaryDir) / "test-output" / "export";
  std::filesystem::create_directories(dir);
  return (dir / name).string();
}

std::string case_name(const Case& c) {
  return std::to_string(c.height) + "x" + std::to_string(c.width) + "_opset" + std::to_string(c.opset);
}

// Exports the fixture model for `c`; returns the file, and the input and LibTorch output to compare with.
std::string export_case(const Case& c, torch::Tensor& input, torch::Tensor& reference) {
  LoadedModel loaded = test::fixture_model();
  OnnxExportOptions options;
  options.height = c.height;
  options.width = c.width;
  options.opset = c.opset;
  const std::string path = out_path("runtime_" + case_name(c) + ".onnx");
  export_onnx(loaded.model, options, path);
  torch::manual_seed(17);
  input = torch::rand({1, 3, c.height, c.width});
  reference = test::libtorch_reference(loaded.model, input);
  return path;
}

class OnnxRuntimes : public ::testing::TestWithParam<Case> {};

TEST_P(OnnxRuntimes, OpenCvDnnMatchesLibTorch) {
  torch::Tensor input, reference;
  const std::string path = export_case(GetParam(), input, reference);
  cv::dnn::Net net = cv::dnn::readNetFromONNX(path);
  ASSERT_FALSE(net.empty());
  const int dims[] = {1, 3, static_cast<int>(GetParam().height), static_cast<int>(GetParam().width)};
  cv::Mat blob(4, dims, CV_32F, input.data_ptr<float>());
  net.setInput(blob, "images");
  const cv::Mat out = net.forward("output0");
  ASSERT_EQ(out.dims, 3);
  ASSERT_EQ(out.size[0], 1);
  ASSERT_EQ(out.size[1], reference.size(1));
  ASSERT_EQ(out.size[2], reference.size(2));
  const torch::Tensor got =
      torch::from_blob(const_cast<float*>(out.ptr<float>()), {1, out.size[1], out.size[2]}, torch::kFloat).clone();
  const double rel = test::max_relative_diff(got, reference);
  std::cout << "[OpenCV DNN " << CV_VERSION << ", " << case_name(GetParam()) << "] max relative diff " << rel << "\n";
  EXPECT_LE(rel, kRelTol);
}

TEST_P(OnnxRuntimes, OnnxRuntimeMatchesLibTorch) {
  const std::filesystem::path dir = YOLO8_ONNXRUNTIME_DIR;
  if (!std::filesystem::exists(dir / "node_modules" / "onnxruntime-node")) {
    GTEST_SKIP() << "onnxruntime-node is not installed in " << dir.string()
                 << "/node_modules (scripts/setup.sh --no-build installs it)";
  }
  ASSERT_TRUE(std::string(YOLO8_NODE).size() > 0) << "node not found at configure time";
  torch::Tensor input, reference;
  const std::string path = export_case(GetParam(), input, reference);
  const std::string in_file = out_path("ort_" + case_name(GetParam()) + ".in.bin");
  const std::string out_file = out_path("ort_" + case_name(GetParam()) + ".out.bin");
  {
    std::ofstream in(in_file, std::ios::binary | std::ios::trunc);
    in.write(static_cast<const char*>(input.data_ptr()), static_cast<std::streamsize>(input.numel() * sizeof(float)));
  }
  std::filesystem::remove(out_file);
  std::ostringstream cmd;
  cmd << "YOLO8_INPUT_DIMS=1,3," << GetParam().height << "," << GetParam().width << " '" << YOLO8_NODE << "' '"
      << (dir / "run.mjs").string() << "' '" << path << "' '" << in_file << "' '" << out_file << "' 2>&1";
  FILE* pipe = popen(cmd.str().c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string log;
  char buf[512];
  while (fgets(buf, sizeof(buf), pipe)) log += buf;
  const int status = pclose(pipe);
  ASSERT_EQ(status, 0) << cmd.str() << "\n" << log;

  std::ifstream out(out_file, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(out)), std::istreambuf_iterator<char>());
  ASSERT_EQ(bytes.size(), static_cast<size_t>(reference.numel()) * sizeof(float)) << log;
  const torch::Tensor got = torch::from_blob(bytes.data(), reference.sizes(), torch::kFloat).clone();
  const double rel = test::max_relative_diff(got, reference);
  std::cout << "[ONNX Runtime " << log.substr(0, log.find('\n')) << ", " << case_name(GetParam())
            << "] max relative diff " << rel << "\n";
  EXPECT_LE(rel, kRelTol);
}

INSTANTIATE_TEST_SUITE_P(Sizes, OnnxRuntimes,
                         ::testing::Values(Case{160, 160, 12}, Case{128, 192, 12}, Case{128, 192, 13}),
                         [](const ::testing::TestParamInfo<Case>& param) { return case_name(param.param); });

}  // namespace
}  // namespace yolo8
