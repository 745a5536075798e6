#pragma once
// Task-aligned assignment of ground-truth boxes to anchors (TOOD / YOLOv8), batched.
#include <torch/torch.h>

#include <utility>
#include <vector>

namespace yolo8 {

struct AssignerConfig {
  int64_t topk = 10;
  double alpha = 0.5;  // exponent of the class score in the alignment metric
  double beta = 6.0;   // exponent of the IoU in the alignment metric
  double eps = 1e-9;
};

struct Assignment {
  torch::Tensor target_labels;  // (B, A) int64
  torch::Tensor target_bboxes;  // (B, A, 4) xyxy, image pixels
  torch::Tensor target_scores;  // (B, A, nc) normalised alignment at the assigned class
  torch::Tensor fg_mask;        // (B, A) bool
  torch::Tensor target_gt_idx;  // (B, A) int64 index into the padded GT list
};

class TaskAlignedAssigner {
 public:
  TaskAlignedAssigner(int64_t num_classes, AssignerConfig config = {});

  // pd_scores (B, A, nc) probabilities; pd_bboxes (B, A, 4) xyxy pixels; anchor_points (A, 2) pixels;
  // gt_labels (B, M, 1); gt_bboxes (B, M, 4) xyxy pixels; mask_gt (B, M, 1), 1 for real (non-padding) boxes.
  // level_hw: when the anchors are row-major grids of these (h, w), the inside-box test runs per row and
  // column (same result, much cheaper); empty for arbitrary anchors.
  Assignment assign(const torch::Tensor& pd_scores, const torch::Tensor& pd_bboxes, const torch::Tensor& anchor_points,
                    const torch::Tensor& gt_labels, const torch::Tensor& gt_bboxes, const torch::Tensor& mask_gt,
                    const std::vector<std::pair<int64_t, int64_t>>& level_hw = {}) const;

  const AssignerConfig& config() const { return config_; }

 private:
  int64_t num_classes_;
  AssignerConfig config_;
};

// (A, 2) anchor centres x (B, M, 4) xyxy boxes -> (B, M, A) bool: centre strictly inside the box (by > eps).
torch::Tensor select_candidates_in_gts(const torch::Tensor& anchor_points, const torch::Tensor& gt_bboxes,
                                       double eps = 1e-9);
// Same for anchors laid out as row-major grids of level_hw (as make_anchors builds them).
torch::Tensor select_candidates_in_gts_grid(const torch::Tensor& anchor_points, const torch::Tensor& gt_bboxes,
                                            const std::vector<std::pair<int64_t, int64_t>>& level_hw,
                                            double eps = 1e-9);

}  // namespace yolo8
