#pragma once
// Box geometry shared by the loss, the assigner, NMS and the metrics.
#include <torch/torch.h>

#include <vector>

namespace yolo8 {

// (..., 4) centre-xywh -> corner-xyxy.
torch::Tensor xywh_to_xyxy(const torch::Tensor& xywh);
// (..., 4) corner-xyxy -> centre-xywh.
torch::Tensor xyxy_to_xywh(const torch::Tensor& xyxy);

// Element-wise IoU of (..., 4) xyxy boxes that broadcast against each other; returns (..., 1).
// ciou adds the Complete-IoU penalty; its trade-off weight alpha is held constant (no gradient),
// as in the reference.
torch::Tensor bbox_iou_xyxy(const torch::Tensor& box1, const torch::Tensor& box2, bool ciou, double eps = 1e-7);

// Pairwise IoU: (N, 4) x (M, 4) xyxy -> (N, M).
torch::Tensor box_iou_matrix(const torch::Tensor& box1, const torch::Tensor& box2, double eps = 1e-7);

// Grid-cell centres (+offset) of each map in stride units, and the stride of each anchor.
struct Anchors {
  torch::Tensor points;   // (A, 2) x, y in stride units
  torch::Tensor strides;  // (A, 1)
};
// feature_hw: (h, w) of each level, level order as strides.
Anchors make_anchors(const std::vector<std::pair<int64_t, int64_t>>& feature_hw, const std::vector<double>& strides,
                     torch::Dtype dtype = torch::kFloat32, double offset = 0.5);

// (..., 4) l, t, r, b distances around anchors -> xyxy (or xywh).
torch::Tensor dist_to_bbox(const torch::Tensor& distance, const torch::Tensor& anchor_points, bool xywh = false);
// xyxy boxes -> l, t, r, b distances from anchors, clamped to [0, max_dist].
torch::Tensor bbox_to_dist(const torch::Tensor& anchor_points, const torch::Tensor& bbox, double max_dist);

}  // namespace yolo8
