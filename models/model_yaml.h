#pragma once
// Ultralytics-format model YAML: name resolution, scale selection and validation.
#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <string>
#include <vector>

namespace yolo8 {

// One `[from, repeats, module, args]` row.
struct LayerSpec {
  std::vector<int64_t> from;  // -1 = previous layer; negative values count back from this layer
  int64_t repeats = 1;        // as written, before depth scaling
  std::string module;
  YAML::Node args;  // sequence
  int line = 0;     // 1-based line in the source, 0 when unknown
};

struct ModelConfig {
  std::string source = "<memory>";  // file path or description, for error messages
  int64_t nc = 80;
  int64_t ch = 3;     // input channels
  std::string scale;  // empty when the YAML has no scales
  double depth = 1.0;
  double width = 1.0;
  int64_t max_channels = 1 << 30;
  std::vector<LayerSpec> layers;  // backbone then head
  YAML::Node yaml;                // the document, scale and nc filled in
};

// Directory with the bundled model YAMLs (env YOLO8_MODELS_DIR overrides).
std::string models_config_dir();

// Scale letter in a name such as "yolov8m.yaml" or "yolov8s-p2" ("" when none).
std::string guess_model_scale(const std::string& name);

// Resolves "yolov8m.yaml", "yolov8-p2.yaml", "path/to/x.yaml" to an existing file path; throws when none.
std::string resolve_model_yaml(const std::string& spec);

// Validates a parsed document. scale: wanted letter ("" = the document's `scale` key or its first scale);
// nc_override > 0 replaces the document's nc.
ModelConfig parse_model_config(const YAML::Node& root, const std::string& source, const std::string& scale = "",
                               int64_t nc_override = 0);

// resolve_model_yaml + load + parse_model_config, the scale taken from the spec's name.
ModelConfig load_model_config(const std::string& spec, int64_t nc_override = 0);

}  // namespace yolo8
