// The exported file in the runtimes users deploy with: OpenCV DNN 4.6 (cv::dnn::readNetFromONNX) and ONNX Runtime
// 1.20.1 (PyPI's onnxruntime in .venv/tools, pinned by scripts/locks/tools.txt and installed by scripts/setup.sh, run
// by ort_run.py after onnx's full checker accepted the file), each matching the LibTorch forward of the same weights
// (fused, eval) within 1e-3 relative.
#include <onnx/onnx_pb.h>
#include <sys/wait.h>

#include <gtest/gtest.h>
#include <opencv2/dnn.hpp>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "onnx_test_util.h"
#include "trainer/export/onnx_export.h"

namespace yolo8 {
namespace {

constexpr double kRelTol = 1e-3;

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

// Exports the fixture model for `c`; returns the file, and the input and LibTorch output to compare with. `tag`
// keeps the file of a test apart from those of tests ctest runs beside it.
std::string export_case(const Case& c, torch::Tensor& input, torch::Tensor& reference, const std::string& tag = "") {
  LoadedModel loaded = test::fixture_model();
  OnnxExportOptions options;
  options.height = c.height;
  options.width = c.width;
  options.opset = c.opset;
  const std::string path = out_path("runtime_" + case_name(c) + tag + ".onnx");
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

// What ort_run.py printed and how it exited.
struct OrtRun {
  int status = -1;
  std::string log;   // stdout and stderr
  std::string json;  // the line it prints after a run: input, dims, ort, onnx, opset, ir
};

// Why the ONNX Runtime tests cannot run here, or "" when they can: the tools environment or its onnxruntime is
// missing. Anything else wrong with it (an import that fails, a checker that rejects) fails the test instead.
std::string ort_missing() {
  const std::filesystem::path python = YOLO8_TOOLS_PYTHON;
  if (!std::filesystem::exists(python)) {
    return python.string() + " does not exist (scripts/setup.sh installs it from scripts/locks/tools.txt)";
  }
  const std::string probe = "'" + python.string() +
                            "' -c 'import importlib.util, sys; "
                            "sys.exit(0 if importlib.util.find_spec(\"onnxruntime\") else 3)' 2>&1";
  if (WEXITSTATUS(std::system(probe.c_str())) == 3) {
    return "onnxruntime is not installed in " + python.string() +
           "'s environment (scripts/setup.sh installs it from scripts/locks/tools.txt)";
  }
  return "";
}

// ort_run.py MODEL IN OUT with YOLO8_INPUT_DIMS=1,3,H,W, with the tools environment's Python.
OrtRun run_ort(const std::string& model, const std::string& in_file, const std::string& out_file, int64_t height,
               int64_t width) {
  std::ostringstream cmd;
  cmd << "YOLO8_INPUT_DIMS=1,3," << height << "," << width << " '" << YOLO8_TOOLS_PYTHON << "' '" << YOLO8_ORT_RUNNER
      << "' '" << model << "' '" << in_file << "' '" << out_file << "' 2>&1";
  OrtRun run;
  FILE* pipe = popen(cmd.str().c_str(), "r");
  if (pipe == nullptr) {
    run.log = "popen failed: " + cmd.str();
    return run;
  }
  char buf[512];
  while (fgets(buf, sizeof(buf), pipe)) run.log += buf;
  run.status = pclose(pipe);
  std::istringstream lines(run.log);
  for (std::string line; std::getline(lines, line);) {
    if (!line.empty() && line.front() == '{') run.json = line;
  }
  run.log = cmd.str() + "\n" + run.log;
  return run;
}

void write_floats(const std::string& path, const torch::Tensor& t) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(static_cast<const char*>(t.data_ptr()), static_cast<std::streamsize>(t.numel() * sizeof(float)));
}

TEST_P(OnnxRuntimes, OnnxRuntimeMatchesLibTorch) {
  if (const std::string missing = ort_missing(); !missing.empty()) GTEST_SKIP() << missing;
  torch::Tensor input, reference;
  const std::string path = export_case(GetParam(), input, reference);
  const std::string in_file = out_path("ort_" + case_name(GetParam()) + ".in.bin");
  const std::string out_file = out_path("ort_" + case_name(GetParam()) + ".out.bin");
  write_floats(in_file, input);
  std::filesystem::remove(out_file);
  const OrtRun run = run_ort(path, in_file, out_file, GetParam().height, GetParam().width);
  ASSERT_EQ(run.status, 0) << run.log;
  ASSERT_FALSE(run.json.empty()) << run.log;
  EXPECT_NE(run.json.find("\"opset\": " + std::to_string(GetParam().opset) + ","), std::string::npos) << run.json;

  std::ifstream out(out_file, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(out)), std::istreambuf_iterator<char>());
  ASSERT_EQ(bytes.size(), static_cast<size_t>(reference.numel()) * sizeof(float)) << run.log;
  const torch::Tensor got = torch::from_blob(bytes.data(), reference.sizes(), torch::kFloat).clone();
  const double rel = test::max_relative_diff(got, reference);
  std::cout << "[ONNX Runtime " << run.json << ", " << case_name(GetParam()) << "] max relative diff " << rel << "\n";
  EXPECT_LE(rel, kRelTol);
}

// The checker step of ort_run.py is no formality: a file onnx rejects fails before ONNX Runtime sees it.
class OrtRunner : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const std::string missing = ort_missing(); !missing.empty()) GTEST_SKIP() << missing;
    torch::Tensor reference;
    // Files of this test alone: ctest runs the OrtRunner tests side by side, and one of them found the output file
    // another had just written.
    const std::string test = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    exported_ = export_case(kCase, input_, reference, "_" + test);
    in_file_ = out_path("ort_" + test + ".in.bin");
    out_file_ = out_path("ort_" + test + ".out.bin");
    write_floats(in_file_, input_);
    std::filesystem::remove(out_file_);
  }

  OrtRun run(const std::string& model) { return run_ort(model, in_file_, out_file_, kCase.height, kCase.width); }

  static constexpr Case kCase{128, 128, 12};
  std::string exported_, in_file_, out_file_;
  torch::Tensor input_;
};

