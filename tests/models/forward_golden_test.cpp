// Parity with Ultralytics: the reference weights reproduce forward_case.pt (eval output, train maps).
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "golden_util.h"
#include "models/weights.h"

namespace yolo8 {
namespace {

constexpr double kTol = 1e-4;

void check_forward_case(LoadedModel loaded, const std::string& label) {
  const auto fc = test::load_case("forward_case.pt");
  const torch::Tensor input = test::dict_get(fc, "input").toTensor().to(torch::kFloat);
  const torch::Tensor expected = test::dict_get(fc, "eval_output").toTensor().to(torch::kFloat);
  const auto expected_feats = test::tensor_list(test::dict_get(fc, "train_feats"));
  ASSERT_EQ(loaded.nc, 4);
  auto& model = loaded.model;
  torch::NoGradGuard no_grad;

  model->eval();
  const DetectOutput out = model->forward(input);
  ASSERT_TRUE(out.pred.defined());
  ASSERT_EQ(out.pred.sizes(), expected.sizes());
  const double eval_diff = test::max_abs_diff(out.pred, expected);
  std::cout << "[" << label << "] eval output max abs diff: " << eval_diff << "\n";
  EXPECT_LE(eval_diff, kTol);

  model->train();  // BatchNorm on batch statistics, as the reference's train-mode pass
  const auto feats = model->forward_maps(input);
  ASSERT_EQ(feats.size(), expected_feats.size());
  for (size_t i = 0; i < feats.size(); ++i) {
    ASSERT_EQ(feats[i].sizes(), expected_feats[i].sizes());
    const double d = test::max_abs_diff(feats[i], expected_feats[i]);
    std::cout << "[" << label << "] train map " << i << " max abs diff: " << d << "\n";
    EXPECT_LE(d, kTol) << "level " << i;
  }
}

TEST(ForwardGolden, StateDictFileMatchesReference) {
  check_forward_case(load_model(test::fixture("yolov8n-shapes.state_dict.pt")), "state_dict");
}

TEST(ForwardGolden, UltralyticsCheckpointMatchesReference) {
  check_forward_case(load_model(test::fixture("yolov8n-shapes.pt")), "ultralytics .pt");
}

// The comparison itself must notice a small drift in one weight (the raw maps are the sensitive part:
// this toy model's decoded boxes barely move).
TEST(ForwardGolden, DetectsNumericDrift) {
  auto loaded = load_model(test::fixture("yolov8n-shapes.state_dict.pt"));
  const auto fc = test::load_case("forward_case.pt");
  const torch::Tensor input = test::dict_get(fc, "input").toTensor();
  const auto expected = test::tensor_list(test::dict_get(fc, "train_feats"));
  torch::NoGradGuard no_grad;
  for (auto& [name, t] : state_dict(*loaded.model)) {
    if (name == "model.0.conv.weight") t.add_(1e-3);
  }
  loaded.model->train();
  const auto feats = loaded.model->forward_maps(input);
  const double d = test::max_abs_diff(feats[0], expected[0]);
  std::cout << "perturbed train map 0 max abs diff: " << d << "\n";
  EXPECT_GT(d, kTol);
}

TEST(ForwardGolden, CheckpointWeightsEqualStateDictWeights) {
  const auto ck = read_ultralytics_checkpoint(test::fixture("yolov8n-shapes.pt"));
  const auto sd = test::load_case("yolov8n-shapes.state_dict.pt");
  const auto ref = test::dict_get(sd, "state_dict").toGenericDict();
  EXPECT_EQ(ck.weights.size(), ref.size());
  EXPECT_EQ(ck.model_class, "DetectionModel");
  EXPECT_EQ(ck.nc, 4);
  EXPECT_EQ(ck.names, (std::vector<std::string>{"circle", "rectangle", "triangle", "scratch"}));
  for (const auto& kv : ref) {
    const std::string name = kv.key().toStringRef();
    auto it = ck.weights.find(name);
    ASSERT_NE(it, ck.weights.end()) << name;
    const torch::Tensor r = kv.value().toTensor();
    ASSERT_EQ(it->second.sizes(), r.sizes()) << name;
    EXPECT_TRUE(torch::equal(it->second, r.is_floating_point() ? r.to(torch::kFloat) : r)) << name;
  }
}

}  // namespace
}  // namespace yolo8
