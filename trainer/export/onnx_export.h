#pragma once
// ONNX export of a DetectionModel as a static graph (every shape and constant fixed at export time), in the layout
// Ultralytics exports: input "images" 1×3×H×W float, output "output0" 1×(4+nc)×A (xywh in input pixels, then class
// scores after sigmoid), names/stride/imgsz in the metadata. Only operators that OpenCV DNN 4.6 and ONNX Runtime
// both load: no Shape/Gather feeding Reshape or Split.
#include <cstdint>
#include <string>
#include <vector>

#include "models/yolo.h"

namespace yolo8 {

struct OnnxExportOptions {
  int64_t height = 640;  // input size; multiples of the model's largest stride
  int64_t width = 640;
  int64_t opset = 12;              // 12 or 13
  bool dynamic = false;            // refused: a static graph has one input size
  bool half = false;               // refused: the graph is written in float32
  std::vector<std::string> names;  // class names; empty = class0, class1, ...
  std::string source;              // what the model was read from, for the description
  std::string version;             // producer version written into the file
};

struct OnnxExportSummary {
  int64_t nodes = 0;
  int64_t initializers = 0;
  int64_t anchors = 0;  // A of the 1×(4+nc)×A output
  int64_t nc = 0;
};

// Throws std::invalid_argument naming the key (opset, dynamic, half, imgsz) for options the exporter refuses.
void check_onnx_options(const OnnxExportOptions& options, int64_t max_stride);

// Writes `model` (a fused eval-mode copy; the model itself is untouched) to `path` as ONNX, after
// onnx::checker::check_model accepted it. Throws std::invalid_argument for refused options and
// std::runtime_error when the file cannot be written.
OnnxExportSummary export_onnx(const DetectionModel& model, const OnnxExportOptions& options, const std::string& path);

// The metadata value Ultralytics writes for `names`: Python's str() of {0: 'person', 1: 'bicycle'}.
std::string python_names_dict(const std::vector<std::string>& names);

}  // namespace yolo8
