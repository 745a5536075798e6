// Detect's output precision under CPU bfloat16 autocast: float32 in eval mode, as it was in training mode.
#include "models/detect.h"

#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <torch/version.h>

namespace yolo8 {
namespace {

#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
// CPU bfloat16 autocast for a scope, as trainer/core/autocast.h turns it on.
struct CpuBfloat16Autocast {
  CpuBfloat16Autocast() {
    at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
    at::autocast::set_autocast_enabled(at::kCPU, true);
  }
  ~CpuBfloat16Autocast() {
    at::autocast::set_autocast_enabled(at::kCPU, false);
    at::autocast::clear_cache();
  }
};

// The head's maps from bfloat16 features, against float32's on the same features: with its output convolutions in
// float32 the maps are float32 and within the features' own rounding; training keeps autocast's bfloat16 maps.
TEST(Detect, EvalMapsStayFloat32UnderCpuBfloat16Autocast) {
  torch::manual_seed(3);
  Detect detect(3, std::vector<int64_t>{16, 32, 64});
  detect->stride = torch::tensor({8.0, 16.0, 32.0});
  detect->bias_init();
  std::vector<torch::Tensor> feats;
  for (const auto& [c, s] : std::vector<std::pair<int64_t, int64_t>>{{16, 20}, {32, 10}, {64, 5}}) {
    feats.push_back(torch::randn({2, c, s, s}).to(torch::kBFloat16).to(torch::kFloat));
  }
  torch::NoGradGuard no_grad;
  detect->eval();
  const std::vector<torch::Tensor> exact = detect->forward_maps(feats);
  std::vector<torch::Tensor> eval_maps, train_maps;
  {
    CpuBfloat16Autocast autocast;
    eval_maps = detect->forward_maps(feats);
    detect->train();
    train_maps = detect->forward_maps(feats);
    detect->eval();
  }
  ASSERT_EQ(eval_maps.size(), exact.size());
  for (size_t i = 0; i < exact.size(); ++i) {
    EXPECT_EQ(eval_maps[i].scalar_type(), torch::kFloat);
    EXPECT_EQ(train_maps[i].scalar_type(), torch::kBFloat16);
    // The two Conv blocks round their outputs to bfloat16 (8 significant bits); the last convolution adds none.
    const double scale = exact[i].abs().max().item<double>();
    EXPECT_LE((eval_maps[i] - exact[i]).abs().max().item<double>(), 0.03 * scale) << "level " << i;
    EXPECT_FALSE(torch::equal(eval_maps[i], exact[i])) << "level " << i << ": autocast did not run";
  }
}
#else
TEST(Detect, EvalMapsStayFloat32UnderCpuBfloat16Autocast) { GTEST_SKIP() << "CPU autocast needs LibTorch 2.4+"; }
#endif

}  // namespace
}  // namespace yolo8
