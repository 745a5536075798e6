#pragma once
// Non-maximum suppression of decoded head outputs, ordering-compatible with the reference.
#include <torch/torch.h>

#include <vector>

namespace yolo8 {

struct NmsConfig {
  double conf_thres = 0.25;
  double iou_thres = 0.45;
  bool agnostic = false;     // one class for all boxes
  bool multi_label = false;  // one row per (box, class) above conf_thres
  int64_t max_det = 300;
  int64_t max_nms = 30000;  // candidates kept (by score) before NMS
  double max_wh = 7680.0;   // class offset separating classes in class-aware NMS

  void validate() const;
};

// Greedy NMS on xyxy boxes: indices of kept boxes in descending score order (ties keep input order),
// at most max_keep (<= 0: no limit). A box is dropped when IoU with a kept, higher-ranked box > iou_thres.
// Cost: O(n log n) sort plus, per block of 512 ranked boxes, one IoU matrix against the kept set and one
// within the block; the sequential pass only touches pairs inside a block. Memory O(512 * (kept + 512)).
torch::Tensor nms_boxes(const torch::Tensor& boxes, const torch::Tensor& scores, double iou_thres,
                        int64_t max_keep = -1);

// prediction: (B, 4 + nc, A) centre-xywh + class scores. Returns one (n, 6) tensor per image:
// x1, y1, x2, y2, confidence, class.
std::vector<torch::Tensor> non_max_suppression(const torch::Tensor& prediction, const NmsConfig& config = {});

}  // namespace yolo8
