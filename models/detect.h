#pragma once
// YOLOv8 detection head (anchor-free, DFL box regression) and its anchor helpers.
#include <torch/torch.h>

#include <vector>

#include "models/blocks.h"

namespace yolo8 {

inline constexpr int64_t kRegMax = 16;

// Grid-cell centres (+offset) in stride units for each level: points A×2 (x, y), strides A×1.
std::pair<torch::Tensor, torch::Tensor> make_anchors(const std::vector<torch::Tensor>& feats,
                                                     const torch::Tensor& strides, double offset = 0.5);

// distance: ...×4×... (l, t, r, b) along dim; anchors broadcastable; returns xywh (or xyxy) along dim.
torch::Tensor dist2bbox(const torch::Tensor& distance, const torch::Tensor& anchors, bool xywh = true,
                        int64_t dim = -1);

class DetectImpl : public torch::nn::Module {
 public:
  DetectImpl(int64_t nc, std::vector<int64_t> ch);
  // train: feats Li B×Ci×Hi×Wi -> Li B×(64+nc)×Hi×Wi (raw maps). In eval mode under CPU bfloat16 autocast the last
  // convolution of each branch runs in float32: bfloat16's 8 significant bits would round the DFL logits, and with
  // them every box edge (a 20-epoch run's per-epoch mAP50-95: within 0.0043 of float32's this way; an earlier run
  // with the whole head in bfloat16 was 0.014 lower at epoch 10).
  std::vector<torch::Tensor> forward_maps(const std::vector<torch::Tensor>& feats);
  // maps Li B×(64+nc)×Hi×Wi -> B×(4+nc)×A: xywh in input pixels, then sigmoid class scores
  torch::Tensor decode(const std::vector<torch::Tensor>& maps);
  // Box 1.0, class log(5/nc/(640/s)^2); needs strides.
  void bias_init();

  int64_t nc() const { return nc_; }
  int64_t nl() const { return static_cast<int64_t>(ch_.size()); }
  int64_t no() const { return nc_ + kRegMax * 4; }
  const std::vector<int64_t>& channels() const { return ch_; }

  torch::nn::ModuleList cv2{nullptr}, cv3{nullptr};
  DFL dfl{nullptr};
  torch::Tensor stride;  // nl strides; not a buffer (Ultralytics keeps it out of the state dict)

 private:
  int64_t nc_;
  std::vector<int64_t> ch_;
  std::vector<torch::nn::Sequential> box_, cls_;
  // One branch (Conv, Conv, Conv2d) on one level; `float_output`: its Conv2d in float32 outside autocast.
  torch::Tensor branch(torch::nn::Sequential& seq, const torch::Tensor& x, bool float_output);
};
TORCH_MODULE(Detect);

}  // namespace yolo8
