// Conv+BN fusion keeps the output (1e-4) and removes every BatchNorm.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "golden_util.h"
#include "models/model_info.h"
#include "models/weights.h"

namespace yolo8 {
namespace {

TEST(Fusion, ReferenceWeightsSameOutput) {
  auto loaded = load_model(test::fixture("yolov8n-shapes.state_dict.pt"));
  const auto fc = test::load_case("forward_case.pt");
  const torch::Tensor input = test::dict_get(fc, "input").toTensor();
  torch::NoGradGuard no_grad;
  loaded.model->eval();
  const auto before = loaded.model->forward(input);
  loaded.model->fuse();
  EXPECT_TRUE(loaded.model->is_fused());
  const auto after = loaded.model->forward(input);
  const double d = test::max_abs_diff(before.pred, after.pred);
  std::cout << "fused vs unfused eval max abs diff: " << d << "\n";
  EXPECT_LE(d, 1e-4);
  for (size_t i = 0; i < before.feats.size(); ++i) {
    const double di = test::max_abs_diff(before.feats[i], after.feats[i]);
    std::cout << "fused vs unfused map " << i << " max abs diff: " << di << "\n";
    EXPECT_LE(di, 1e-4);
  }
  EXPECT_LE(test::max_abs_diff(after.pred, test::dict_get(fc, "eval_output").toTensor()), 1e-4);
  for (const auto& [name, t] : state_dict(*loaded.model)) EXPECT_EQ(name.find(".bn."), std::string::npos) << name;
  const auto info = model_info(loaded.model);
  EXPECT_EQ(info.layers, 225 - 57);  // Ultralytics: 168 layers after fusing yolov8n
}

TEST(Fusion, RandomStatisticsSameOutput) {
  torch::manual_seed(3);
  auto model = build_model("yolov8n.yaml", 80);
  torch::NoGradGuard no_grad;
  for (const auto& m : model->modules()) {
    if (auto bn = std::dynamic_pointer_cast<torch::nn::BatchNorm2dImpl>(m)) {
      bn->weight.uniform_(0.5, 1.5);
      bn->bias.uniform_(-0.2, 0.2);
      bn->running_mean.uniform_(-0.2, 0.2);
      bn->running_var.uniform_(0.5, 2.0);
    }
  }
  model->eval();
  const auto x = torch::rand({2, 3, 96, 128});
  const auto before = model->forward(x);
  model->fuse();
  const auto after = model->forward(x);
  for (size_t i = 0; i < before.feats.size(); ++i) EXPECT_LE(test::max_abs_diff(before.feats[i], after.feats[i]), 1e-4);
  EXPECT_LE(test::max_abs_diff(before.pred, after.pred), 1e-4);
}

}  // namespace
}  // namespace yolo8
