#pragma once
// Weights I/O with Ultralytics parameter names: Ultralytics `.pt` checkpoints (read natively),
// plain state-dict files, export for Python's torch.load, and the one-stop load_model().
#include <torch/torch.h>
#include <yaml-cpp/yaml.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "models/yolo.h"

namespace yolo8 {

using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

// Parameters and persistent buffers in PyTorch's state_dict order ("model.0.conv.weight", ...).
NamedTensors state_dict(const torch::nn::Module& module);

// Copies tensors into the module by name; every name must match both ways with equal shapes.
// Floating tensors are cast to the parameter's dtype. `source` names the file in errors.
void load_state_dict(torch::nn::Module& module, const std::map<std::string, torch::Tensor>& tensors,
                     const std::string& source);

// What an Ultralytics checkpoint carries, read without Python.
struct UltralyticsCheckpoint {
  std::map<std::string, torch::Tensor> weights;  // fp16 already turned into fp32
  YAML::Node yaml;                               // architecture dict (nc, scales, backbone, head, ...)
  int64_t nc = 0;
  std::vector<std::string> names;
  std::string model_class;  // e.g. "DetectionModel"
  bool from_ema = false;
};

// Reads an Ultralytics `.pt` (zip + pickle). Throws std::runtime_error with a one-line message naming
// `source` for a non-detection model, a truncated or corrupt archive or any other file.
UltralyticsCheckpoint read_ultralytics_checkpoint(const std::string& path);
UltralyticsCheckpoint read_ultralytics_checkpoint_bytes(const std::string& bytes, const std::string& source);

struct LoadedModel {
  DetectionModel model{nullptr};
  int64_t nc = 0;
  std::vector<std::string> names;
  std::string source;  // resolved path
};

// Model from a checkpoint's contents (architecture from its yaml, then strict weight loading).
LoadedModel model_from_checkpoint(const UltralyticsCheckpoint& ckpt, const std::string& source);

// spec: a model YAML name/path ("yolov8s.yaml"; fresh weights), an Ultralytics `.pt` checkpoint,
// or a state-dict file (export_state_dict's output, or the {state_dict, nc, names, yaml_scale} dict).
// nc_override > 0 sets the class count of a YAML model; for weight files it must equal theirs.
LoadedModel load_model(const std::string& spec, int64_t nc_override = 0);

// Deep copy (same architecture, weights, buffers, fusion state, device and dtype): what an EMA needs,
// since these modules are not torch::nn::Cloneable.
DetectionModel copy_model(const DetectionModel& model);

// Writes {name: tensor} with Ultralytics names (fp32, CPU) via torch::pickle_save; Python's torch.load
// reads it. Returns the number of tensors written.
size_t export_state_dict(const DetectionModel& model, const std::string& path);

// Reads a file written by export_state_dict (or any pickled str->tensor dict).
std::map<std::string, torch::Tensor> read_state_dict_file(const std::string& path);

}  // namespace yolo8
