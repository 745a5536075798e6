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

// torch::minimum / maximum: NaN wins, so that a NaN box suppresses nothing and is suppressed by nothing.
template <typename T>
T minimum(T a, T b) {
  return a != a ? a : (b != b ? b : (b < a ? b : a));
}
template <typename T>
T maximum(T a, T b) {
  return a != a ? a : (b != b ? b : (a < b ? b : a));
}

// Greedy NMS over boxes (x1, y1, x2, y2) sorted by score, best first: a box is kept when no box kept before it
// overlaps it by more than the threshold. The IoU is torchvision's CPU kernel's, operation for operation (float,
// against a double threshold), so that thresholds flip identically; nms.cpp is compiled without contracting a*b+c,
// which would round differently. Each box meets the kept ones only, and the walk ends at max_keep: the IoU matrix
// of every pair in a block, in tensor ops, took most of NMS's time at validation's conf 0.001 (nms_bench). Returns
// sorted positions.
template <typename T>
std::vector<int64_t> greedy_nms(const T* boxes, int64_t n, double iou_thres, int64_t max_keep) {
  std::vector<int64_t> kept;
  std::vector<T> kept_area;
  for (int64_t i = 0; i < n && static_cast<int64_t>(kept.size()) < max_keep; ++i) {
    const T* b = boxes + 4 * i;
    const T area = (b[2] - b[0]) * (b[3] - b[1]);
    bool suppressed = false;
    for (size_t k = 0; k < kept.size() && !suppressed; ++k) {
      const T* a = boxes + 4 * kept[k];
      const T w = std::max(minimum(a[2], b[2]) - maximum(a[0], b[0]), T(0));
      const T h = std::max(minimum(a[3], b[3]) - maximum(a[1], b[1]), T(0));
      const T inter = w * h;
      const T iou = inter / (kept_area[k] + area - inter);
      suppressed = static_cast<double>(iou) > iou_thres;
    }
    if (suppressed) continue;
    kept.push_back(i);
    kept_area.push_back(area);
  }
  return kept;
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

  auto boxes = boxes_in.detach().to(torch::kCPU);
  auto scores = scores_in.detach().to(torch::kCPU);
  auto order = std::get<1>(torch::sort(scores, /*stable=*/true, 0, /*descending=*/true));
  auto sorted = boxes.index({order}).contiguous();
  std::vector<int64_t> kept;  // positions in sorted order; half-precision boxes are compared in float
  if (sorted.scalar_type() == torch::kDouble) {
    kept = greedy_nms(sorted.data_ptr<double>(), n, iou_thres, max_keep);
  } else {
    sorted = sorted.to(torch::kFloat);
    kept = greedy_nms(sorted.data_ptr<float>(), n, iou_thres, max_keep);
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
