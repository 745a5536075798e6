#include <gtest/gtest.h>

#include <cmath>
#include <functional>

#include "tests/trainer/fixture_io.h"
#include "trainer/detect/box_ops.h"
#include "trainer/detect/loss.h"

namespace yolo8 {
namespace {

using test::as_list;
using test::as_tensors;
using test::at;

struct Case {
  std::vector<torch::Tensor> feats;
  LossTargets targets;
};

Case first_case() {
  auto root = test::load_fixture("loss_cases.pt");
  auto c = as_list(at(root, "cases")).at(0);
  return {as_tensors(at(c, "feats")),
          {at(c, "batch_idx").toTensor(), at(c, "cls").toTensor(), at(c, "bboxes").toTensor()}};
}

LossConfig base_config() {
  LossConfig c;
  c.nc = 4;
  return c;
}

torch::Tensor items_for(const LossConfig& cfg, const Case& c) { return DetectionLoss(cfg)(c.feats, c.targets).items; }

TEST(DetectionLoss, EachGainAndAssignerConstantChangesTheResult) {
  auto c = first_case();
  auto base = items_for(base_config(), c);
  ASSERT_GT(base.min().item<double>(), 0.0);

  auto changed = [&](auto&& edit) {
    auto cfg = base_config();
    edit(cfg);
    return items_for(cfg, c);
  };
  auto box = changed([](LossConfig& k) { k.box = 5.0; });
  EXPECT_NEAR(box[0].item<double>(), base[0].item<double>() * 5.0 / 7.5, 1e-5);
  EXPECT_TRUE(torch::equal(box.slice(0, 1), base.slice(0, 1)));
  auto cls = changed([](LossConfig& k) { k.cls = 1.0; });
  EXPECT_NEAR(cls[1].item<double>(), base[1].item<double>() * 2.0, 1e-5);
  auto dfl = changed([](LossConfig& k) { k.dfl = 3.0; });
  EXPECT_NEAR(dfl[2].item<double>(), base[2].item<double>() * 2.0, 1e-5);

  for (auto edit : std::vector<std::function<void(LossConfig&)>>{[](LossConfig& k) { k.assigner.topk = 5; },
                                                                 [](LossConfig& k) { k.assigner.alpha = 1.0; },
                                                                 [](LossConfig& k) { k.assigner.beta = 2.0; }}) {
    auto other = changed(edit);
    EXPECT_GT((other - base).abs().max().item<double>(), 1e-6);
  }
}

TEST(DetectionLoss, AcceptsChannelsLastMaps) {
  auto c = first_case();
  std::vector<torch::Tensor> cl;
  for (auto& f : c.feats) cl.push_back(f.contiguous(torch::MemoryFormat::ChannelsLast));
  DetectionLoss loss(base_config());
  EXPECT_TRUE(torch::equal(loss(cl, c.targets).items, loss(c.feats, c.targets).items));
}

TEST(DetectionLoss, TotalIsGainedSumTimesBatch) {
  auto c = first_case();
  auto out = DetectionLoss(base_config())(c.feats, c.targets);
  EXPECT_NEAR(out.total.item<double>(), out.items.sum().item<double>() * c.feats[0].size(0), 1e-4);
  EXPECT_FALSE(out.items.requires_grad());
}

TEST(DetectionLoss, EmptyTargetsGiveOnlyClassLoss) {
  auto c = first_case();
  c.targets = {torch::zeros({0}), torch::zeros({0}), torch::zeros({0, 4})};
  std::vector<torch::Tensor> feats;
  for (auto& f : c.feats) feats.push_back(f.clone().requires_grad_(true));
  auto out = DetectionLoss(base_config())(feats, c.targets);
  EXPECT_EQ(out.items[0].item<double>(), 0.0);
  EXPECT_EQ(out.items[2].item<double>(), 0.0);
  EXPECT_GT(out.items[1].item<double>(), 0.0);
  out.total.backward();
  // No box targets: only the class channels receive gradient.
  EXPECT_EQ(feats[0].grad().slice(1, 0, 64).abs().max().item<double>(), 0.0);
  EXPECT_GT(feats[0].grad().slice(1, 64).abs().max().item<double>(), 0.0);
}

TEST(DetectionLoss, TargetOrderWithinBatchDoesNotMatterAcrossImages) {
  auto c = first_case();
  // Images reordered, boxes within each image kept in order: padding must give the same loss.
  auto bi = c.targets.batch_idx.reshape({-1});
  auto order = std::get<1>(torch::sort(bi, true, 0, true));  // stable, descending image index
  LossTargets shuffled{c.targets.batch_idx.index({order}), c.targets.cls.index({order}),
                       c.targets.bboxes.index({order})};
  DetectionLoss loss(base_config());
  auto a = loss(c.feats, c.targets).items;
  auto b = loss(c.feats, shuffled).items;
  EXPECT_TRUE(torch::allclose(a, b, 1e-6, 1e-7));
}

TEST(DetectionLoss, ImageSizeScalesTheTargets) {
  auto c = first_case();
  DetectionLoss loss(base_config());
  auto derived = loss(c.feats, c.targets).items;
  auto same = c.targets;
  same.image_hw = {128, 160};  // what the maps imply
  EXPECT_TRUE(torch::equal(loss(c.feats, same).items, derived));
  auto other = c.targets;
  other.image_hw = {96, 120};
  EXPECT_GT((loss(c.feats, other).items - derived).abs().max().item<double>(), 1e-6);
}

TEST(DetectionLoss, PadTargetsGroupsPerImage) {
  LossTargets t{torch::tensor({1.f, 0.f, 1.f}), torch::tensor({3.f, 2.f, 1.f}),
                torch::tensor({{0.5f, 0.5f, 0.2f, 0.2f}, {0.25f, 0.25f, 0.5f, 0.5f}, {0.1f, 0.1f, 0.1f, 0.1f}})};
  auto out = DetectionLoss::pad_targets(t, 3, torch::tensor({100.f, 50.f, 100.f, 50.f}));
  ASSERT_EQ(out.sizes(), (torch::IntArrayRef{3, 2, 5}));
  EXPECT_TRUE(torch::allclose(out[0][0], torch::tensor({2.f, 0.f, 0.f, 50.f, 25.f})));
  EXPECT_EQ(out[0][1].abs().sum().item<double>(), 0.0);
  EXPECT_TRUE(torch::allclose(out[1][0], torch::tensor({3.f, 40.f, 20.f, 60.f, 30.f})));
  EXPECT_TRUE(torch::allclose(out[1][1], torch::tensor({1.f, 5.f, 2.5f, 15.f, 7.5f})));
  EXPECT_EQ(out[2].abs().sum().item<double>(), 0.0);
}

TEST(DetectionLoss, RejectsBadInput) {
  auto c = first_case();
  DetectionLoss loss(base_config());
  LossTargets bad{torch::tensor({5.f}), torch::tensor({0.f}), torch::tensor({{0.5f, 0.5f, 0.1f, 0.1f}})};
  EXPECT_THROW(loss(c.feats, bad), std::invalid_argument);
  std::vector<torch::Tensor> two(c.feats.begin(), c.feats.begin() + 2);
  EXPECT_THROW(loss(two, c.targets), std::invalid_argument);
  auto sized = c.targets;
  sized.image_hw = {-1, 160};
  EXPECT_THROW(loss(c.feats, sized), std::invalid_argument);
  auto cfg = base_config();
  cfg.nc = 5;  // channel count no longer matches the maps
  DetectionLoss wrong_nc(cfg);
  EXPECT_THROW(wrong_nc(c.feats, c.targets), std::invalid_argument);
  cfg = base_config();
  cfg.reg_max = 1;
  EXPECT_THROW(DetectionLoss{cfg}, std::invalid_argument);
}

TEST(DetectionLoss, DflClampsTargetsBelowTheLastBin) {
  // Distances of 20 and 15 exceed the last bin (15): both become 14.99, weights 0.01 (bin 14) and 0.99 (bin 15).
  auto logits = torch::zeros({1, 64});
  for (int side = 0; side < 4; ++side) logits[0][side * 16 + 15] = 2.0;
  auto target = torch::tensor({{20.f, 15.f, 14.99f, 100.f}});
  auto got = distribution_focal_loss(logits, target, 16).item<double>();
  const double lse = std::log(15.0 + std::exp(2.0));
  const double want = 0.01 * lse + 0.99 * (lse - 2.0);
  EXPECT_NEAR(got, want, 1e-5);
  // An interior target splits between its two neighbouring bins.
  auto mid = distribution_focal_loss(torch::zeros({1, 64}), torch::full({1, 4}, 3.25f), 16).item<double>();
  EXPECT_NEAR(mid, std::log(16.0), 1e-5);
}

TEST(BoxOps, ConversionsRoundTripAndIoU) {
  auto xywh = torch::tensor({{10.f, 20.f, 4.f, 6.f}});
  auto xyxy = xywh_to_xyxy(xywh);
  EXPECT_TRUE(torch::allclose(xyxy, torch::tensor({{8.f, 17.f, 12.f, 23.f}})));
  EXPECT_TRUE(torch::allclose(xyxy_to_xywh(xyxy), xywh));
  auto a = torch::tensor({{0.f, 0.f, 2.f, 2.f}});
  auto b = torch::tensor({{1.f, 0.f, 3.f, 2.f}, {5.f, 5.f, 6.f, 6.f}});
  auto m = box_iou_matrix(a, b);
  EXPECT_NEAR(m[0][0].item<double>(), 2.0 / 6.0, 1e-6);
  EXPECT_NEAR(m[0][1].item<double>(), 0.0, 1e-9);
  EXPECT_NEAR(bbox_iou_xyxy(a, a, true).item<double>(), 1.0, 1e-5);
  // Same IoU, centre offset: CIoU is lower than IoU by rho^2/c^2 (equal aspect ratios).
  auto ciou = bbox_iou_xyxy(a, b.slice(0, 0, 1), true).item<double>();
  EXPECT_NEAR(ciou, 2.0 / 6.0 - 1.0 / 13.0, 1e-5);  // enclosing 3x2: c^2 = 13, rho^2 = 1
}

TEST(BoxOps, AnchorsAndDistances) {
  auto anc = make_anchors({{2, 3}, {1, 1}}, {8.0, 16.0});
  ASSERT_EQ(anc.points.size(0), 7);
  EXPECT_TRUE(torch::allclose(anc.points[0], torch::tensor({0.5f, 0.5f})));
  EXPECT_TRUE(torch::allclose(anc.points[3], torch::tensor({0.5f, 1.5f})));
  EXPECT_EQ(anc.strides[6].item<double>(), 16.0);
  auto pts = torch::tensor({{5.f, 5.f}});
  auto box = torch::tensor({{3.f, 4.f, 40.f, 6.f}});
  auto d = bbox_to_dist(pts, box, 14.99);
  EXPECT_TRUE(torch::allclose(d, torch::tensor({{2.f, 1.f, 14.99f, 1.f}})));
  EXPECT_TRUE(
      torch::allclose(dist_to_bbox(torch::tensor({{2.f, 1.f, 3.f, 1.f}}), pts), torch::tensor({{3.f, 4.f, 8.f, 6.f}})));
}

}  // namespace
}  // namespace yolo8
