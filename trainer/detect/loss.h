#pragma once
// YOLOv8 detection loss: CIoU + DFL box terms and BCE class term over task-aligned targets.
#include <torch/torch.h>

#include <utility>
#include <vector>

#include "trainer/detect/assigner.h"

namespace yolo8 {

struct LossConfig {
  int64_t nc = 80;
  int64_t reg_max = 16;
  std::vector<double> strides = {8.0, 16.0, 32.0};
  double box = 7.5;
  double cls = 0.5;
  double dfl = 1.5;
  AssignerConfig assigner;  // topk 10, alpha 0.5, beta 6.0, eps 1e-9

  // Throws std::invalid_argument naming the offending key.
  void validate() const;
};

// Targets of one batch, flattened over images (the dataloader's collate format).
struct LossTargets {
  torch::Tensor batch_idx;  // (N) or (N, 1) image index of each box
  torch::Tensor cls;        // (N) or (N, 1) class id
  torch::Tensor bboxes;     // (N, 4) centre-xywh normalised to [0, 1]
  // Input image (height, width) in pixels that the boxes are normalised to; {0, 0}: first map size x its
  // stride, as the reference derives it.
  std::pair<int64_t, int64_t> image_hw = {0, 0};

  // From the loader's label rows: N x 6 (image index, class, centre-xywh normalised).
  static LossTargets from_label_rows(const torch::Tensor& labels);
};

struct LossOutput {
  torch::Tensor total;  // scalar, (box + cls + dfl) x batch size; call backward() on this
  torch::Tensor items;  // (3) detached: box, cls, dfl after gains
};

class DetectionLoss {
 public:
  explicit DetectionLoss(LossConfig config);

  // feats: one raw head map per stride, (B, 4*reg_max + nc, H_i, W_i).
  LossOutput operator()(const std::vector<torch::Tensor>& feats, const LossTargets& targets) const;

  const LossConfig& config() const { return config_; }

  // Targets padded per image: (B, M, 5) rows of (cls, x1, y1, x2, y2) in pixels, M = max boxes per image.
  static torch::Tensor pad_targets(const LossTargets& targets, int64_t batch_size, const torch::Tensor& scale_whwh);

 private:
  LossConfig config_;
  TaskAlignedAssigner assigner_;
};

// DFL expectation decode: (B, A, 4*reg_max) logits -> (B, A, 4) distances in stride units.
torch::Tensor dfl_decode(const torch::Tensor& pred_dist, int64_t reg_max);

// DFL: pred_dist (N, 4*reg_max) logits, target (N, 4) distances in stride units (clamped to reg_max - 1.01);
// returns (N, 1), the mean over the four sides of the two-bin cross-entropy.
torch::Tensor distribution_focal_loss(const torch::Tensor& pred_dist, const torch::Tensor& target, int64_t reg_max);

}  // namespace yolo8
