#include "trainer/detect/loss.h"

#include <stdexcept>
#include <string>

#include "trainer/detect/box_ops.h"

namespace yolo8 {

LossTargets LossTargets::from_label_rows(const torch::Tensor& labels) {
  const torch::Tensor rows = labels.to(torch::kFloat).reshape({-1, 6});
  return LossTargets{rows.select(1, 0), rows.select(1, 1), rows.slice(1, 2, 6)};
}

void LossConfig::validate() const {
  auto fail = [](const std::string& key, const std::string& why) {
    throw std::invalid_argument("loss config: '" + key + "' " + why);
  };
  if (nc < 1) fail("nc", "must be >= 1, got " + std::to_string(nc));
  if (reg_max < 2) fail("reg_max", "must be >= 2, got " + std::to_string(reg_max));
  if (strides.empty()) fail("strides", "must not be empty");
  for (double s : strides) {
    if (!(s > 0)) fail("strides", "must be positive");
  }
  if (box < 0) fail("box", "gain must be >= 0");
  if (cls < 0) fail("cls", "gain must be >= 0");
  if (dfl < 0) fail("dfl", "gain must be >= 0");
  if (assigner.topk < 1) fail("topk", "must be >= 1");
  if (assigner.alpha < 0) fail("alpha", "must be >= 0");
  if (assigner.beta < 0) fail("beta", "must be >= 0");
}

namespace {
LossConfig validated(LossConfig c) {
  c.validate();
  return c;
}
}  // namespace

DetectionLoss::DetectionLoss(LossConfig config)
    : config_(validated(std::move(config))), assigner_(config_.nc, config_.assigner) {}

torch::Tensor dfl_decode(const torch::Tensor& pred_dist, int64_t reg_max) {
  const auto b = pred_dist.size(0);
  const auto a = pred_dist.size(1);
  auto proj = torch::arange(reg_max, pred_dist.options().requires_grad(false));
  return pred_dist.view({b, a, 4, reg_max}).softmax(3).matmul(proj);
}

torch::Tensor distribution_focal_loss(const torch::Tensor& pred_dist, const torch::Tensor& target, int64_t reg_max) {
  namespace F = torch::nn::functional;
  // The right bin tl + 1 must exist, hence the clamp just below the last bin.
  auto t = target.clamp(0, static_cast<double>(reg_max - 1) - 0.01);
  auto logits = pred_dist.reshape({-1, reg_max});
  auto tl = t.to(torch::kLong);
  auto tr = tl + 1;
  auto wl = tr.to(t.scalar_type()) - t;
  auto wr = 1 - wl;
  auto none = F::CrossEntropyFuncOptions().reduction(torch::kNone);
  auto ce_l = F::cross_entropy(logits, tl.view({-1}), none).view(tl.sizes());
  auto ce_r = F::cross_entropy(logits, tr.view({-1}), none).view(tl.sizes());
  return (ce_l * wl + ce_r * wr).mean(-1, true);
}

torch::Tensor DetectionLoss::pad_targets(const LossTargets& targets, int64_t batch_size,
                                         const torch::Tensor& scale_whwh) {
  const auto opts = scale_whwh.options();
  const auto n = targets.bboxes.defined() ? targets.bboxes.size(0) : 0;
  if (n == 0) return torch::zeros({batch_size, 0, 5}, opts);
  if (targets.bboxes.dim() != 2 || targets.bboxes.size(1) != 4) {
    throw std::invalid_argument("loss targets: 'bboxes' must be (N, 4)");
  }
  auto bi = targets.batch_idx.reshape({-1}).to(opts.device()).to(torch::kLong);
  auto cls = targets.cls.reshape({-1}).to(opts);
  if (bi.size(0) != n || cls.size(0) != n) {
    throw std::invalid_argument("loss targets: 'batch_idx', 'cls' and 'bboxes' must have the same length " +
                                std::to_string(n));
  }
  if (bi.min().item<int64_t>() < 0 || bi.max().item<int64_t>() >= batch_size) {
    throw std::invalid_argument("loss targets: 'batch_idx' outside [0, " + std::to_string(batch_size) + ")");
  }
  auto counts = torch::bincount(bi, {}, batch_size);
  const auto m = counts.max().item<int64_t>();
  // Slot of each box within its image, keeping the input order of boxes of one image.
  auto order = std::get<1>(torch::sort(bi, /*stable=*/true, 0, /*descending=*/false));
  auto sorted_bi = bi.index({order});
  auto offsets = counts.cumsum(0) - counts;
  auto slot = torch::arange(n, bi.options()) - offsets.index({sorted_bi});
  auto rows = torch::cat({cls.unsqueeze(1), targets.bboxes.to(opts)}, 1).index({order});
  auto out = torch::zeros({batch_size, m, 5}, opts);
  out.index_put_({sorted_bi, slot}, rows);
  auto xyxy = xywh_to_xyxy(out.narrow(2, 1, 4) * scale_whwh);
  return torch::cat({out.narrow(2, 0, 1), xyxy}, 2);
}

LossOutput DetectionLoss::operator()(const std::vector<torch::Tensor>& feats, const LossTargets& targets) const {
  const auto& c = config_;
  if (feats.size() != c.strides.size()) {
    throw std::invalid_argument("DetectionLoss: got " + std::to_string(feats.size()) + " feature maps for " +
                                std::to_string(c.strides.size()) + " strides");
  }
  const int64_t no = 4 * c.reg_max + c.nc;
  const auto bs = feats[0].size(0);
  std::vector<torch::Tensor> flat;
  std::vector<std::pair<int64_t, int64_t>> hw;
  for (size_t i = 0; i < feats.size(); ++i) {
    const auto& f = feats[i];
    if (f.dim() != 4 || f.size(0) != bs || f.size(1) != no) {
      throw std::invalid_argument("DetectionLoss: feature map " + std::to_string(i) +
                                  " must be (B=" + std::to_string(bs) + ", " + std::to_string(no) + ", H, W)");
    }
    flat.push_back(f.reshape({bs, no, -1}));
    hw.emplace_back(f.size(2), f.size(3));
  }
  auto parts = torch::cat(flat, 2).split_with_sizes({4 * c.reg_max, c.nc}, 1);
  auto pred_scores = parts[1].permute({0, 2, 1}).contiguous();  // (B, A, nc)
  auto pred_distri = parts[0].permute({0, 2, 1}).contiguous();  // (B, A, 4*reg_max)
  const auto dtype = pred_scores.scalar_type();
  const auto opts = pred_scores.options().requires_grad(false);

  auto anchors = make_anchors(hw, c.strides, dtype);
  auto anchor_points = anchors.points.to(opts.device());
  auto stride_tensor = anchors.strides.to(opts.device());

  double img_h = static_cast<double>(hw[0].first) * c.strides[0];
  double img_w = static_cast<double>(hw[0].second) * c.strides[0];
  if (targets.image_hw.first != 0 || targets.image_hw.second != 0) {
    if (targets.image_hw.first <= 0 || targets.image_hw.second <= 0) {
      throw std::invalid_argument("loss targets: 'image_hw' must be positive");
    }
    img_h = static_cast<double>(targets.image_hw.first);
    img_w = static_cast<double>(targets.image_hw.second);
  }
  auto scale = torch::tensor({img_w, img_h, img_w, img_h}, opts);
  auto gt = pad_targets(targets, bs, scale);
  auto gt_labels = gt.narrow(2, 0, 1);
  auto gt_bboxes = gt.narrow(2, 1, 4);
  auto mask_gt = gt_bboxes.sum(2, true).gt(0).to(dtype);

  auto pred_bboxes = dist_to_bbox(dfl_decode(pred_distri, c.reg_max), anchor_points);  // xyxy, stride units
  auto asg = assigner_.assign(pred_scores.detach().sigmoid(), pred_bboxes.detach() * stride_tensor,
                              anchor_points * stride_tensor, gt_labels, gt_bboxes, mask_gt, hw);

  auto target_scores_sum = torch::clamp_min(asg.target_scores.sum(), 1);
  auto loss_cls =
      torch::binary_cross_entropy_with_logits(pred_scores, asg.target_scores, {}, {}, at::Reduction::None).sum() /
      target_scores_sum;

  torch::Tensor loss_box = torch::zeros({}, opts);
  torch::Tensor loss_dfl = torch::zeros({}, opts);
  if (asg.fg_mask.any().item<bool>()) {
    auto target_bboxes = asg.target_bboxes / stride_tensor;
    const auto& fg = asg.fg_mask;
    auto weight = asg.target_scores.sum(-1).index({fg}).unsqueeze(-1);
    auto iou = bbox_iou_xyxy(pred_bboxes.index({fg}), target_bboxes.index({fg}), /*ciou=*/true);
    loss_box = ((1.0 - iou) * weight).sum() / target_scores_sum;

    auto target_ltrb = bbox_to_dist(anchor_points, target_bboxes, static_cast<double>(c.reg_max - 1) - 0.01);
    auto dfl = distribution_focal_loss(pred_distri.index({fg}), target_ltrb.index({fg}), c.reg_max) * weight;
    loss_dfl = dfl.sum() / target_scores_sum;
  }

  auto box = loss_box * c.box;
  auto cls = loss_cls * c.cls;
  auto dfl = loss_dfl * c.dfl;
  auto items = torch::stack({box, cls, dfl});
  return {items.sum() * static_cast<double>(bs), items.detach()};
}

}  // namespace yolo8
