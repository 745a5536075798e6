#include <gtest/gtest.h>

#include "trainer/detect/nms.h"

namespace yolo8 {
namespace {

// One image, nc classes: rows of (cx, cy, w, h, scores...) -> (1, 4 + nc, A).
torch::Tensor make_pred(const std::vector<std::vector<float>>& rows) {
  std::vector<torch::Tensor> cols;
  for (const auto& r : rows) cols.push_back(torch::tensor(r));
  return torch::stack(cols, 1).unsqueeze(0);
}

TEST(Nms, SuppressesOverlapsOfSameClassOnly) {
  auto pred = make_pred({{50, 50, 20, 20, 0.9f, 0.0f},
                         {52, 50, 20, 20, 0.8f, 0.0f},    // overlaps the first, same class -> dropped
                         {52, 50, 20, 20, 0.0f, 0.7f},    // same place, other class -> kept
                         {150, 150, 20, 20, 0.6f, 0.0f},  // far away -> kept
                         {10, 10, 5, 5, 0.1f, 0.0f}});    // below conf
  NmsConfig cfg;
  auto out = non_max_suppression(pred, cfg);
  ASSERT_EQ(out.size(), 1u);
  ASSERT_EQ(out[0].size(0), 3);
  EXPECT_FLOAT_EQ(out[0][0][4].item<float>(), 0.9f);
  EXPECT_FLOAT_EQ(out[0][1][4].item<float>(), 0.7f);
  EXPECT_EQ(out[0][1][5].item<float>(), 1.0f);
  EXPECT_FLOAT_EQ(out[0][2][4].item<float>(), 0.6f);
  EXPECT_TRUE(torch::allclose(out[0][0].narrow(0, 0, 4), torch::tensor({40.f, 40.f, 60.f, 60.f})));

  cfg.agnostic = true;  // now the class-1 box overlaps the top box too
  EXPECT_EQ(non_max_suppression(pred, cfg)[0].size(0), 2);
  cfg.agnostic = false;
  cfg.max_det = 2;
  EXPECT_EQ(non_max_suppression(pred, cfg)[0].size(0), 2);
  cfg.max_det = 300;
  cfg.iou_thres = 0.95;  // IoU of the two class-0 boxes is ~0.82
  EXPECT_EQ(non_max_suppression(pred, cfg)[0].size(0), 4);
}

TEST(Nms, MultiLabelEmitsOneRowPerClassAboveThreshold) {
  auto pred = make_pred({{50, 50, 20, 20, 0.9f, 0.5f}, {150, 150, 20, 20, 0.1f, 0.3f}});
  NmsConfig cfg;
  cfg.multi_label = true;
  auto out = non_max_suppression(pred, cfg)[0];
  ASSERT_EQ(out.size(0), 3);
  EXPECT_FLOAT_EQ(out[0][4].item<float>(), 0.9f);
  EXPECT_FLOAT_EQ(out[1][4].item<float>(), 0.5f);
  EXPECT_EQ(out[1][5].item<float>(), 1.0f);
  EXPECT_FLOAT_EQ(out[2][4].item<float>(), 0.3f);
}

TEST(Nms, MaxNmsKeepsTopScoresAndTiesKeepInputOrder) {
  // Identical boxes and scores: the earliest survives, as torchvision's stable sort does.
  auto pred = make_pred({{50, 50, 20, 20, 0.5f}, {50, 50, 20, 20, 0.5f}, {50, 50, 20, 20, 0.4f}});
  auto boxes = torch::tensor({{0.f, 0.f, 10.f, 10.f}, {0.f, 0.f, 10.f, 10.f}, {20.f, 20.f, 30.f, 30.f}});
  auto keep = nms_boxes(boxes, torch::tensor({0.5f, 0.5f, 0.5f}), 0.5);
  ASSERT_EQ(keep.size(0), 2);
  EXPECT_EQ(keep[0].item<int64_t>(), 0);
  EXPECT_EQ(keep[1].item<int64_t>(), 2);
  NmsConfig cfg;
  cfg.max_nms = 1;
  auto out = non_max_suppression(pred, cfg)[0];
  ASSERT_EQ(out.size(0), 1);
}

TEST(Nms, ManyBoxesMatchPlainGreedy) {
  torch::manual_seed(3);
  const int64_t n = 1500;
  auto xy = torch::rand({n, 2}) * 300;
  auto wh = torch::rand({n, 2}) * 60 + 5;
  auto boxes = torch::cat({xy, xy + wh}, 1);
  auto scores = torch::rand({n});
  auto keep = nms_boxes(boxes, scores, 0.5);
  // Reference: plain O(n^2) greedy over the stable score order.
  auto order = std::get<1>(torch::sort(scores, true, 0, true));
  std::vector<bool> dead(n, false);
  std::vector<int64_t> want;
  auto b = boxes.accessor<float, 2>();
  auto o = order.accessor<int64_t, 1>();
  for (int64_t ii = 0; ii < n; ++ii) {
    const auto i = o[ii];
    if (dead[ii]) continue;
    want.push_back(i);
    const float ai = (b[i][2] - b[i][0]) * (b[i][3] - b[i][1]);
    for (int64_t jj = ii + 1; jj < n; ++jj) {
      const auto j = o[jj];
      const float w = std::max(0.f, std::min(b[i][2], b[j][2]) - std::max(b[i][0], b[j][0]));
      const float h = std::max(0.f, std::min(b[i][3], b[j][3]) - std::max(b[i][1], b[j][1]));
      const float inter = w * h;
      const float aj = (b[j][2] - b[j][0]) * (b[j][3] - b[j][1]);
      if (inter / (ai + aj - inter) > 0.5) dead[jj] = true;
    }
  }
  ASSERT_EQ(keep.size(0), static_cast<int64_t>(want.size()));
  EXPECT_TRUE(torch::equal(keep, torch::tensor(want)));
  // Capped: the first max_keep of the full result.
  EXPECT_TRUE(torch::equal(nms_boxes(boxes, scores, 0.5, 7), keep.narrow(0, 0, 7)));
}

TEST(Nms, EmptyAndBadInput) {
  auto pred = torch::zeros({2, 6, 10});
  auto out = non_max_suppression(pred, {});
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0].sizes(), (torch::IntArrayRef{0, 6}));
  EXPECT_THROW(non_max_suppression(torch::zeros({6, 10}), {}), std::invalid_argument);
  NmsConfig bad;
  bad.iou_thres = 1.5;
  EXPECT_THROW(non_max_suppression(pred, bad), std::invalid_argument);
}

}  // namespace
}  // namespace yolo8
