#include <gtest/gtest.h>

#include "trainer/detect/assigner.h"
#include "trainer/detect/box_ops.h"

namespace yolo8 {
namespace {

// Reference-style candidate test: materialises all four box-anchor distances.
torch::Tensor dense_candidates_in_gts(const torch::Tensor& anchor_points, const torch::Tensor& gt_bboxes) {
  const auto bs = gt_bboxes.size(0);
  const auto n_boxes = gt_bboxes.size(1);
  const auto n_anchors = anchor_points.size(0);
  auto lt_rb = gt_bboxes.view({-1, 1, 4}).chunk(2, 2);
  auto deltas = torch::cat({anchor_points.unsqueeze(0) - lt_rb[0], lt_rb[1] - anchor_points.unsqueeze(0)}, 2)
                    .view({bs, n_boxes, n_anchors, -1});
  return deltas.amin(3).gt(1e-9).to(gt_bboxes.scalar_type());
}

// Oracle: a direct, fully dense transcription of the reference assigner (every step on (B, M, A) tensors).
// The library version is sparse after top-k and must agree exactly.
int g_dense_conflicts = 0;  // how often the oracle resolved anchors claimed by several GTs

Assignment dense_assign(int64_t num_classes_, const AssignerConfig& config_, const torch::Tensor& pd_scores,
                        const torch::Tensor& pd_bboxes, const torch::Tensor& anchor_points,
                        const torch::Tensor& gt_labels, const torch::Tensor& gt_bboxes, const torch::Tensor& mask_gt) {
  torch::NoGradGuard no_grad;
  const auto bs = pd_scores.size(0);
  const auto na = pd_scores.size(1);
  const auto n_max = gt_bboxes.size(1);
  const auto dev = pd_scores.device();

  if (n_max == 0) {
    return {torch::full({bs, na}, num_classes_, torch::TensorOptions().dtype(torch::kLong).device(dev)),
            torch::zeros_like(pd_bboxes), torch::zeros_like(pd_scores),
            torch::zeros({bs, na}, torch::TensorOptions().dtype(torch::kBool).device(dev)),
            torch::zeros({bs, na}, torch::TensorOptions().dtype(torch::kLong).device(dev))};
  }

  // Candidate anchors: centre inside a real GT box.
  auto mask_in_gts = dense_candidates_in_gts(anchor_points, gt_bboxes);  // (B, M, A)
  auto cand = (mask_in_gts * mask_gt).to(torch::kBool);

  // Alignment metric s^alpha * IoU^beta, evaluated only on candidate pairs (sparse: big batches stay cheap).
  auto overlaps = torch::zeros({bs, n_max, na}, pd_bboxes.options());
  auto bbox_scores = torch::zeros({bs, n_max, na}, pd_scores.options());
  auto idx = cand.nonzero();  // (K, 3): b, m, a
  if (idx.size(0) > 0) {
    auto ib = idx.select(1, 0);
    auto im = idx.select(1, 1);
    auto ia = idx.select(1, 2);
    auto labels = gt_labels.squeeze(-1).to(torch::kLong).index({ib, im});
    bbox_scores.index_put_({ib, im, ia}, pd_scores.index({ib, ia, labels}));
    auto iou =
        bbox_iou_xyxy(gt_bboxes.index({ib, im}), pd_bboxes.index({ib, ia}), /*ciou=*/true).squeeze(-1).clamp_min(0);
    overlaps.index_put_({ib, im, ia}, iou);
  }
  auto align_metric = bbox_scores.pow(config_.alpha) * overlaps.pow(config_.beta);

  // Top-k anchors per GT; padding rows point at anchor 0 and are dropped by the duplicate filter.
  const auto k = std::min<int64_t>(config_.topk, na);
  auto topk_idx = std::get<1>(torch::topk(align_metric, k, -1, /*largest=*/true));
  auto topk_mask = mask_gt.expand({-1, -1, k}).to(torch::kBool);
  topk_idx.masked_fill_(~topk_mask, 0);
  auto count = torch::zeros({bs, n_max, na}, align_metric.options());
  count.scatter_add_(-1, topk_idx, torch::ones({bs, n_max, k}, align_metric.options()));
  count.masked_fill_(count > 1, 0);
  auto mask_pos = count * mask_in_gts * mask_gt;

  // One GT per anchor: where several claim it, the GT of highest IoU wins.
  auto fg = mask_pos.sum(-2);
  if (fg.max().item<double>() > 1) {
    ++g_dense_conflicts;
    auto multi = (fg.unsqueeze(1) > 1).expand({-1, n_max, -1});
    auto max_idx = overlaps.argmax(1);
    auto is_max = torch::zeros_like(mask_pos);
    is_max.scatter_(1, max_idx.unsqueeze(1), 1);
    mask_pos = torch::where(multi, is_max, mask_pos);
    fg = mask_pos.sum(-2);
  }
  auto target_gt_idx = mask_pos.argmax(-2);  // (B, A)
  auto fg_mask = fg > 0;

  // Gather the assigned GT of each anchor.
  auto batch_ind = torch::arange(bs, torch::TensorOptions().dtype(torch::kLong).device(dev)).unsqueeze(-1);
  auto flat_idx = target_gt_idx + batch_ind * n_max;
  auto target_labels = gt_labels.to(torch::kLong).flatten().index({flat_idx}).clamp_min(0);
  auto target_bboxes = gt_bboxes.view({-1, 4}).index({flat_idx});
  auto target_scores = torch::zeros({bs, na, num_classes_}, pd_scores.options());
  target_scores.scatter_(2, target_labels.unsqueeze(-1), 1);
  target_scores = target_scores * fg_mask.unsqueeze(-1).to(target_scores.scalar_type());

  // Soft targets: alignment normalised per GT so its best anchor scores the GT's best IoU.
  align_metric = align_metric * mask_pos;
  auto pos_align = align_metric.amax(-1, true);
  auto pos_overlaps = (overlaps * mask_pos).amax(-1, true);
  auto norm = (align_metric * pos_overlaps / (pos_align + config_.eps)).amax(-2).unsqueeze(-1);
  target_scores = target_scores * norm;

  return {target_labels, target_bboxes, target_scores, fg_mask, target_gt_idx};
}

struct Inputs {
  torch::Tensor pd_scores, pd_bboxes, anchors, gt_labels, gt_bboxes, mask_gt;
};

// Crowded scene: many large overlapping GTs so anchors are claimed by several GTs.
Inputs make_inputs(int64_t bs, int64_t m_max, int64_t nc, uint64_t seed) {
  torch::manual_seed(seed);
  auto anc = make_anchors({{16, 20}, {8, 10}, {4, 5}}, {8, 16, 32});
  auto anchors = anc.points * anc.strides;
  const auto na = anchors.size(0);
  Inputs in;
  in.anchors = anchors;
  in.pd_scores = torch::rand({bs, na, nc});
  auto c = anchors.unsqueeze(0).expand({bs, na, 2});
  auto lt = torch::rand({bs, na, 2}) * 40;
  auto rb = torch::rand({bs, na, 2}) * 40;
  in.pd_bboxes = torch::cat({c - lt, c + rb}, -1);
  auto xy = torch::rand({bs, m_max, 2}) * torch::tensor({160.f, 128.f});
  auto wh = torch::rand({bs, m_max, 2}) * 70 + 4;
  in.gt_bboxes = torch::cat({xy - wh / 2, xy + wh / 2}, -1);
  in.gt_labels = torch::randint(0, nc, {bs, m_max, 1}).to(torch::kFloat32);
  // Ragged: image b has m_max - b boxes (at least one image with none when bs > m_max).
  auto counts = (m_max - torch::arange(bs)).clamp_min(0);
  in.mask_gt = (torch::arange(m_max).view({1, m_max}) < counts.view({bs, 1})).unsqueeze(-1).to(torch::kFloat32);
  in.gt_bboxes = in.gt_bboxes * in.mask_gt;
  in.gt_labels = in.gt_labels * in.mask_gt;
  return in;
}

void expect_same(const Assignment& a, const Assignment& b) {
  EXPECT_TRUE(torch::equal(a.fg_mask, b.fg_mask));
  EXPECT_TRUE(torch::equal(a.target_gt_idx, b.target_gt_idx));
  EXPECT_TRUE(torch::equal(a.target_labels, b.target_labels));
  EXPECT_TRUE(torch::equal(a.target_bboxes, b.target_bboxes));
  EXPECT_TRUE(torch::equal(a.target_scores, b.target_scores));
}

TEST(Assigner, SparseMatchesDenseTranscription) {
  g_dense_conflicts = 0;
  for (uint64_t seed : {1, 2, 3}) {
    for (auto cfg : {AssignerConfig{}, AssignerConfig{13, 1.0, 6.0, 1e-9}, AssignerConfig{1, 0.5, 6.0, 1e-9},
                     AssignerConfig{10, 0.0, 0.0, 1e-9}}) {
      SCOPED_TRACE("seed " + std::to_string(seed) + " topk " + std::to_string(cfg.topk) + " alpha " +
                   std::to_string(cfg.alpha));
      auto in = make_inputs(4, 12, 5, seed);
      TaskAlignedAssigner assigner(5, cfg);
      auto got = assigner.assign(in.pd_scores, in.pd_bboxes, in.anchors, in.gt_labels, in.gt_bboxes, in.mask_gt);
      auto got_grid = assigner.assign(in.pd_scores, in.pd_bboxes, in.anchors, in.gt_labels, in.gt_bboxes, in.mask_gt,
                                      {{16, 20}, {8, 10}, {4, 5}});
      auto want = dense_assign(5, cfg, in.pd_scores, in.pd_bboxes, in.anchors, in.gt_labels, in.gt_bboxes, in.mask_gt);
      EXPECT_GT(got.fg_mask.sum().item<int64_t>(), 0);
      expect_same(got, want);
      expect_same(got_grid, want);
    }
  }
  EXPECT_GE(g_dense_conflicts, 6);  // the crowded scenes must exercise conflict resolution
}

TEST(Assigner, GridCandidateTestEqualsGeneric) {
  auto in = make_inputs(3, 9, 2, 7);
  // Boxes on exact anchor coordinates exercise the strict '> eps' edges.
  in.gt_bboxes.index_put_({0, 0}, torch::tensor({4.f, 4.f, 20.f, 36.f}));
  auto generic = select_candidates_in_gts(in.anchors, in.gt_bboxes);
  auto grid = select_candidates_in_gts_grid(in.anchors, in.gt_bboxes, {{16, 20}, {8, 10}, {4, 5}});
  EXPECT_TRUE(torch::equal(generic, grid));
  EXPECT_GT(generic.sum().item<int64_t>(), 0);
  EXPECT_TRUE(torch::equal(generic.to(torch::kFloat32), dense_candidates_in_gts(in.anchors, in.gt_bboxes)));
  EXPECT_THROW(select_candidates_in_gts_grid(in.anchors, in.gt_bboxes, {{16, 20}}), std::invalid_argument);
}

TEST(Assigner, ConflictsResolveToHighestOverlap) {
  // Two identical GTs of different classes: every shared anchor goes to the first (argmax takes the first max).
  auto anc = make_anchors({{4, 4}}, {8});
  auto anchors = anc.points * anc.strides;
  const auto na = anchors.size(0);
  auto pd_scores = torch::full({1, na, 2}, 0.5f);
  auto c = anchors.unsqueeze(0);
  auto pd_bboxes = torch::cat({c - 6, c + 6}, -1);
  auto gt = torch::tensor({{{2.f, 2.f, 30.f, 30.f}, {2.f, 2.f, 30.f, 30.f}}});
  auto labels = torch::tensor({{{0.f}, {1.f}}});
  auto mask = torch::ones({1, 2, 1});
  TaskAlignedAssigner assigner(2, {});
  auto r = assigner.assign(pd_scores, pd_bboxes, anchors, labels, gt, mask);
  EXPECT_EQ(r.fg_mask.sum().item<int64_t>(), 10);
  EXPECT_EQ(r.target_gt_idx.max().item<int64_t>(), 0);
  EXPECT_EQ(r.target_scores.select(2, 1).abs().sum().item<double>(), 0.0);
  // Normalised: the best anchor's target equals the GT's best IoU.
  EXPECT_LE(r.target_scores.max().item<double>(), 1.0);
  EXPECT_GT(r.target_scores.max().item<double>(), 0.1);
}

}  // namespace
}  // namespace yolo8
