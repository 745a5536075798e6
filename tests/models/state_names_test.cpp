// Parameter/buffer names and shapes are exactly Ultralytics' state-dict keys.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "golden_util.h"
#include "models/weights.h"

namespace yolo8 {
namespace {

TEST(StateNames, MatchUltralyticsKeysInOrder) {
  const auto sd = test::dict_get(test::load_case("yolov8n-shapes.state_dict.pt"), "state_dict").toGenericDict();
  auto model = build_model(std::string(test::kSourceDir) + "/configs/models/yolov8n.yaml", 4);
  const auto own = state_dict(*model);
  ASSERT_EQ(own.size(), sd.size());
  size_t i = 0;
  for (const auto& kv : sd) {
    const auto& [name, t] = own[i++];
    EXPECT_EQ(name, kv.key().toStringRef());
    EXPECT_EQ(t.sizes(), kv.value().toTensor().sizes()) << name;
  }
  EXPECT_EQ(own.front().first, "model.0.conv.weight");
  EXPECT_EQ(own.back().first, "model.22.dfl.conv.weight");
}

TEST(StateNames, DflIsFixedRamp) {
  auto model = build_model("yolov8n.yaml", 80);
  const auto w = model->detect()->dfl->conv->weight;
  EXPECT_FALSE(w.requires_grad());
  EXPECT_TRUE(torch::equal(w.view({-1}), torch::arange(16, torch::kFloat)));
}

TEST(StateNames, BatchNormSettingsAndBiasInit) {
  auto model = build_model("yolov8s.yaml", 3);
  const auto strides = model->strides();
  ASSERT_EQ(strides.numel(), 3);
  EXPECT_FLOAT_EQ(strides[0].item<float>(), 8.f);
  EXPECT_FLOAT_EQ(strides[1].item<float>(), 16.f);
  EXPECT_FLOAT_EQ(strides[2].item<float>(), 32.f);
  for (const auto& [name, t] : state_dict(*model)) {
    if (name.find("cv2.") != std::string::npos && name.rfind(".2.bias") == name.size() - 7 &&
        name.rfind("model.22.", 0) == 0) {
      EXPECT_TRUE(torch::allclose(t, torch::ones_like(t))) << name;
    }
  }
  for (int i = 0; i < 3; ++i) {
    const double s = 8.0 * (1 << i);
    const auto bias = model->detect()->cv3[i]->as<torch::nn::Sequential>()->ptr<torch::nn::Conv2dImpl>(2)->bias;
    EXPECT_NEAR(bias[0].item<double>(), std::log(5.0 / 3.0 / std::pow(640.0 / s, 2)), 1e-6);
  }
  int bn_count = 0;
  for (const auto& m : model->modules()) {
    if (auto bn = std::dynamic_pointer_cast<torch::nn::BatchNorm2dImpl>(m)) {
      ++bn_count;
      EXPECT_DOUBLE_EQ(bn->options.eps(), 1e-3);
      EXPECT_DOUBLE_EQ(bn->options.momentum().value(), 0.03);
    }
  }
  EXPECT_GT(bn_count, 50);
  // A fresh Ultralytics model has seen one all-zero batch at momentum 0.1 during its stride probe.
  auto ends_with = [](const std::string& s, const std::string& tail) {
    return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
  };
  for (const auto& [name, t] : state_dict(*model)) {
    if (ends_with(name, "running_var")) {
      EXPECT_TRUE(torch::allclose(t, torch::full_like(t, 0.9))) << name;
    } else if (ends_with(name, "running_mean")) {
      EXPECT_EQ(t.abs().max().item<float>(), 0.f) << name;
    } else if (ends_with(name, "num_batches_tracked")) {
      EXPECT_EQ(t.item<int64_t>(), 1) << name;
    }
  }
}

}  // namespace
}  // namespace yolo8
