// TorchScript export: torch::jit::load reads the traced module back and its forward equals the LibTorch model's.
#include "trainer/export/torchscript_export.h"

#include <gtest/gtest.h>
#include <torch/script.h>

#include <filesystem>

#include "onnx_test_util.h"

namespace yolo8 {
namespace {

TEST(TorchScriptExport, LoadsBackWithTheSameOutput) {
  LoadedModel loaded = test::fixture_model();
  const auto dir = std::filesystem::path(test::kBinaryDir) / "test-output" / "export";
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "model.torchscript").string();
  export_torchscript(loaded.model, 128, 192, path);
  EXPECT_FALSE(loaded.model->is_fused());

  torch::jit::Module module = torch::jit::load(path);
  torch::manual_seed(3);
  const torch::Tensor input = torch::rand({1, 3, 128, 192});
  torch::NoGradGuard no_grad;
  const torch::Tensor got = module.forward({input}).toTensor();
  const torch::Tensor want = test::libtorch_reference(loaded.model, input);
  ASSERT_EQ(got.sizes(), want.sizes());
  const double rel = test::max_relative_diff(got, want);
  std::cout << "[torch::jit::load] max relative diff " << rel << "\n";
  EXPECT_LE(rel, 1e-5);
}

TEST(TorchScriptExport, RefusesSizesOffTheStride) {
  LoadedModel loaded = test::fixture_model();
  EXPECT_THROW(export_torchscript(loaded.model, 100, 128, "/dev/null"), std::invalid_argument);
}

}  // namespace
}  // namespace yolo8
