#include <gtest/gtest.h>

#include "tests/trainer/fixture_io.h"
#include "trainer/detect/metrics.h"

namespace yolo8 {
namespace {

using test::as_double;
using test::as_list;
using test::at;

TEST(MetricsGolden, EveryNumberMatchesReference) {
  auto root = test::load_fixture("metrics_case.pt");
  const auto nc = at(root, "nc").toInt();
  auto iouv = at(root, "iouv").toTensor();
  ASSERT_TRUE(torch::equal(iouv, default_iou_thresholds()));
  DetectionMetrics metrics(nc);
  auto images = as_list(at(root, "images"));
  ASSERT_EQ(images.size(), 40u);
  for (const auto& im : images) metrics.update(at(im, "detections").toTensor(), at(im, "labels").toTensor());
  auto res = metrics.compute();

  const double tol = 1e-6;
  EXPECT_NEAR(res.precision, as_double(at(root, "precision")), tol);
  EXPECT_NEAR(res.recall, as_double(at(root, "recall")), tol);
  EXPECT_NEAR(res.map50, as_double(at(root, "map50")), tol);
  EXPECT_NEAR(res.map50_95, as_double(at(root, "map50_95")), tol);
  EXPECT_NEAR(res.fitness, as_double(at(root, "fitness")), tol);

  auto want_ap = at(root, "ap_per_class").toTensor().to(torch::kDouble);
  auto want_idx = at(root, "ap_class_index").toTensor();
  ASSERT_EQ(res.per_class.ap.sizes(), want_ap.sizes());
  EXPECT_LE((res.per_class.ap - want_ap).abs().max().item<double>(), tol);
  EXPECT_TRUE(torch::equal(res.per_class.classes, want_idx.to(torch::kLong)));
  // The fixture must exercise something: non-trivial AP at several thresholds.
  EXPECT_GT(res.map50, res.map50_95);
  EXPECT_GT(res.map50_95, 0.0);
}

}  // namespace
}  // namespace yolo8
