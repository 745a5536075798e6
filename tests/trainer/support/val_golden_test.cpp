// `yolo8 val` against Ultralytics 8.0.232 on real files (tests/fixtures/val_case, see its README row), stage by
// stage, so that a departure shows where it starts: decoded pixels, each batch's input tensor and geometry,
// per-image predictions, then the metrics.
//
// The reference ran `DetectionValidator(args)` without `rect`, so its batches are square 160×160 letterboxes in
// file order (the case's `settings` entry says rect, the recorded tensors say otherwise): `yolo8 val rect=false`.
#include <unistd.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "../fixture_io.h"
#include "data/dataset.h"
#include "data/image_io.h"
#include "data/loader.h"
#include "trainer/cli/settings.h"
#include "trainer/core/autocast.h"
#include "trainer/detect/box_ops.h"
#include "trainer/detect/validator.h"
#include "trainer/support/mode_support.h"
#include "trainer/support/model_loading.h"

namespace yolo8 {
namespace {
namespace fs = std::filesystem;
using test::as_double;
using test::as_list;
using test::at;

const fs::path kCaseDir = fs::path(test::kFixturesDir) / "val_case";

class ValGolden : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { golden_ = new c10::IValue(test::load_fixture("val_case/val_case.pt")); }
  static void TearDownTestSuite() {
    delete golden_;
    golden_ = nullptr;
  }

  void SetUp() override {
    // The dataset is copied: the index may write its cache next to the labels.
    data_dir_ = fs::temp_directory_path() / ("yolo8-val-golden-" + std::to_string(::getpid()));
    fs::remove_all(data_dir_);
    fs::create_directories(data_dir_);
    for (const char* item : {"data.yaml", "images", "labels"}) {
      fs::copy(kCaseDir / item, data_dir_ / item, fs::copy_options::recursive);
    }
    settings_ = resolve_settings({{"model", (kCaseDir / "yolov8n-val-case.pt").string()},
                                  {"data", (data_dir_ / "data.yaml").string()},
                                  {"imgsz", "160"},
                                  {"batch", "16"},
                                  {"rect", "false"},
                                  {"verbose", "false"}},
                                 "val");
  }
  void TearDown() override { fs::remove_all(data_dir_); }

  std::unique_ptr<data::DataLoader> make_loader(DetectionModel& model) {
    const data::DatasetSpec spec = data::load_data_yaml(settings_.data);
    const auto index = app::load_split(spec, "val", settings_, false);
    return std::make_unique<data::DataLoader>(index,
                                              app::loader_config(settings_, 16, static_cast<int>(model->max_stride()),
                                                                 app::LoaderRole::kValidation, torch::kCPU),
                                              settings_.augment, false);
  }

  static DetectionModel load_model() {
    DetectionModel model = load_any_model((kCaseDir / "yolov8n-val-case.pt").string(), 4).model;
    model->eval();
    return model;
  }