TEST_F(OrtRunner, CheckerRejectsANodeReadingAnUndefinedTensor) {
  onnx::ModelProto model;
  {
    std::ifstream in(exported_, std::ios::binary);
    ASSERT_TRUE(model.ParseFromIstream(&in)) << exported_;
  }
  ASSERT_GT(model.graph().node_size(), 0);
  ASSERT_GT(model.graph().node(0).input_size(), 0);
  // The first node reads a tensor nothing produces: no graph input, initializer or earlier node's output.
  model.mutable_graph()->mutable_node(0)->set_input(0, "undefined_tensor");
  const std::string broken = out_path("ort_undefined_input.onnx");
  {
    std::ofstream out(broken, std::ios::binary | std::ios::trunc);
    ASSERT_TRUE(model.SerializeToOstream(&out));
  }
  const OrtRun result = run(broken);
  EXPECT_NE(result.status, 0) << result.log;
  EXPECT_NE(result.log.find("onnx checker rejected"), std::string::npos) << result.log;
  EXPECT_NE(result.log.find("input 'undefined_tensor' of node"), std::string::npos) << result.log;
  EXPECT_TRUE(result.json.empty()) << result.log;
  EXPECT_FALSE(std::filesystem::exists(out_file_));
}

TEST_F(OrtRunner, ATruncatedFileFails) {
  std::ifstream in(exported_, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string truncated = out_path("ort_truncated.onnx");
  std::ofstream(truncated, std::ios::binary | std::ios::trunc) << bytes.substr(0, bytes.size() / 2);
  const OrtRun result = run(truncated);
  EXPECT_NE(result.status, 0) << result.log;
  EXPECT_TRUE(result.log.find("onnx cannot read") != std::string::npos ||
              result.log.find("onnx checker rejected") != std::string::npos)
      << result.log;
  EXPECT_TRUE(result.json.empty()) << result.log;
  EXPECT_FALSE(std::filesystem::exists(out_file_));
}

TEST_F(OrtRunner, TheExportedFileRuns) {
  // The control for the two above: the same file, unbroken, passes the checker and runs.
  const OrtRun result = run(exported_);
  EXPECT_EQ(result.status, 0) << result.log;
  EXPECT_FALSE(result.json.empty()) << result.log;
  EXPECT_TRUE(std::filesystem::exists(out_file_));
}

INSTANTIATE_TEST_SUITE_P(Sizes, OnnxRuntimes,
                         ::testing::Values(Case{160, 160, 12}, Case{128, 192, 12}, Case{128, 192, 13}),
                         [](const ::testing::TestParamInfo<Case>& param) { return case_name(param.param); });

}  // namespace
}  // namespace yolo8
