#include <gtest/gtest.h>

#include "tests/trainer/fixture_io.h"
#include "trainer/detect/nms.h"

namespace yolo8 {
namespace {

using test::as_double;
using test::as_list;
using test::as_tensors;
using test::at;

TEST(NmsGolden, EverySettingMatchesReference) {
  auto root = test::load_fixture("nms_cases.pt");
  auto prediction = at(root, "prediction").toTensor();
  auto settings = as_list(at(root, "settings"));
  ASSERT_EQ(settings.size(), 3u);
  for (size_t s = 0; s < settings.size(); ++s) {
    const auto& st = settings[s];
    NmsConfig cfg;
    cfg.conf_thres = as_double(at(st, "conf"));
    cfg.iou_thres = as_double(at(st, "iou"));
    cfg.max_det = at(st, "max_det").toInt();
    cfg.multi_label = at(st, "multi_label").toBool();
    SCOPED_TRACE("setting " + std::to_string(s) + " conf " + std::to_string(cfg.conf_thres));
    auto want = as_tensors(at(st, "output"));
    auto got = non_max_suppression(prediction.clone(), cfg);
    ASSERT_EQ(got.size(), want.size());
    for (size_t b = 0; b < want.size(); ++b) {
      SCOPED_TRACE("image " + std::to_string(b));
      ASSERT_EQ(got[b].sizes(), want[b].sizes());
      ASSERT_GT(want[b].size(0), 0);
      // Same boxes in the same order: coordinates and classes exactly, scores to 1e-6.
      EXPECT_TRUE(torch::equal(got[b].narrow(1, 0, 4), want[b].narrow(1, 0, 4)));
      EXPECT_TRUE(torch::equal(got[b].select(1, 5), want[b].select(1, 5)));
      EXPECT_LE((got[b].select(1, 4) - want[b].select(1, 4)).abs().max().item<double>(), 1e-6);
    }
  }
}

}  // namespace
}  // namespace yolo8
