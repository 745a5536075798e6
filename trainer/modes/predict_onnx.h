#pragma once
// The forward pass behind `yolo8 predict`, for LibTorch weights or an exported ONNX file. The ONNX file runs
// through OpenCV DNN (the runtime a plain deployment has), behind the same letterbox, NMS and outputs as the
// weights, so a deployed file can be checked with our own tool.
#include <opencv2/core.hpp>
#include <torch/torch.h>

#include <functional>
#include <string>
#include <vector>

namespace yolo8 {

struct PredictModel {
  std::vector<std::string> names;  // class names in id order (may be empty: ids are printed)
  int stride = 32;
  // A static graph's input size: every image is letterboxed to it. 0 = padded to the stride only.
  int fixed_height = 0;
  int fixed_width = 0;
  std::string description;  // one line printed before the first image
  // (1, 3, H, W) float RGB in 0..1 on the CPU -> (1, 4+nc, A) float on the CPU: xywh in input pixels, scores.
  std::function<torch::Tensor(const torch::Tensor& input)> forward;
};

// True when `path` names an ONNX file (by its extension, as Ultralytics decides).
inline bool is_onnx_path(const std::string& path) {
  return path.size() >= 5 && path.compare(path.size() - 5, 5, ".onnx") == 0;
}

// An exported ONNX detector through OpenCV DNN; names and stride from its metadata, the input size from its graph.
// Throws std::runtime_error naming the file when it cannot be read or its output is not 1×(4+nc)×A. Built from
// predict_onnx.cpp where OpenCV DNN and libonnx were found, else from predict_onnx_unavailable.cpp.
PredictModel open_onnx_predict_model(const std::string& path);

}  // namespace yolo8
