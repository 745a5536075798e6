#pragma once
// Detection metrics as the reference validator computes them: IoU matching over 10 thresholds,
// 101-point interpolated AP, P/R at the maximum of the smoothed mean F1, mAP50, mAP50-95, fitness.
#include <torch/torch.h>

#include <string>
#include <vector>

namespace yolo8 {

// 0.50:0.05:0.95 as float32, the reference's iouv.
torch::Tensor default_iou_thresholds();

// (N, T) bool: detection j is a true positive at threshold t. pred_classes (N), true_classes (M),
// iou (M, N) labels x detections. Greedy as the reference: each detection takes its highest-IoU label of
// the same class; a label claimed by several detections goes to the lowest-index one.
torch::Tensor match_predictions(const torch::Tensor& pred_classes, const torch::Tensor& true_classes,
                                const torch::Tensor& iou, const torch::Tensor& iou_thresholds);

// detections (N, 6) x1, y1, x2, y2, conf, cls; labels (M, 5) cls, x1, y1, x2, y2 (same pixel space).
torch::Tensor match_detections(const torch::Tensor& detections, const torch::Tensor& labels,
                               const torch::Tensor& iou_thresholds);

// np.interp semantics, batched over leading dims: x (..., K), xp (..., L) non-decreasing, fp (..., L); double.
torch::Tensor interp(const torch::Tensor& x, const torch::Tensor& xp, const torch::Tensor& fp, double left,
                     double right);

// 101-point interpolated AP of one or more PR curves: recall/precision (..., n) -> (...).
torch::Tensor compute_ap(const torch::Tensor& recall, const torch::Tensor& precision);

// Centred box filter over a fraction f of the curve (edges padded with the end values), as the reference.
torch::Tensor smooth_curve(const torch::Tensor& y, double f = 0.05);

struct ApPerClass {
  torch::Tensor tp, fp;            // (C) at the max-F1 confidence
  torch::Tensor p, r, f1;          // (C) at the max-F1 confidence
  torch::Tensor ap;                // (C, T)
  torch::Tensor classes;           // (C) int64, classes present in the labels, ascending
  torch::Tensor p_curve, r_curve;  // (C, 1000) over confidence grid x
  torch::Tensor f1_curve;          // (C, 1000)
  torch::Tensor x;                 // (1000) confidence grid 0..1
  torch::Tensor prec_values;       // (C, 1000) precision over recall grid x at the first IoU threshold
};

// tp (N, T) bool, conf (N), pred_cls (N), target_cls (M). All results in double.
ApPerClass ap_per_class(const torch::Tensor& tp, const torch::Tensor& conf, const torch::Tensor& pred_cls,
                        const torch::Tensor& target_cls);

struct DetectionResults {
  double precision = 0, recall = 0, map50 = 0, map50_95 = 0, fitness = 0;
  int64_t images = 0;
  torch::Tensor instances_per_class;  // (nc) int64 label counts
  ApPerClass per_class;               // empty tensors when there was nothing to evaluate
  // Per present class (ordered as per_class.classes): P, R, AP50, AP50-95.
  std::vector<int64_t> class_index;
  std::vector<double> class_p, class_r, class_ap50, class_ap50_95;
};

class DetectionMetrics {
 public:
  explicit DetectionMetrics(int64_t nc, torch::Tensor iou_thresholds = default_iou_thresholds());

  // One image: detections (N, 6) x1, y1, x2, y2, conf, cls; labels (M, 5) cls, x1, y1, x2, y2.
  void update(const torch::Tensor& detections, const torch::Tensor& labels);
  DetectionResults compute() const;
  // The reference validator's table: header, 'all' row, then one row per class present in the labels.
  std::string format_table(const std::vector<std::string>& names) const;
  void reset();

  int64_t images() const { return images_; }

 private:
  int64_t nc_;
  torch::Tensor iouv_;
  int64_t images_ = 0;
  std::vector<torch::Tensor> correct_, conf_, pred_cls_, target_cls_;
};

// 0.1 * mAP50 + 0.9 * mAP50-95.
double detection_fitness(double map50, double map50_95);

}  // namespace yolo8
