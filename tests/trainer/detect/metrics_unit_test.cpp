#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "test_paths.h"
#include "trainer/detect/coco_json.h"
#include "trainer/detect/metrics.h"

namespace yolo8 {
namespace {

TEST(Metrics, InterpFollowsNumpySemantics) {
  auto xp = torch::tensor({0.0, 1.0, 1.0, 2.0}, torch::kDouble);
  auto fp = torch::tensor({0.0, 10.0, 20.0, 30.0}, torch::kDouble);
  auto x = torch::tensor({-1.0, 0.5, 1.0, 1.5, 2.0, 3.0}, torch::kDouble);
  auto y = interp(x, xp, fp, -5.0, 99.0);
  // Duplicated xp: an x equal to it takes the last duplicate's value.
  auto want = torch::tensor({-5.0, 5.0, 20.0, 25.0, 30.0, 99.0}, torch::kDouble);
  EXPECT_TRUE(torch::allclose(y, want)) << y;
}

TEST(Metrics, ComputeApOfPerfectAndHalfCurves) {
  auto perfect = compute_ap(torch::tensor({0.5, 1.0}, torch::kDouble), torch::tensor({1.0, 1.0}, torch::kDouble));
  // The sentinel (recall 1, precision 0) takes the value at x = 1, so the last trapezoid is halved: 0.995,
  // the reference's well-known ceiling.
  EXPECT_NEAR(perfect.item<double>(), 0.995, 1e-12);
  // FP then TP with one label: envelope 0.5 from recall 0 on.
  auto fp_first = compute_ap(torch::tensor({0.0, 1.0}, torch::kDouble), torch::tensor({0.0, 0.5}, torch::kDouble));
  EXPECT_NEAR(fp_first.item<double>(), 0.5 - 0.5 * 0.01 / 2, 1e-12);
}

TEST(Metrics, MatchingIsGreedyByIoUAndFirstDetectionPerLabel) {
  auto iouv = default_iou_thresholds();
  // Two detections on one label: the lower-index detection wins the label even with lower IoU,
  // as the reference's unique-by-label step keeps the first detection.
  auto labels = torch::tensor({{0.f, 0.f, 0.f, 10.f, 10.f}});
  auto dets = torch::tensor({{0.f, 0.f, 10.f, 8.f, 0.5f, 0.f}, {0.f, 0.f, 10.f, 10.f, 0.9f, 0.f}});
  auto c = match_detections(dets, labels, iouv);
  ASSERT_EQ(c.sizes(), (torch::IntArrayRef{2, 10}));
  EXPECT_TRUE(c[0][0].item<bool>());   // IoU 0.8 >= 0.5
  EXPECT_FALSE(c[0][9].item<bool>());  // 0.8 < 0.95
  EXPECT_FALSE(c[1][0].item<bool>());
  EXPECT_TRUE(c[1][9].item<bool>());  // only detection 1 reaches 0.95
  // Wrong class never matches.
  auto wrong = dets.clone();
  wrong.select(1, 5).fill_(1);
  EXPECT_FALSE(match_detections(wrong, labels, iouv).any().item<bool>());
  // Each detection takes its best label.
  auto two_labels = torch::tensor({{0.f, 0.f, 0.f, 10.f, 10.f}, {0.f, 0.f, 0.f, 10.f, 9.f}});
  auto one = torch::tensor({{0.f, 0.f, 10.f, 9.f, 0.9f, 0.f}});
  EXPECT_TRUE(match_detections(one, two_labels, iouv)[0][9].item<bool>());  // matched label 1 exactly
}

TEST(Metrics, PerfectDetectionsScoreOne) {
  DetectionMetrics m(3);
  auto labels = torch::tensor({{0.f, 0.f, 0.f, 10.f, 10.f}, {2.f, 20.f, 20.f, 40.f, 30.f}});
  auto dets = torch::tensor({{0.f, 0.f, 10.f, 10.f, 0.9f, 0.f}, {20.f, 20.f, 40.f, 30.f, 0.8f, 2.f}});
  m.update(dets, labels);
  m.update(torch::zeros({0, 6}), torch::zeros({0, 5}));
  auto r = m.compute();
  EXPECT_EQ(r.images, 2);
  EXPECT_NEAR(r.map50, 0.995, 1e-9);
  EXPECT_NEAR(r.map50_95, 0.995, 1e-9);
  EXPECT_NEAR(r.precision, 1.0, 1e-6);
  EXPECT_NEAR(r.recall, 1.0, 1e-6);
  EXPECT_NEAR(r.fitness, 0.995, 1e-9);
  EXPECT_EQ(r.class_index, (std::vector<int64_t>{0, 2}));
  auto table = m.format_table({"cat", "dog", "bird"});
  std::istringstream lines(table);
  std::string header, all, first, second;
  std::getline(lines, header);
  std::getline(lines, all);
  std::getline(lines, first);
  std::getline(lines, second);
  char want_header[128];
  std::snprintf(want_header, sizeof(want_header), "%22s%11s%11s%11s%11s%11s%11s", "Class", "Images", "Instances",
                "Box(P", "R", "mAP50", "mAP50-95)");
  EXPECT_EQ(header, want_header);
  EXPECT_EQ(all, "                   all          2          2          1          1      0.995      0.995");
  EXPECT_NE(first.find("cat"), std::string::npos);
  EXPECT_NE(second.find("bird"), std::string::npos);
  EXPECT_EQ(r.per_class.p_curve.sizes(), (torch::IntArrayRef{2, 1000}));
}

TEST(Metrics, NoCorrectDetectionGivesZeros) {
  DetectionMetrics m(2);
  m.update(torch::tensor({{50.f, 50.f, 60.f, 60.f, 0.9f, 0.f}}), torch::tensor({{0.f, 0.f, 0.f, 10.f, 10.f}}));
  auto r = m.compute();
  EXPECT_EQ(r.map50, 0.0);
  EXPECT_EQ(r.fitness, 0.0);
  EXPECT_EQ(r.instances_per_class[0].item<int64_t>(), 1);
  EXPECT_THROW(m.update(torch::zeros({1, 5}), torch::zeros({0, 5})), std::invalid_argument);
  EXPECT_THROW(m.update(torch::zeros({0, 6}), torch::tensor({{7.f, 0.f, 0.f, 1.f, 1.f}})), std::invalid_argument);
}

TEST(Metrics, SmoothKeepsConstantsAndAveragesSteps) {
  auto flat = torch::full({1000}, 0.25, torch::kDouble);
  EXPECT_TRUE(torch::allclose(smooth_curve(flat, 0.1), flat));
  auto step = torch::zeros({1000}, torch::kDouble);
  step.slice(0, 500).fill_(1.0);
  auto s = smooth_curve(step, 0.1);
  EXPECT_NEAR(s[500].item<double>(), 51.0 / 101.0, 1e-12);  // window 101 centred on the first 1
  EXPECT_EQ(s[0].item<double>(), 0.0);
}

TEST(CocoJson, WritesTopLeftXywhAndCategoryIds) {
  CocoJsonWriter w(coco80_to_coco91());
  w.add(coco_image_id("/data/val/000000000139.jpg"),
        torch::tensor({{10.f, 20.f, 40.f, 60.f, 0.87654321f, 11.f}, {0.f, 0.f, 5.f, 5.f, 0.5f, 0.f}}));
  w.add(coco_image_id("img_a.png"), torch::zeros({0, 6}));
  ASSERT_EQ(w.size(), 2u);
  const auto& r = w.results()[0];
  EXPECT_EQ(r["image_id"], 139);
  EXPECT_EQ(r["category_id"], 13);  // class 11 (stop sign) skips COCO id 12
  EXPECT_EQ(r["bbox"], (nlohmann::json{10.0, 20.0, 30.0, 40.0}));
  EXPECT_DOUBLE_EQ(r["score"].get<double>(), 0.87654);
  EXPECT_EQ(w.results()[1]["category_id"], 1);
  EXPECT_EQ(coco_image_id("a/b/img_a.png"), "img_a");
  EXPECT_EQ(coco80_to_coco91().size(), 80u);
  EXPECT_EQ(coco80_to_coco91().back(), 90);

  const std::string path = std::string(test::kBinaryDir) + "/tests/trainer/coco_predictions_test.json";
  w.write(path);
  std::ifstream in(path);
  auto back = nlohmann::json::parse(in);
  EXPECT_EQ(back, w.results());
  EXPECT_THROW(w.write("/proc/definitely/not/writable.json"), std::runtime_error);
  CocoJsonWriter small({1, 2});
  EXPECT_THROW(small.add(1, torch::tensor({{0.f, 0.f, 1.f, 1.f, 0.5f, 5.f}})), std::invalid_argument);
}

}  // namespace
}  // namespace yolo8
