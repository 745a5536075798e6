#pragma once
// Detection confusion matrix as the reference validator keeps it: (nc + 1) x (nc + 1), rows predicted class,
// columns true class, the last row/column standing for background (missed labels / unmatched detections).
#include <torch/torch.h>

#include <cstdint>

namespace yolo8 {

class ConfusionMatrix {
 public:
  // conf 0.001 (the validator's own default) is replaced by 0.25, as the reference does.
  explicit ConfusionMatrix(int64_t nc, double conf = 0.25, double iou_thres = 0.45);

  // One image: detections (N, 6) x1, y1, x2, y2, conf, cls; labels (M, 5) cls, x1, y1, x2, y2 (same pixel
  // space). Either may have zero rows; an undefined tensor counts as empty.
  void update(const torch::Tensor& detections, const torch::Tensor& labels);

  // (nc + 1, nc + 1) double counts; rows predicted, columns true.
  const torch::Tensor& matrix() const { return matrix_; }
  // Per class (nc): diagonal, and row sum minus diagonal (background excluded).
  torch::Tensor true_positives() const;
  torch::Tensor false_positives() const;

  int64_t nc() const { return nc_; }
  double conf() const { return conf_; }
  double iou_thres() const { return iou_thres_; }
  void reset();

 private:
  int64_t nc_;
  double conf_;
  double iou_thres_;
  torch::Tensor matrix_;
};

}  // namespace yolo8
