#pragma once
// The fixture model and the comparison the export tests share.
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <iostream>
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

// Largest |a - b| / |b| over the elements of 1×(4+nc)×A outputs (|b| floored at 1e-6); prints where it is.
inline double max_relative_diff(const torch::Tensor& a, const torch::Tensor& b) {
  const torch::Tensor x = a.to(torch::kDouble), y = b.to(torch::kDouble);
  const torch::Tensor rel = ((x - y).abs() / y.abs().clamp_min(1e-6)).flatten();
  const int64_t at = rel.argmax().item<int64_t>();
  std::cout << "  worst element: row " << at / b.size(2) << ", anchor " << at % b.size(2) << ": got "
            << x.flatten()[at].item<double>() << " want " << y.flatten()[at].item<double>() << "\n";
  return rel[at].item<double>();
}

}  // namespace yolo8::test
