#include "trainer/assigner.h"

#include <stdexcept>
#include <string>

#include "trainer/box_ops.h"

namespace yolo8 {

TaskAlignedAssigner::TaskAlignedAssigner(int64_t num_classes, AssignerConfig config)
    : num_classes_(num_classes), config_(config) {
  if (num_classes_ < 1) throw std::invalid_argument("TaskAlignedAssigner: nc must be >= 1");
  if (config_.topk < 1) throw std::invalid_argument("TaskAlignedAssigner: topk must be >= 1");
}

torch::Tensor select_candidates_in_gts(const torch::Tensor& anchor_points, const torch::Tensor& gt_bboxes, double eps) {
  const auto bs = gt_bboxes.size(0);
  const auto n_boxes = gt_bboxes.size(1);
  const auto n_anchors = anchor_points.size(0);
  auto lt_rb = gt_bboxes.view({-1, 1, 4}).chunk(2, 2);
  auto deltas = torch::cat({anchor_points.unsqueeze(0) - lt_rb[0], lt_rb[1] - anchor_points.unsqueeze(0)}, 2)
                    .view({bs, n_boxes, n_anchors, -1});
  return deltas.amin(3).gt(eps).to(gt_bboxes.scalar_type());
}

Assignment TaskAlignedAssigner::assign(const torch::Tensor& pd_scores, const torch::Tensor& pd_bboxes,
                                       const torch::Tensor& anchor_points, const torch::Tensor& gt_labels,
                                       const torch::Tensor& gt_bboxes, const torch::Tensor& mask_gt) const {
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
  auto mask_in_gts = select_candidates_in_gts(anchor_points, gt_bboxes);  // (B, M, A)
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
    auto iou = bbox_iou_xyxy(gt_bboxes.index({ib, im}), pd_bboxes.index({ib, ia}), /*ciou=*/true)
                   .squeeze(-1)
                   .clamp_min(0);
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

}  // namespace yolo8
