#include "trainer/detect/box_ops.h"

#include <cmath>
#include <stdexcept>
#include <string>

namespace yolo8 {

namespace {
void check_last_dim4(const torch::Tensor& t, const char* what) {
  if (t.dim() < 1 || t.size(-1) != 4) {
    throw std::invalid_argument(std::string(what) + ": expected last dimension 4, got shape " +
                                std::to_string(t.dim() ? t.size(-1) : 0));
  }
}
}  // namespace

torch::Tensor xywh_to_xyxy(const torch::Tensor& xywh) {
  check_last_dim4(xywh, "xywh_to_xyxy");
  auto c = xywh.unbind(-1);
  auto dw = c[2] / 2;
  auto dh = c[3] / 2;
  return torch::stack({c[0] - dw, c[1] - dh, c[0] + dw, c[1] + dh}, -1);
}

torch::Tensor xyxy_to_xywh(const torch::Tensor& xyxy) {
  check_last_dim4(xyxy, "xyxy_to_xywh");
  auto c = xyxy.unbind(-1);
  return torch::stack({(c[0] + c[2]) / 2, (c[1] + c[3]) / 2, c[2] - c[0], c[3] - c[1]}, -1);
}

torch::Tensor bbox_iou_xyxy(const torch::Tensor& box1, const torch::Tensor& box2, bool ciou, double eps) {
  check_last_dim4(box1, "bbox_iou_xyxy");
  check_last_dim4(box2, "bbox_iou_xyxy");
  auto a = box1.chunk(4, -1);
  auto b = box2.chunk(4, -1);
  const auto& b1x1 = a[0];
  const auto& b1y1 = a[1];
  const auto& b1x2 = a[2];
  const auto& b1y2 = a[3];
  const auto& b2x1 = b[0];
  const auto& b2y1 = b[1];
  const auto& b2x2 = b[2];
  const auto& b2y2 = b[3];
  auto w1 = b1x2 - b1x1;
  auto h1 = b1y2 - b1y1 + eps;
  auto w2 = b2x2 - b2x1;
  auto h2 = b2y2 - b2y1 + eps;
  auto inter = (torch::minimum(b1x2, b2x2) - torch::maximum(b1x1, b2x1)).clamp_min(0) *
               (torch::minimum(b1y2, b2y2) - torch::maximum(b1y1, b2y1)).clamp_min(0);
  auto uni = w1 * h1 + w2 * h2 - inter + eps;
  auto iou = inter / uni;
  if (!ciou) return iou;
  auto cw = torch::maximum(b1x2, b2x2) - torch::minimum(b1x1, b2x1);
  auto ch = torch::maximum(b1y2, b2y2) - torch::minimum(b1y1, b2y1);
  auto c2 = cw.pow(2) + ch.pow(2) + eps;
  auto rho2 = ((b2x1 + b2x2 - b1x1 - b1x2).pow(2) + (b2y1 + b2y2 - b1y1 - b1y2).pow(2)) / 4;
  auto v = (4 / (M_PI * M_PI)) * (torch::atan(w2 / h2) - torch::atan(w1 / h1)).pow(2);
  torch::Tensor alpha;
  {
    torch::NoGradGuard no_grad;
    alpha = v / (v - iou + (1 + eps));
  }
  return iou - (rho2 / c2 + v * alpha);
}

torch::Tensor box_iou_matrix(const torch::Tensor& box1, const torch::Tensor& box2, double eps) {
  check_last_dim4(box1, "box_iou_matrix");
  check_last_dim4(box2, "box_iou_matrix");
  auto a = box1.unsqueeze(1).chunk(2, 2);
  auto b = box2.unsqueeze(0).chunk(2, 2);
  auto inter = (torch::min(a[1], b[1]) - torch::max(a[0], b[0])).clamp_min(0).prod(2);
  return inter / ((a[1] - a[0]).prod(2) + (b[1] - b[0]).prod(2) - inter + eps);
}

Anchors make_anchors(const std::vector<std::pair<int64_t, int64_t>>& feature_hw, const std::vector<double>& strides,
                     torch::Dtype dtype, double offset) {
  if (feature_hw.size() != strides.size()) {
    throw std::invalid_argument("make_anchors: " + std::to_string(feature_hw.size()) + " feature maps but " +
                                std::to_string(strides.size()) + " strides");
  }
  std::vector<torch::Tensor> points;
  std::vector<torch::Tensor> stride_list;
  auto opts = torch::TensorOptions().dtype(dtype);
  for (size_t i = 0; i < strides.size(); ++i) {
    const auto [h, w] = feature_hw[i];
    auto sx = torch::arange(w, opts) + offset;
    auto sy = torch::arange(h, opts) + offset;
    auto grid = torch::meshgrid({sy, sx}, "ij");
    points.push_back(torch::stack({grid[1], grid[0]}, -1).view({-1, 2}));
    stride_list.push_back(torch::full({h * w, 1}, strides[i], opts));
  }
  return {torch::cat(points), torch::cat(stride_list)};
}

torch::Tensor dist_to_bbox(const torch::Tensor& distance, const torch::Tensor& anchor_points, bool xywh) {
  auto lt_rb = distance.chunk(2, -1);
  auto x1y1 = anchor_points - lt_rb[0];
  auto x2y2 = anchor_points + lt_rb[1];
  if (xywh) return torch::cat({(x1y1 + x2y2) / 2, x2y2 - x1y1}, -1);
  return torch::cat({x1y1, x2y2}, -1);
}

torch::Tensor bbox_to_dist(const torch::Tensor& anchor_points, const torch::Tensor& bbox, double max_dist) {
  auto xy = bbox.chunk(2, -1);
  return torch::cat({anchor_points - xy[0], xy[1] - anchor_points}, -1).clamp(0, max_dist);
}

}  // namespace yolo8
