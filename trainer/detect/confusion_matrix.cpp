#include "trainer/detect/confusion_matrix.h"

#include <stdexcept>
#include <string>

#include "trainer/detect/box_ops.h"

namespace yolo8 {

namespace {

torch::Tensor rows_or_empty(const torch::Tensor& t, int64_t cols, const char* what) {
  if (!t.defined() || t.numel() == 0) return torch::zeros({0, cols}, torch::kDouble);
  if (t.dim() != 2 || t.size(1) != cols) {
    throw std::invalid_argument(std::string("ConfusionMatrix::update: ") + what + " must be (N, " +
                                std::to_string(cols) + "), got " + std::to_string(t.dim()) + "-d");
  }
  return t.detach().to(torch::kCPU, torch::kDouble);
}

torch::Tensor class_column(const torch::Tensor& values, int64_t nc, const char* what) {
  auto cls = values.to(torch::kLong);
  if (cls.numel() > 0 && (cls.min().item<int64_t>() < 0 || cls.max().item<int64_t>() >= nc)) {
    throw std::invalid_argument(std::string("ConfusionMatrix::update: ") + what + " class outside [0, " +
                                std::to_string(nc) + ")");
  }
  return cls;
}

}  // namespace

ConfusionMatrix::ConfusionMatrix(int64_t nc, double conf, double iou_thres)
    : nc_(nc), conf_(conf == 0.001 ? 0.25 : conf), iou_thres_(iou_thres) {
  if (nc_ < 1) throw std::invalid_argument("ConfusionMatrix: nc must be >= 1, got " + std::to_string(nc));
  reset();
}

void ConfusionMatrix::reset() { matrix_ = torch::zeros({nc_ + 1, nc_ + 1}, torch::kDouble); }

void ConfusionMatrix::update(const torch::Tensor& detections_in, const torch::Tensor& labels_in) {
  auto det = rows_or_empty(detections_in, 6, "detections");
  const auto labels = rows_or_empty(labels_in, 5, "labels");
  det = det.index({det.select(1, 4) > conf_});
  const auto det_cls = class_column(det.select(1, 5), nc_, "detection");
  const auto gt_cls = class_column(labels.select(1, 0), nc_, "label");
  const auto bg = torch::full({1}, nc_, torch::kLong);
  const auto ones = [](int64_t n) { return torch::ones({n}, torch::kDouble); };

  if (labels.size(0) == 0) {  // every confident detection is a false positive
    matrix_.index_put_({det_cls, bg.expand_as(det_cls)}, ones(det_cls.size(0)), true);
    return;
  }
  const int64_t m = labels.size(0), n = det.size(0);
  // iou (M, N) labels x detections; pairs at or below the threshold never match.
  auto iou = n > 0 ? box_iou_matrix(labels.narrow(1, 1, 4), det.narrow(1, 0, 4)) : torch::zeros({m, 0}, torch::kDouble);
  auto cand = torch::where(iou > iou_thres_, iou, torch::full_like(iou, -1.0));

  // Unique matches by IoU, in the reference's order: each detection keeps its best label, then each label
  // keeps its best detection among those.
  auto gt_of_det = torch::full({n}, int64_t{-1}, torch::kLong);
  auto det_of_gt = torch::full({m}, int64_t{-1}, torch::kLong);
  if (n > 0) {
    const auto best = cand.max(0);
    const auto best_iou = std::get<0>(best), best_gt = std::get<1>(best);
    const auto det_ok = best_iou > 0;
    // (M, N) with only each detection's chosen pair kept.
    auto kept = torch::full_like(cand, -1.0);
    const auto cols = torch::arange(n, torch::kLong).index({det_ok});
    kept.index_put_({best_gt.index({det_ok}), cols}, best_iou.index({det_ok}));
    const auto per_gt = kept.max(1);
    const auto gt_ok = std::get<0>(per_gt) > 0;
    det_of_gt = torch::where(gt_ok, std::get<1>(per_gt), det_of_gt);
    const auto matched_gt = torch::arange(m, torch::kLong).index({gt_ok});
    gt_of_det.index_put_({det_of_gt.index({gt_ok})}, matched_gt);
  }
  const auto gt_matched = det_of_gt >= 0;
  const bool any_match = gt_matched.any().item<bool>();

  // Matched labels: predicted class (right or wrong) x true class; unmatched labels: background row.
  const auto mg = gt_matched.nonzero().squeeze(1);
  matrix_.index_put_({det_cls.index({det_of_gt.index({mg})}), gt_cls.index({mg})}, ones(mg.size(0)), true);
  const auto ug = gt_cls.index({~gt_matched});
  matrix_.index_put_({bg.expand_as(ug), ug}, ones(ug.size(0)), true);
  // The reference counts unmatched detections as background only when the image had at least one match.
  if (any_match) {
    const auto ud = det_cls.index({gt_of_det < 0});
    matrix_.index_put_({ud, bg.expand_as(ud)}, ones(ud.size(0)), true);
  }
}

torch::Tensor ConfusionMatrix::true_positives() const { return matrix_.diagonal().narrow(0, 0, nc_).clone(); }

torch::Tensor ConfusionMatrix::false_positives() const {
  return (matrix_.sum(1) - matrix_.diagonal()).narrow(0, 0, nc_).clone();
}

}  // namespace yolo8
