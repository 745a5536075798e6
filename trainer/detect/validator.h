#pragma once
// Validation bookkeeping on ready tensors: NMS, mapping boxes back to the original images, metrics, optional
// COCO JSON and validation loss. The loop over a data loader lives in trainer/support (mode_support).

#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

#include "trainer/detect/coco_json.h"
#include "trainer/detect/confusion_matrix.h"
#include "trainer/detect/loss.h"
#include "trainer/detect/metrics.h"
#include "trainer/detect/nms.h"

namespace yolo8 {

struct ValConfig {
  double conf = 0.001;
  double iou = 0.7;
  int64_t max_det = 300;
  bool single_cls = false;
  bool save_json = false;
};

// Geometry of one image in a batch: original size and the letterbox mapping original -> batch pixels.
struct ImageGeometry {
  int64_t orig_h = 0, orig_w = 0;
  double gain_h = 1, gain_w = 1, pad_w = 0, pad_h = 0;
};

// Batch-pixel xyxy boxes (N×4+) back to original pixels, clipped to the image; other columns kept.
torch::Tensor boxes_to_original(const torch::Tensor& boxes, const ImageGeometry& geometry);

class DetectionValidator {
 public:
  DetectionValidator(int64_t nc, std::vector<std::string> names, ValConfig config);

  // preds: B×(4+nc)×A decoded (xywh batch pixels + scores); labels: N×6 (image index, class, cx, cy, w, h)
  // normalised to the batch's H×W; one geometry and path per image. Returns the per-image detections
  // (n×6 in original pixels) for plots and predictions.
  std::vector<torch::Tensor> add_batch(const torch::Tensor& preds, const torch::Tensor& labels, int64_t height,
                                       int64_t width, const std::vector<ImageGeometry>& geometry,
                                       const std::vector<std::string>& paths);
  // Validation loss from the raw maps of the same batch (as the reference reports val/box_loss ...).
  void add_loss(const DetectionLoss& loss, const std::vector<torch::Tensor>& feats, const torch::Tensor& labels);

  DetectionResults results() const { return metrics_.compute(); }
  std::string table() const { return metrics_.format_table(names_); }
  // Mean validation loss items (box, cls, dfl) per batch; zeros when no loss was added.
  std::vector<double> mean_loss() const;
  void write_json(const std::string& path) const;
  const DetectionMetrics& metrics() const { return metrics_; }
  const ConfusionMatrix& confusion() const { return confusion_; }

 private:
  int64_t nc_;
  std::vector<std::string> names_;
  ValConfig config_;
  DetectionMetrics metrics_;
  ConfusionMatrix confusion_;
  CocoJsonWriter json_;
  torch::Tensor loss_sum_;
  int64_t loss_batches_ = 0;
};

}  // namespace yolo8
