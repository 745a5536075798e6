#include "trainer/detect/assigner.h"

#include <stdexcept>
#include <string>

#include "trainer/detect/box_ops.h"

namespace yolo8 {

TaskAlignedAssigner::TaskAlignedAssigner(int64_t num_classes, AssignerConfig config)
    : num_classes_(num_classes), config_(config) {
  if (num_classes_ < 1) throw std::invalid_argument("TaskAlignedAssigner: nc must be >= 1");
  if (config_.topk < 1) throw std::invalid_argument("TaskAlignedAssigner: topk must be >= 1");
}

torch::Tensor select_candidates_in_gts(const torch::Tensor& anchor_points, const torch::Tensor& gt_bboxes, double eps) {
  // Four (B, M, A) comparisons instead of one (B, M, A, 4) distance tensor; same float values.
  auto ax = anchor_points.select(1, 0).view({1, 1, -1});
  auto ay = anchor_points.select(1, 1).view({1, 1, -1});
  auto c = gt_bboxes.unsqueeze(-1).unbind(2);  // x1, y1, x2, y2 as (B, M, 1)
  auto inside = torch::gt(ax - c[0], eps);
  inside.logical_and_(torch::gt(ay - c[1], eps));
  inside.logical_and_(torch::gt(c[2] - ax, eps));
  inside.logical_and_(torch::gt(c[3] - ay, eps));
  return inside;
}

torch::Tensor select_candidates_in_gts_grid(const torch::Tensor& anchor_points, const torch::Tensor& gt_bboxes,
                                            const std::vector<std::pair<int64_t, int64_t>>& level_hw, double eps) {
  const auto bs = gt_bboxes.size(0);
  const auto nb = gt_bboxes.size(1);
  auto c = gt_bboxes.unsqueeze(-1).unbind(2);  // (B, M, 1) each
  int64_t total = 0;
  for (const auto& hw : level_hw) total += hw.first * hw.second;
  if (total != anchor_points.size(0)) {
    throw std::invalid_argument("select_candidates_in_gts_grid: level sizes sum to " + std::to_string(total) +
                                " but there are " + std::to_string(anchor_points.size(0)) + " anchors");
  }
  auto out = torch::empty({bs, nb, total}, gt_bboxes.options().dtype(torch::kBool));
  int64_t offset = 0;
  for (const auto& [h, w] : level_hw) {
    // Column x values from the first row, row y values from the first column: the very same floats.
    auto xs = anchor_points.narrow(0, offset, w).select(1, 0).view({1, 1, w});
    auto ys = anchor_points.narrow(0, offset, h * w).select(1, 1).slice(0, 0, h * w, w).view({1, 1, h});
    auto in_x = torch::gt(xs - c[0], eps).logical_and_(torch::gt(c[2] - xs, eps));  // (B, M, w)
    auto in_y = torch::gt(ys - c[1], eps).logical_and_(torch::gt(c[3] - ys, eps));  // (B, M, h)
    auto dst = out.narrow(2, offset, h * w).view({bs, nb, h, w});
    torch::logical_and_out(dst, in_y.unsqueeze(3), in_x.unsqueeze(2));
    offset += h * w;
  }
  return out;
}

namespace {
// Per-key maximum of non-negative values (0 where a key has none), deterministic: sort, take segment heads.
torch::Tensor segment_max(const torch::Tensor& keys, const torch::Tensor& values, int64_t size) {
  auto out = torch::zeros({size}, values.options());
  if (keys.numel() == 0) return out;
  auto by_value = std::get<1>(torch::sort(values, /*stable=*/true, 0, /*descending=*/true));
  auto by_key = std::get<1>(torch::sort(keys.index({by_value}), /*stable=*/true, 0, /*descending=*/false));
  auto order = by_value.index({by_key});
  auto k = keys.index({order});
  auto head = torch::ones_like(k, torch::kBool);
  head.slice(0, 1).copy_(k.slice(0, 1) != k.slice(0, 0, -1));
  out.index_put_({k.index({head})}, values.index({order}).index({head}));
  return out;
}
}  // namespace

Assignment TaskAlignedAssigner::assign(const torch::Tensor& pd_scores, const torch::Tensor& pd_bboxes,
                                       const torch::Tensor& anchor_points, const torch::Tensor& gt_labels,
                                       const torch::Tensor& gt_bboxes, const torch::Tensor& mask_gt,
                                       const std::vector<std::pair<int64_t, int64_t>>& level_hw) const {
  torch::NoGradGuard no_grad;
  const auto bs = pd_scores.size(0);
  const auto na = pd_scores.size(1);
  const auto n_max = gt_bboxes.size(1);
  const auto dev = pd_scores.device();
  const auto long_opts = torch::TensorOptions().dtype(torch::kLong).device(dev);

  if (n_max == 0) {
    return {torch::full({bs, na}, num_classes_, long_opts), torch::zeros_like(pd_bboxes), torch::zeros_like(pd_scores),
            torch::zeros({bs, na}, long_opts.dtype(torch::kBool)), torch::zeros({bs, na}, long_opts)};
  }

  // Candidate pairs: anchor centre inside a real GT box.
  auto real_gt = mask_gt.to(torch::kBool);  // (B, M, 1)
  auto in_gts = level_hw.empty() ? select_candidates_in_gts(anchor_points, gt_bboxes)
                                 : select_candidates_in_gts_grid(anchor_points, gt_bboxes, level_hw);  // (B, M, A)
  auto cand = in_gts.logical_and(real_gt).nonzero();  // (K, 3): b, m, a
  auto cb = cand.select(1, 0);
  auto cm = cand.select(1, 1);
  auto ca = cand.select(1, 2);

  // Alignment metric s^alpha * IoU^beta; off-candidate pairs hold 0^alpha * 0^beta as in the dense form.
  auto overlaps = torch::zeros({bs, n_max, na}, pd_bboxes.options());
  auto zero = torch::zeros({}, pd_scores.options());
  auto off_value = zero.pow(config_.alpha) * zero.pow(config_.beta);
  auto align_metric = torch::full({bs, n_max, na}, off_value.item(), pd_scores.options());
  if (cand.size(0) > 0) {
    auto labels = gt_labels.squeeze(-1).to(torch::kLong).index({cb, cm});
    auto scores = pd_scores.index({cb, ca, labels});
    auto iou =
        bbox_iou_xyxy(gt_bboxes.index({cb, cm}), pd_bboxes.index({cb, ca}), /*ciou=*/true).squeeze(-1).clamp_min(0);
    overlaps.index_put_({cb, cm, ca}, iou);
    align_metric.index_put_({cb, cm, ca}, scores.pow(config_.alpha) * iou.pow(config_.beta));
  }

  // Top-k anchors per real GT, kept only when the anchor lies inside that GT. Top-k indices of one row are
  // distinct, so this equals the reference's duplicate-count filter.
  const auto k = std::min<int64_t>(config_.topk, na);
  auto topk_idx = std::get<1>(torch::topk(align_metric, k, -1, /*largest=*/true));  // (B, M, k)
  auto keep = in_gts.gather(-1, topk_idx).logical_and_(real_gt);
  auto pos = keep.nonzero();  // (P, 3): b, m, slot
  auto pb = pos.select(1, 0);
  auto pm = pos.select(1, 1);
  auto pa = topk_idx.index({pb, pm, pos.select(1, 2)});

  // One GT per anchor: an anchor claimed several times goes to the GT of highest IoU over all GTs.
  auto claims = torch::zeros({bs * na}, long_opts).index_add_(0, pb * na + pa, torch::ones_like(pb));
  auto fg_mask = (claims > 0).view({bs, na});
  auto conflict = claims.index({pb * na + pa}) > 1;
  if (conflict.any().item<bool>()) {
    auto single = conflict.logical_not();
    auto multi = (claims > 1).nonzero().view({-1});
    auto mb = multi.div(na, "floor");
    auto ma = multi.remainder(na);
    auto mm = overlaps.permute({0, 2, 1}).index({mb, ma}).argmax(1);  // (C)
    pb = torch::cat({pb.index({single}), mb});
    pm = torch::cat({pm.index({single}), mm});
    pa = torch::cat({pa.index({single}), ma});
  }
  auto target_gt_idx = torch::zeros({bs, na}, long_opts);
  target_gt_idx.index_put_({pb, pa}, pm);

  // Gather the assigned GT of each anchor (GT 0 of the image for background anchors, as the reference).
  auto batch_ind = torch::arange(bs, long_opts).unsqueeze(-1);
  auto flat_idx = target_gt_idx + batch_ind * n_max;
  auto target_labels = gt_labels.to(torch::kLong).flatten().index({flat_idx}).clamp_min(0);
  auto target_bboxes = gt_bboxes.view({-1, 4}).index({flat_idx});

  // Soft targets: alignment normalised per GT so its best anchor scores the GT's best IoU.
  auto p_align = align_metric.index({pb, pm, pa});
  auto p_iou = overlaps.index({pb, pm, pa});
  auto gt_flat = pb * n_max + pm;
  auto max_align = segment_max(gt_flat, p_align, bs * n_max);
  auto max_iou = segment_max(gt_flat, p_iou, bs * n_max);
  auto norm = p_align * max_iou.index({gt_flat}) / (max_align.index({gt_flat}) + config_.eps);
  auto target_scores = torch::zeros({bs, na, num_classes_}, pd_scores.options());
  target_scores.index_put_({pb, pa, target_labels.index({pb, pa})}, norm);

  return {target_labels, target_bboxes, target_scores, fg_mask, target_gt_idx};
}

}  // namespace yolo8
