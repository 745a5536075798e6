#include "trainer/detect/confusion_matrix.h"

#include <gtest/gtest.h>

#include <vector>

namespace yolo8 {
namespace {

torch::Tensor rows(const std::vector<std::vector<double>>& r, int64_t cols) {
  auto t = torch::zeros({static_cast<int64_t>(r.size()), cols}, torch::kDouble);
  for (size_t i = 0; i < r.size(); ++i)
    for (int64_t j = 0; j < cols; ++j) t[i][j] = r[i][j];
  return t;
}

double at(const ConfusionMatrix& cm, int64_t pred, int64_t truth) { return cm.matrix()[pred][truth].item<double>(); }

double total(const ConfusionMatrix& cm) { return cm.matrix().sum().item<double>(); }

TEST(ConfusionMatrix, ShapeAndConfDefaults) {
  ConfusionMatrix cm(3);
  EXPECT_EQ(cm.matrix().sizes(), (torch::IntArrayRef{4, 4}));
  EXPECT_DOUBLE_EQ(cm.conf(), 0.25);
  EXPECT_DOUBLE_EQ(ConfusionMatrix(3, 0.001).conf(), 0.25);  // validator's conf replaced as the reference does
  EXPECT_DOUBLE_EQ(ConfusionMatrix(3, 0.5).conf(), 0.5);
  EXPECT_THROW(ConfusionMatrix(0), std::invalid_argument);
}

TEST(ConfusionMatrix, CorrectAndConfusedClasses) {
  ConfusionMatrix cm(3);
  auto labels = rows({{0, 0, 0, 10, 10}, {2, 20, 20, 30, 30}}, 5);
  // First detection right, second overlaps the class-2 label but says class 1.
  auto det = rows({{0, 0, 10, 10, 0.9, 0}, {20, 20, 30, 31, 0.8, 1}}, 6);
  cm.update(det, labels);
  EXPECT_EQ(at(cm, 0, 0), 1);
  EXPECT_EQ(at(cm, 1, 2), 1);  // rows predicted, columns true
  EXPECT_EQ(total(cm), 2);
  auto tp = cm.true_positives(), fp = cm.false_positives();
  EXPECT_EQ(tp.size(0), 3);
  EXPECT_EQ(tp[0].item<double>(), 1);
  EXPECT_EQ(tp[2].item<double>(), 0);
  EXPECT_EQ(fp[1].item<double>(), 1);
}

TEST(ConfusionMatrix, LowConfidenceDetectionsAreDroppedAndLabelIsMissed) {
  ConfusionMatrix cm(2);
  cm.update(rows({{0, 0, 10, 10, 0.2, 0}}, 6), rows({{1, 0, 0, 10, 10}}, 5));
  EXPECT_EQ(at(cm, 2, 1), 1);  // background row, true class 1
  EXPECT_EQ(total(cm), 1);
}

TEST(ConfusionMatrix, NoLabelsMakesEveryConfidentDetectionBackground) {
  ConfusionMatrix cm(2);
  cm.update(rows({{0, 0, 10, 10, 0.9, 1}, {5, 5, 9, 9, 0.5, 1}, {1, 1, 2, 2, 0.1, 0}}, 6), torch::zeros({0, 5}));
  EXPECT_EQ(at(cm, 1, 2), 2);
  EXPECT_EQ(total(cm), 2);
  // Undefined tensors are empty.
  cm.update(torch::Tensor(), rows({{0, 0, 0, 4, 4}}, 5));
  EXPECT_EQ(at(cm, 2, 0), 1);
  cm.update(torch::Tensor(), torch::Tensor());
  EXPECT_EQ(total(cm), 3);
}

TEST(ConfusionMatrix, UnmatchedDetectionsCountOnlyWhenTheImageHasAMatch) {
  // The reference skips unmatched detections of an image without any IoU match.
  ConfusionMatrix none(2);
  none.update(rows({{50, 50, 60, 60, 0.9, 0}}, 6), rows({{0, 0, 0, 10, 10}}, 5));
  EXPECT_EQ(at(none, 2, 0), 1);
  EXPECT_EQ(at(none, 0, 2), 0);
  EXPECT_EQ(total(none), 1);

  ConfusionMatrix some(2);
  some.update(rows({{0, 0, 10, 10, 0.9, 0}, {50, 50, 60, 60, 0.9, 1}}, 6), rows({{0, 0, 0, 10, 10}}, 5));
  EXPECT_EQ(at(some, 0, 0), 1);
  EXPECT_EQ(at(some, 1, 2), 1);
  EXPECT_EQ(total(some), 2);
}

TEST(ConfusionMatrix, MatchesAreUniqueByIoU) {
  ConfusionMatrix cm(2);
  // Two detections on one label: the better one matches, the duplicate is a false positive.
  auto labels = rows({{0, 0, 0, 10, 10}, {1, 100, 100, 110, 110}}, 5);
  auto det = rows({{0, 0, 10, 9, 0.6, 0}, {0, 0, 10, 10, 0.5, 1}, {0, 0, 10, 8, 0.9, 0}}, 6);
  cm.update(det, labels);
  EXPECT_EQ(at(cm, 1, 0), 1);  // the exact box (class 1) wins on IoU, not on confidence
  EXPECT_EQ(at(cm, 0, 2), 2);  // both class-0 duplicates
  EXPECT_EQ(at(cm, 2, 1), 1);  // far label missed
  EXPECT_EQ(total(cm), 4);

  // One detection between two labels goes to the label it overlaps most; the other label is missed.
  ConfusionMatrix two(2);
  two.update(rows({{2, 0, 12, 10, 0.9, 1}}, 6), rows({{0, 0, 0, 10, 10}, {1, 3, 0, 13, 10}}, 5));
  EXPECT_EQ(at(two, 1, 1), 1);
  EXPECT_EQ(at(two, 2, 0), 1);
  EXPECT_EQ(total(two), 2);
}

TEST(ConfusionMatrix, IoUThresholdIsStrict) {
  // IoU of [0,10]x[0,10] and [0,10]x[0,5] is exactly 0.5.
  ConfusionMatrix at_thres(1, 0.25, 0.5);
  at_thres.update(rows({{0, 0, 10, 5, 0.9, 0}}, 6), rows({{0, 0, 0, 10, 10}}, 5));
  EXPECT_EQ(at(at_thres, 0, 0), 0);
  EXPECT_EQ(at(at_thres, 1, 0), 1);
  ConfusionMatrix below(1, 0.25, 0.49);
  below.update(rows({{0, 0, 10, 5, 0.9, 0}}, 6), rows({{0, 0, 0, 10, 10}}, 5));
  EXPECT_EQ(at(below, 0, 0), 1);
}

TEST(ConfusionMatrix, AccumulatesAndResets) {
  ConfusionMatrix cm(1);
  for (int i = 0; i < 3; ++i) cm.update(rows({{0, 0, 10, 10, 0.9, 0}}, 6), rows({{0, 0, 0, 10, 10}}, 5));
  EXPECT_EQ(at(cm, 0, 0), 3);
  cm.reset();
  EXPECT_EQ(total(cm), 0);
}

TEST(ConfusionMatrix, RejectsBadInput) {
  ConfusionMatrix cm(2);
  EXPECT_THROW(cm.update(torch::zeros({2, 5}), torch::zeros({0, 5})), std::invalid_argument);
  EXPECT_THROW(cm.update(torch::zeros({0, 6}), torch::zeros({1, 4})), std::invalid_argument);
  EXPECT_THROW(cm.update(rows({{0, 0, 1, 1, 0.9, 5}}, 6), torch::zeros({0, 5})), std::invalid_argument);
  EXPECT_THROW(cm.update(torch::zeros({0, 6}), rows({{-1, 0, 0, 1, 1}}, 5)), std::invalid_argument);
}

}  // namespace
}  // namespace yolo8
