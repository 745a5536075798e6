// YAML resolution, scales, nc override, user YAMLs (P2 head), output shapes and clear config errors.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <fstream>

#include "models/model_info.h"
#include "models/yolo.h"
#include "test_paths.h"

namespace yolo8 {
namespace {

std::string write_tmp(const std::string& name, const std::string& text) {
  const std::string path = std::string(test::kBinaryDir) + "/" + name;
  std::ofstream(path) << text;
  return path;
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

TEST(ModelYaml, ScaleFromNameAndResolution) {
  EXPECT_EQ(guess_model_scale("yolov8m.yaml"), "m");
  EXPECT_EQ(guess_model_scale("some/dir/yolov8x-p2.yaml"), "x");
  EXPECT_EQ(guess_model_scale("custom.yaml"), "");
  const auto cfg = load_model_config("yolov8m.yaml");
  EXPECT_EQ(cfg.scale, "m");
  EXPECT_DOUBLE_EQ(cfg.depth, 0.67);
  EXPECT_DOUBLE_EQ(cfg.width, 0.75);
  EXPECT_EQ(cfg.max_channels, 768);
  EXPECT_EQ(cfg.nc, 80);
  EXPECT_EQ(cfg.layers.size(), 23u);
  EXPECT_NE(resolve_model_yaml("yolov8s-p2.yaml").find("yolov8-p2.yaml"), std::string::npos);
  EXPECT_EQ(load_model_config("yolov8").scale, "n");  // no letter: the first scale, like Ultralytics
}

TEST(ModelYaml, NcOverrideShapesHead) {
  auto model = build_model("yolov8n.yaml", 7);
  EXPECT_EQ(model->nc(), 7);
  EXPECT_EQ(model->config().yaml["nc"].as<int>(), 7);
  model->eval();
  torch::NoGradGuard no_grad;
  const auto out = model->forward(torch::rand({2, 3, 64, 96}));
  // A = 8·12 + 4·6 + 2·3
  EXPECT_EQ(out.pred.sizes(), (std::vector<int64_t>{2, 4 + 7, 96 + 24 + 6}));
  ASSERT_EQ(out.feats.size(), 3u);
  EXPECT_EQ(out.feats[0].sizes(), (std::vector<int64_t>{2, 64 + 7, 8, 12}));
  EXPECT_EQ(out.feats[2].sizes(), (std::vector<int64_t>{2, 64 + 7, 2, 3}));
  const auto scores = out.pred.slice(1, 4);
  EXPECT_TRUE(((scores >= 0) & (scores <= 1)).all().item<bool>());
  model->train();
  const auto train_out = model->forward(torch::rand({2, 3, 64, 96}));
  EXPECT_FALSE(train_out.pred.defined());
  EXPECT_EQ(train_out.feats[1].sizes(), (std::vector<int64_t>{2, 71, 4, 6}));
}

TEST(ModelYaml, P2HeadBuilds) {
  auto model = build_model("yolov8s-p2.yaml", 5);
  EXPECT_EQ(model->detect()->nl(), 4);
  const auto s = model->strides();
  EXPECT_TRUE(torch::equal(s, torch::tensor({4.f, 8.f, 16.f, 32.f})));
  model->eval();
  torch::NoGradGuard no_grad;
  const auto out = model->forward(torch::rand({1, 3, 64, 64}));
  EXPECT_EQ(out.pred.sizes(), (std::vector<int64_t>{1, 9, 256 + 64 + 16 + 4}));
  const auto info = model_info(model, 640);
  EXPECT_GT(info.gflops, 28.6);  // more than plain yolov8s
  EXPECT_EQ(info.rows.size(), 29u);
  const std::string table = format_model_info(info, "yolov8s-p2");
  EXPECT_NE(table.find("  28 "), std::string::npos) << table;
  EXPECT_NE(table.find("yolov8s-p2 summary:"), std::string::npos) << table;
}

TEST(ModelYaml, DecodedBoxesAreAnchorCentred) {
  // With zero box logits the DFL expectation is 7.5 bins on every side: a box of 15 strides
  // centred on the anchor; anchors sit at cell centres.
  auto model = build_model("yolov8n.yaml", 2);
  torch::NoGradGuard no_grad;
  for (int i = 0; i < 3; ++i) {
    auto seq = model->detect()->cv2[i]->as<torch::nn::Sequential>();
    seq->ptr<torch::nn::Conv2dImpl>(2)->weight.zero_();
    seq->ptr<torch::nn::Conv2dImpl>(2)->bias.zero_();
  }
  model->eval();
  const auto pred = model->predict(torch::rand({1, 3, 64, 64}));
  // First anchor of level 0: cell (0, 0), stride 8 -> centre (4, 4), size 15·8.
  EXPECT_NEAR(pred[0][0][0].item<double>(), 4.0, 1e-4);
  EXPECT_NEAR(pred[0][1][0].item<double>(), 4.0, 1e-4);
  EXPECT_NEAR(pred[0][2][0].item<double>(), 120.0, 1e-3);
  EXPECT_NEAR(pred[0][3][0].item<double>(), 120.0, 1e-3);
  // Second anchor of level 0 is one cell to the right.
  EXPECT_NEAR(pred[0][0][1].item<double>(), 12.0, 1e-4);
  // Last anchor: level 2 (stride 32), cell (1, 1) -> centre (48, 48).
  EXPECT_NEAR(pred[0][0][63 + 15 + 3 + 1 - 1].item<double>(), 48.0, 1e-4);
}

TEST(ModelYaml, ErrorsNameFileAndLine) {
  const std::string bad_module = write_tmp("bad_module.yaml",
                                           "nc: 3\nbackbone:\n  - [-1, 1, Conv, [16, 3, 2]]\n  - [-1, 1, Foo, [32]]\n"
                                           "head:\n  - [[0, 1], 1, Detect, [nc]]\n");
  std::string msg = error_of([&] { build_model(bad_module); });
  EXPECT_NE(msg.find("bad_module.yaml:4"), std::string::npos) << msg;
  EXPECT_NE(msg.find("Foo"), std::string::npos) << msg;

  const std::string bad_from = write_tmp("bad_from.yaml",
                                         "nc: 3\nbackbone:\n  - [-1, 1, Conv, [16, 3, 2]]\n"
                                         "head:\n  - [[0, 5], 1, Detect, [nc]]\n");
  msg = error_of([&] { build_model(bad_from); });
  EXPECT_NE(msg.find("bad_from.yaml:5"), std::string::npos) << msg;

  const std::string bad_scale =
      write_tmp("yolov8q.yaml",
                "nc: 3\nscales:\n  n: [0.33, 0.25, 1024]\n"
                "backbone:\n  - [-1, 1, Conv, [16, 3, 2]]\nhead:\n  - [[0], 1, Detect, [nc]]\n");
  EXPECT_NO_THROW(build_model(bad_scale));
  msg = error_of([&] { build_model(YAML::LoadFile(bad_scale), bad_scale, "m"); });
  EXPECT_NE(msg.find("scale 'm'"), std::string::npos) << msg;

  const std::string bad_arg = write_tmp("bad_arg.yaml",
                                        "nc: 3\nbackbone:\n  - [-1, 1, Conv, [sixteen, 3, 2]]\n"
                                        "head:\n  - [[0], 1, Detect, [nc]]\n");
  msg = error_of([&] { build_model(bad_arg); });
  EXPECT_NE(msg.find("bad_arg.yaml:3"), std::string::npos) << msg;

  msg = error_of([&] { build_model("does_not_exist_v9.yaml"); });
  EXPECT_NE(msg.find("does_not_exist_v9.yaml"), std::string::npos) << msg;

  const std::string not_map = write_tmp("not_map.yaml", "- 1\n- 2\n");
  msg = error_of([&] { build_model(not_map); });
  EXPECT_NE(msg.find("not_map.yaml"), std::string::npos) << msg;
}

TEST(ModelYaml, RepeatedPlainLayersNestLikeSequential) {
  const std::string path = write_tmp("repeat.yaml",
                                     "nc: 2\nbackbone:\n  - [-1, 1, Conv, [16, 3, 2]]\n"
                                     "  - [-1, 2, Conv, [16, 3, 1]]\n  - [-1, 1, Conv, [32, 3, 2]]\n"
                                     "head:\n  - [[1, 2], 1, Detect, [nc]]\n");
  auto model = build_model(path);
  bool found = false;
  for (const auto& p : model->named_parameters()) found |= p.key() == "model.1.1.conv.weight";
  EXPECT_TRUE(found);
  EXPECT_TRUE(torch::equal(model->strides(), torch::tensor({2.f, 4.f})));
}

}  // namespace
}  // namespace yolo8
