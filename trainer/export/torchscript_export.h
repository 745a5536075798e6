#pragma once
// TorchScript export through LibTorch's tracer: a module whose forward(images 1×3×H×W) returns the same
// 1×(4+nc)×A tensor as DetectionModel::predict, loadable by torch::jit::load (C++) and torch.jit.load (Python).
#include <cstdint>
#include <string>

#include "models/yolo.h"

namespace yolo8 {

// Traces a fused eval-mode copy of `model` (the model itself is untouched) at one input size (multiples of the
// model's stride) and saves it to `path`. The trace is static: sizes are fixed as in the ONNX export.
void export_torchscript(const DetectionModel& model, int64_t height, int64_t width, const std::string& path);

}  // namespace yolo8
