#pragma once
// Model summary: per-layer table, totals and GFLOPs, like Ultralytics' model.info().
#include <string>
#include <vector>

#include "models/yolo.h"

namespace yolo8 {

struct LayerInfoRow {
  int64_t index = 0;
  std::string from;  // "-1" or "[-1, 6]"
  int64_t repeats = 1;
  int64_t params = 0;
  std::string module;
  std::string args;
};

struct ModelInfo {
  std::vector<LayerInfoRow> rows;
  int64_t layers = 0;  // modules, the shared activation counted once (Ultralytics' way)
  int64_t parameters = 0;
  int64_t gradients = 0;  // parameters that require grad
  double gflops = 0.0;    // at imgsz × imgsz
  int64_t imgsz = 640;
};

// Multiply-adds of every convolution ×2 / 1e9 for a B=1 input of h × w (multiples of the max stride).
double model_gflops(DetectionModel& model, int64_t h = 640, int64_t w = 640);

ModelInfo model_info(DetectionModel& model, int64_t imgsz = 640);

// Table plus the one-line summary: "<name> summary: 225 layers, 3157200 parameters, ... 8.7 GFLOPs".
std::string format_model_info(const ModelInfo& info, const std::string& name = "YOLOv8");

}  // namespace yolo8
