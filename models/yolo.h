#pragma once
// YOLOv8 DetectionModel built from an Ultralytics-format model YAML.
#include <torch/torch.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "models/detect.h"
#include "models/model_yaml.h"

namespace yolo8 {

// What one `model.N` entry is, for info tables and FLOP counting.
struct LayerRecord {
  int64_t index = 0;
  std::vector<int64_t> from;  // as written (-1 = previous)
  int64_t repeats = 1;        // after depth scaling
  std::string module;         // YAML module name
  std::string args;           // resolved constructor arguments, e.g. "[3, 16, 3, 2]"
  int64_t out_channels = 0;
  std::shared_ptr<torch::nn::Module> module_ptr;
};

struct DetectOutput {
  torch::Tensor pred;                // eval mode only: B×(4+nc)×A, xywh pixels + sigmoid scores
  std::vector<torch::Tensor> feats;  // raw level maps B×(64+nc)×Hi×Wi
};

class DetectionModelImpl : public torch::nn::Module {
 public:
  explicit DetectionModelImpl(const ModelConfig& cfg);
  // x: B×ch×H×W (H, W multiples of the max stride) -> train: feats only; eval: pred and feats
  DetectOutput forward(const torch::Tensor& x);
  // Raw level maps in either mode.
  std::vector<torch::Tensor> forward_maps(const torch::Tensor& x);
  // Decoded predictions B×(4+nc)×A regardless of mode (BatchNorm still follows the mode).
  torch::Tensor predict(const torch::Tensor& x);

  // Folds every BatchNorm into its convolution (inference only; no way back).
  void fuse();
  bool is_fused() const { return fused_; }

  int64_t nc() const { return detect_->nc(); }
  torch::Tensor strides() const { return detect_->stride.clone(); }
  int64_t max_stride() const;
  const ModelConfig& config() const { return cfg_; }
  const std::vector<LayerRecord>& layers() const { return records_; }
  Detect detect() const { return detect_; }

  torch::nn::ModuleList model{nullptr};

 private:
  using LayerFn = std::function<torch::Tensor(const std::vector<torch::Tensor>&)>;
  ModelConfig cfg_;
  std::vector<LayerRecord> records_;
  std::vector<LayerFn> fns_;
  std::vector<bool> keep_;  // outputs that later layers read
  Detect detect_{nullptr};
  bool fused_ = false;
};
TORCH_MODULE(DetectionModel);

// Model from a YAML name/path ("yolov8m.yaml", "configs/models/yolov8-p2.yaml"); nc_override > 0 wins.
DetectionModel build_model(const std::string& yaml_spec, int64_t nc_override = 0);
// Model from an already parsed document (e.g. the `yaml` dict of a checkpoint).
DetectionModel build_model(const YAML::Node& yaml, const std::string& source, const std::string& scale = "",
                           int64_t nc_override = 0);

}  // namespace yolo8