  static c10::IValue* golden_;
  fs::path data_dir_;
  Settings settings_;
};
c10::IValue* ValGolden::golden_ = nullptr;

TEST_F(ValGolden, DecodedPixelsEqualImread) {
  const torch::Tensor expected = at(*golden_, "decoded_first_image").toTensor();
  const std::string file = at(*golden_, "first_image").toStringRef();
  const cv::Mat ours = data::read_image((kCaseDir / "images" / "val" / file).string());
  ASSERT_EQ(ours.rows, expected.size(0));
  ASSERT_EQ(ours.cols, expected.size(1));
  ASSERT_EQ(ours.channels(), 3);
  const torch::Tensor ours_tensor = torch::from_blob(ours.data, {ours.rows, ours.cols, 3}, torch::kUInt8);
  EXPECT_TRUE(torch::equal(ours_tensor, expected))
      << "max abs difference " << (ours_tensor.to(torch::kInt) - expected.to(torch::kInt)).abs().max().item<int>();
}

TEST_F(ValGolden, EveryBatchInputMatches) {
  DetectionModel model = load_model();
  auto loader = make_loader(model);
  const auto batches = as_list(at(*golden_, "batches"));
  ASSERT_EQ(loader->num_batches(), static_cast<int64_t>(batches.size()));
  loader->start_epoch(0);
  double worst = 0;
  for (const auto& expected : batches) {
    auto batch = loader->next();
    ASSERT_TRUE(batch.has_value());
    const torch::Tensor expected_img = at(expected, "img").toTensor();
    ASSERT_EQ(batch->images.sizes(), expected_img.sizes()) << "batch " << batch->index;
    const auto files = as_list(at(expected, "im_file"));
    const auto ratio_pads = as_list(at(expected, "ratio_pad"));
    const auto shapes = as_list(at(expected, "ori_shape"));
    for (size_t i = 0; i < files.size(); ++i) {
      const int64_t k = static_cast<int64_t>(i);
      EXPECT_EQ(fs::path(batch->paths[i]).filename().string(), files[i].toStringRef());
      const auto shape = as_list(shapes[i]);
      EXPECT_EQ(batch->orig_shapes[i].first, shape[0].toInt());
      EXPECT_EQ(batch->orig_shapes[i].second, shape[1].toInt());
      const auto ratio = as_list(as_list(ratio_pads[i])[0]);
      const auto pad = as_list(as_list(ratio_pads[i])[1]);
      EXPECT_NEAR(batch->ratio_pad[k][0].item<double>(), as_double(ratio[0]), 1e-12) << files[i].toStringRef();
      EXPECT_NEAR(batch->ratio_pad[k][1].item<double>(), as_double(ratio[1]), 1e-12) << files[i].toStringRef();
      EXPECT_EQ(batch->ratio_pad[k][2].item<double>(), as_double(pad[0])) << files[i].toStringRef();
      EXPECT_EQ(batch->ratio_pad[k][3].item<double>(), as_double(pad[1])) << files[i].toStringRef();
    }
    const torch::Tensor ours = batch->images.to(torch::kFloat).div(255.0);
    const double difference = (ours - expected_img).abs().max().item<double>();
    worst = std::max(worst, difference);
    EXPECT_LE(difference, 1.0 / 255 + 1e-6) << "batch " << batch->index;
  }
  EXPECT_FALSE(loader->next().has_value());
  std::cout << "largest input difference: " << worst * 255 << "/255\n";
}

// Reference detections matched one to one: same class, IoU >= 0.99, confidence within 1e-4.
struct MatchCount {
  int64_t reference = 0, ours = 0, matched = 0;
};

MatchCount match_detections(const torch::Tensor& ours, const torch::Tensor& expected) {
  MatchCount count{expected.size(0), ours.size(0), 0};
  if (ours.size(0) == 0 || expected.size(0) == 0) return count;
  const torch::Tensor iou = box_iou_matrix(expected.slice(1, 0, 4), ours.slice(1, 0, 4));
  std::vector<bool> taken(static_cast<size_t>(ours.size(0)), false);
  for (int64_t r = 0; r < expected.size(0); ++r) {
    for (int64_t o = 0; o < ours.size(0); ++o) {
      if (taken[static_cast<size_t>(o)]) continue;
      const bool same_class = ours[o][5].item<double>() == expected[r][5].item<double>();
      const bool same_conf = std::abs(ours[o][4].item<double>() - expected[r][4].item<double>()) <= 1e-4;
      if (same_class && same_conf && iou[r][o].item<double>() >= 0.99) {
        taken[static_cast<size_t>(o)] = true;
        ++count.matched;
        break;
      }
    }
  }
  return count;
}

TEST_F(ValGolden, PredictionsAndMetricsMatch) {
  DetectionModel model = load_model();
  auto loader = make_loader(model);
  std::map<std::string, torch::Tensor> expected_native;
  for (const auto& image : as_list(at(*golden_, "images"))) {
    expected_native[at(image, "im_file").toStringRef()] = at(image, "pred_native").toTensor().to(torch::kFloat);
  }
  ValConfig config;
  config.conf = 0.001;
  config.iou = 0.7;
  config.max_det = 300;
  DetectionValidator validator(4, {"circle", "rectangle", "triangle", "scratch"}, config);

  // Per-image detections straight from the validator `yolo8 val` uses; the metrics below come from its own loop.
  torch::NoGradGuard no_grad;
  loader->start_epoch(0);
  MatchCount total;
  while (auto batch = loader->next()) {
    const torch::Tensor images = batch->images.to(torch::kFloat).div_(255.0);
    const DetectOutput output = model->forward(images);
    const std::vector<torch::Tensor> detections = validator.add_batch(
        output.pred, batch->labels, images.size(2), images.size(3), app::batch_geometry(*batch), batch->paths);
    for (size_t i = 0; i < detections.size(); ++i) {
      const std::string file = fs::path(batch->paths[i]).filename().string();
      ASSERT_TRUE(expected_native.count(file)) << file;
      const MatchCount image = match_detections(detections[i], expected_native[file]);
      total.reference += image.reference;
      total.ours += image.ours;
      total.matched += image.matched;
    }
  }
  std::cout << "detections: reference " << total.reference << ", ours " << total.ours << ", matched " << total.matched
            << "\n";
  ASSERT_GT(total.reference, 0);
  EXPECT_GE(static_cast<double>(total.matched), 0.99 * static_cast<double>(total.reference));
  EXPECT_EQ(total.ours, total.matched) << "detections the reference does not have";

  // The metrics through the loop `yolo8 val` runs (app::run_validation), not this test's, with the model as it
  // loads weights: BN folded into the convolutions (the detections above are the unfused model's, as a training
  // run's validation sees it).
  prepare_for_inference(model, torch::kCPU);
  DetectionValidator val_mode_validator(4, {"circle", "rectangle", "triangle", "scratch"}, config);
  auto val_loader = make_loader(model);
  app::run_validation(model, *val_loader, val_mode_validator, nullptr, torch::kCPU, false, false, "val");
  const DetectionResults results = val_mode_validator.results();
  std::cout << "P " << results.precision << " R " << results.recall << " mAP50 " << results.map50 << " mAP50-95 "
            << results.map50_95 << "\n";
  // To 1e-6, per class and threshold too: the labels follow the reference's letterbox offset (LetterboxInfo), the
  // metrics its formulas (MetricsParity.*); 1e-3 hid an odd padding's 0.5 px label shift (mAP50-95 +8.5e-5).
  EXPECT_NEAR(results.precision, as_double(at(*golden_, "precision")), 1e-6);
  EXPECT_NEAR(results.recall, as_double(at(*golden_, "recall")), 1e-6);
  EXPECT_NEAR(results.map50, as_double(at(*golden_, "map50")), 1e-6);
  EXPECT_NEAR(results.map50_95, as_double(at(*golden_, "map50_95")), 1e-6);
  const torch::Tensor expected_ap = at(*golden_, "ap_per_class").toTensor().to(torch::kDouble);
  ASSERT_TRUE(results.per_class.ap.defined());
  ASSERT_EQ(results.per_class.ap.sizes(), expected_ap.sizes());
  EXPECT_LE((results.per_class.ap - expected_ap).abs().max().item<double>(), 1e-6);
  EXPECT_TRUE(torch::equal(results.per_class.classes, at(*golden_, "ap_class_index").toTensor().to(torch::kLong)));
}

// A training run's per-epoch validation on a CPU with native bfloat16 runs under autocast, as its forward does
// (float16 on CUDA, as the reference validates during training), Detect's output convolutions in float32. Its
// metrics stay within 0.005 of the float32 reference's; the final validation of best.pt is float32.
TEST_F(ValGolden, Bfloat16ValidationStaysNearFloat32) {
  if (!autocast_applies(true, torch::kCPU)) GTEST_SKIP() << "no native bfloat16 on this CPU (float32 validation)";
  DetectionModel model = load_model();
  ValConfig config;
  config.conf = 0.001;
  config.iou = 0.7;
  config.max_det = 300;
  DetectionValidator validator(4, {"circle", "rectangle", "triangle", "scratch"}, config);
  auto loader = make_loader(model);
  app::run_validation(model, *loader, validator, nullptr, torch::kCPU, false, true, "val");
  const DetectionResults results = validator.results();
  std::cout << "bfloat16: P " << results.precision << " R " << results.recall << " mAP50 " << results.map50
            << " mAP50-95 " << results.map50_95 << "\n";
  EXPECT_NEAR(results.map50, as_double(at(*golden_, "map50")), 0.005);
  EXPECT_NEAR(results.map50_95, as_double(at(*golden_, "map50_95")), 0.005);
  // It did run in bfloat16: float32 reproduces the reference to 1e-6 (PredictionsAndMetricsMatch).
  EXPECT_GT(std::abs(results.map50_95 - as_double(at(*golden_, "map50_95"))), 1e-6);
}

}  // namespace
}  // namespace yolo8
