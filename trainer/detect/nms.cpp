#include "trainer/detect/nms.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "trainer/detect/box_ops.h"

namespace yolo8 {

void NmsConfig::validate() const {
  auto fail = [](const std::string& key, const std::string& why) {
    throw std::invalid_argument("nms config: '" + key + "' " + why);
  };
  if (!(conf_thres >= 0 && conf_thres <= 1)) fail("conf", "must be in [0, 1]");
  if (!(iou_thres >= 0 && iou_thres <= 1)) fail("iou", "must be in [0, 1]");
  if (max_det < 1) fail("max_det", "must be >= 1");
  if (max_nms < 1) fail("max_nms", "must be >= 1");
  if (!(max_wh > 0)) fail("max_wh", "must be positive");
}

namespace {

constexpr int64_t kBlock = 512;

// IoU with the same float operations as torchvision's CPU kernel, so thresholds flip identically.
// The caller compares in double, as that kernel does (float IoU against a double threshold).
torch::Tensor pairwise_iou_tv(const torch::Tensor& a, const torch::Tensor& area_a, const torch::Tensor& b,
                              const torch::Tensor& area_b) {
  auto ac = a.unsqueeze(1).unbind(-1);
  auto bc = b.unsqueeze(0).unbind(-1);
  auto w = (torch::minimum(ac[2], bc[2]) - torch::maximum(ac[0], bc[0])).clamp_min(0);
  auto h = (torch::minimum(ac[3], bc[3]) - torch::maximum(ac[1], bc[1])).clamp_min(0);
  auto inter = w * h;
  return inter / (area_a.unsqueeze(1) + area_b.unsqueeze(0) - inter);
}

}  // namespace

torch::Tensor nms_boxes(const torch::Tensor& boxes_in, const torch::Tensor& scores_in, double iou_thres,
                        int64_t max_keep) {
  if (boxes_in.dim() != 2 || boxes_in.size(1) != 4 || scores_in.dim() != 1 || scores_in.size(0) != boxes_in.size(0)) {
    throw std::invalid_argument("nms_boxes: expected boxes (n, 4) and scores (n)");
  }
  const auto n = boxes_in.size(0);
  auto long_opts = torch::TensorOptions().dtype(torch::kLong);
  if (n == 0) return torch::empty({0}, long_opts.device(boxes_in.device()));
  if (max_keep <= 0) max_keep = n;

  auto boxes = boxes_in.detach().to(torch::kCPU).contiguous();
  auto scores = scores_in.detach().to(torch::kCPU);
  auto order = std::get<1>(torch::sort(scores, /*stable=*/true, 0, /*descending=*/true));
  auto sorted = boxes.index({order});
  auto c = sorted.unbind(1);
  auto areas = (c[2] - c[0]) * (c[3] - c[1]);

  std::vector<int64_t> kept;  // positions in sorted order
  torch::Tensor kept_boxes = sorted.new_empty({0, 4});
  torch::Tensor kept_areas = areas.new_empty({0});
  for (int64_t start = 0; start < n && static_cast<int64_t>(kept.size()) < max_keep; start += kBlock) {
    const auto len = std::min(kBlock, n - start);
    auto blk = sorted.narrow(0, start, len);
    auto blk_area = areas.narrow(0, start, len);
    // Suppressed by boxes kept in earlier blocks.
    auto suppressed = torch::zeros({len}, torch::kBool);
    if (kept_boxes.size(0) > 0) {
      suppressed = (pairwise_iou_tv(kept_boxes, kept_areas, blk, blk_area).to(torch::kDouble) > iou_thres).any(0);
    }
    // Sequential greedy pass inside the block.
    auto over = (pairwise_iou_tv(blk, blk_area, blk, blk_area).to(torch::kDouble) > iou_thres).contiguous();
    auto over_a = over.accessor<bool, 2>();
    auto sup = suppressed.contiguous();
    auto sup_a = sup.accessor<bool, 1>();
    std::vector<int64_t> blk_kept;
    for (int64_t i = 0; i < len && static_cast<int64_t>(kept.size() + blk_kept.size()) < max_keep; ++i) {
      if (sup_a[i]) continue;
      blk_kept.push_back(i);
      for (int64_t j = i + 1; j < len; ++j) {
        if (over_a[i][j]) sup_a[j] = true;
      }
    }
    if (blk_kept.empty()) continue;
    auto idx = torch::tensor(blk_kept, long_opts);
    kept_boxes = torch::cat({kept_boxes, blk.index({idx})});
    kept_areas = torch::cat({kept_areas, blk_area.index({idx})});
    for (auto i : blk_kept) kept.push_back(start + i);
  }
  auto kept_t = torch::tensor(kept, long_opts);
  return order.index({kept_t}).to(boxes_in.device());
}

std::vector<torch::Tensor> non_max_suppression(const torch::Tensor& prediction, const NmsConfig& cfg) {
  cfg.validate();
  if (prediction.dim() != 3 || prediction.size(1) < 5) {
    throw std::invalid_argument("non_max_suppression: prediction must be (B, 4 + nc, A)");
  }
  torch::NoGradGuard no_grad;
  const auto bs = prediction.size(0);
  const auto nc = prediction.size(1) - 4;
  const bool multi_label = cfg.multi_label && nc > 1;
  auto pred = prediction.transpose(-1, -2);  // (B, A, 4 + nc)
  auto boxes_all = xywh_to_xyxy(pred.narrow(2, 0, 4));
  auto scores_all = pred.narrow(2, 4, nc);
  auto candidates = scores_all.amax(2) > cfg.conf_thres;  // (B, A)

  std::vector<torch::Tensor> out;
  out.reserve(bs);
  for (int64_t b = 0; b < bs; ++b) {
    auto keep = candidates[b];
    auto box = boxes_all[b].index({keep});
    auto cls = scores_all[b].index({keep});
    torch::Tensor x;
    if (multi_label) {
      auto ij = (cls > cfg.conf_thres).nonzero();
      auto i = ij.select(1, 0);
      auto j = ij.select(1, 1);
      x = torch::cat({box.index({i}), cls.index({i, j}).unsqueeze(1), j.unsqueeze(1).to(box.scalar_type())}, 1);
    } else {
      auto mx = cls.max(1, true);
      auto conf = std::get<0>(mx);
      auto j = std::get<1>(mx);
      x = torch::cat({box, conf, j.to(box.scalar_type())}, 1).index({conf.view({-1}) > cfg.conf_thres});
    }
    if (x.size(0) > cfg.max_nms) {
      auto top = std::get<1>(torch::sort(x.select(1, 4), /*stable=*/true, 0, /*descending=*/true));
      x = x.index({top.narrow(0, 0, cfg.max_nms)});
    }
    if (x.size(0) == 0) {
      out.push_back(torch::zeros({0, 6}, prediction.options()));
      continue;
    }
    auto offset = x.narrow(1, 5, 1) * (cfg.agnostic ? 0.0 : cfg.max_wh);
    auto idx = nms_boxes(x.narrow(1, 0, 4) + offset, x.select(1, 4), cfg.iou_thres, cfg.max_det);
    out.push_back(x.index({idx}));
  }
  return out;
}

}  // namespace yolo8
