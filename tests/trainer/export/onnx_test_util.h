#pragma once
// The fixture model and the comparison the export tests share.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "models/weights.h"
#include "test_paths.h"

namespace yolo8::test {

inline LoadedModel fixture_model() { return load_model(std::string(kFixturesDir) + "/yolov8n-shapes.pt"); }

// The export's reference: the same weights in LibTorch, fused and in eval mode.
inline torch::Tensor libtorch_reference(const DetectionModel& model, const torch::Tensor& input) {
  torch::NoGradGuard no_grad;
  DetectionModel fused = copy_model(model);
  fused->eval();
  fused->fuse();
  return fused->predict(input);
}

// Largest |a - b| / |b| over the elements (|b| floored at 1e-6).
inline double max_relative_diff(const torch::Tensor& a, const torch::Tensor& b) {
  const torch::Tensor x = a.to(torch::kDouble), y = b.to(torch::kDouble);
  return ((x - y).abs() / y.abs().clamp_min(1e-6)).max().item<double>();
}

}  // namespace yolo8::test
