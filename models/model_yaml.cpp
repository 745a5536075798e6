#include "models/model_yaml.h"

#include <cstdlib>
#include <filesystem>
#include <regex>
#include <stdexcept>

#include "models/model_paths.h"

namespace yolo8 {
namespace fs = std::filesystem;

namespace {

std::string where(const std::string& source, const YAML::Node& node) {
  const auto mark = node.Mark();
  if (mark.line >= 0) return source + ":" + std::to_string(mark.line + 1);
  return source;
}

[[noreturn]] void fail(const std::string& source, const YAML::Node& node, const std::string& msg) {
  throw std::runtime_error("model config " + where(source, node) + ": " + msg);
}

int64_t as_int(const std::string& source, const YAML::Node& node, const std::string& key) {
  try {
    return node.as<int64_t>();
  } catch (const YAML::Exception&) {
    fail(source, node, "'" + key + "' must be an integer");
  }
}

double as_double(const std::string& source, const YAML::Node& node, const std::string& key) {
  try {
    return node.as<double>();
  } catch (const YAML::Exception&) {
    fail(source, node, "'" + key + "' must be a number");
  }
}

}  // namespace

std::string models_config_dir() {
  if (const char* env = std::getenv("YOLO8_MODELS_DIR"); env && *env) return env;
  if (fs::is_directory("configs/models")) return "configs/models";
  return std::string(kModelsSourceConfigDir);
}

std::string guess_model_scale(const std::string& name) {
  static const std::regex re(R"(yolov\d+([nslmx]))");
  std::smatch m;
  const std::string stem = fs::path(name).stem().string();
  if (std::regex_search(stem, m, re)) return m[1].str();
  return "";
}

std::string resolve_model_yaml(const std::string& spec) {
  if (spec.empty()) throw std::invalid_argument("model: empty model name");
  fs::path p(spec);
  if (p.extension() != ".yaml" && p.extension() != ".yml") p += ".yaml";
  // yolov8m-p2.yaml -> yolov8-p2.yaml: the scale letter selects from the shared file.
  static const std::regex unify(R"((\d+)([nslmx])(.+)?$)");
  const fs::path unified =
      p.parent_path() / (std::regex_replace(p.stem().string(), unify, "$1$3") + p.extension().string());
  std::vector<fs::path> candidates{p, unified};
  if (!p.has_parent_path()) {
    const fs::path dir = models_config_dir();
    candidates.push_back(dir / p);
    candidates.push_back(dir / unified);
  }
  for (const auto& c : candidates) {
    std::error_code ec;
    if (fs::is_regular_file(c, ec)) return c.string();
  }
  throw std::runtime_error("model: cannot find model YAML '" + spec + "' (looked for " + unified.filename().string() +
                           " here and in " + models_config_dir() + ")");
}

ModelConfig parse_model_config(const YAML::Node& root, const std::string& source, const std::string& scale,
                               int64_t nc_override) {
  ModelConfig cfg;
  cfg.source = source;
  if (!root || !root.IsMap()) fail(source, root, "top level must be a mapping");
  cfg.yaml = YAML::Clone(root);

  if (root["nc"]) cfg.nc = as_int(source, root["nc"], "nc");
  if (nc_override > 0) cfg.nc = nc_override;
  if (cfg.nc <= 0) fail(source, root["nc"], "'nc' must be positive");
  cfg.yaml["nc"] = cfg.nc;
  if (root["ch"]) cfg.ch = as_int(source, root["ch"], "ch");
  if (cfg.ch <= 0) fail(source, root["ch"], "'ch' must be positive");

  if (const auto scales = root["scales"]) {
    if (!scales.IsMap() || scales.size() == 0) fail(source, scales, "'scales' must be a non-empty mapping");
    std::string chosen = scale;
    if (chosen.empty() && root["scale"] && root["scale"].IsScalar()) chosen = root["scale"].as<std::string>();
    if (chosen.empty()) chosen = scales.begin()->first.as<std::string>();
    const auto row = scales[chosen];
    if (!row) fail(source, scales, "scale '" + chosen + "' is not one of the 'scales' keys");
    if (!row.IsSequence() || row.size() != 3)
      fail(source, row, "scales." + chosen + " must be [depth, width, max_channels]");
    cfg.scale = chosen;
    cfg.depth = as_double(source, row[0], "scales." + chosen + "[0]");
    cfg.width = as_double(source, row[1], "scales." + chosen + "[1]");
    cfg.max_channels = as_int(source, row[2], "scales." + chosen + "[2]");
    cfg.yaml["scale"] = chosen;
  } else {
    if (root["depth_multiple"]) cfg.depth = as_double(source, root["depth_multiple"], "depth_multiple");
    if (root["width_multiple"]) cfg.width = as_double(source, root["width_multiple"], "width_multiple");
  }
  if (!(cfg.depth > 0) || !(cfg.width > 0) || cfg.max_channels <= 0) {
    fail(source, root, "depth, width and max_channels must be positive");
  }

  for (const char* part : {"backbone", "head"}) {
    const auto list = root[part];
    if (!list) fail(source, root, std::string("missing '") + part + "'");
    if (!list.IsSequence()) fail(source, list, std::string("'") + part + "' must be a list");
    for (const auto& row : list) {
      const std::string key = std::string(part) + "[" + std::to_string(cfg.layers.size()) + "]";
      if (!row.IsSequence() || row.size() != 4) fail(source, row, key + " must be [from, repeats, module, args]");
      LayerSpec l;
      l.line = row.Mark().line >= 0 ? row.Mark().line + 1 : 0;
      if (row[0].IsSequence()) {
        for (const auto& f : row[0]) l.from.push_back(as_int(source, f, key + ".from"));
        if (l.from.empty()) fail(source, row[0], key + ": empty 'from' list");
      } else {
        l.from.push_back(as_int(source, row[0], key + ".from"));
      }
      l.repeats = as_int(source, row[1], key + ".repeats");
      if (l.repeats < 1) fail(source, row[1], key + ": repeats must be >= 1");
      if (!row[2].IsScalar()) fail(source, row[2], key + ": module must be a name");
      l.module = row[2].as<std::string>();
      l.args = row[3];
      if (!l.args.IsSequence()) fail(source, row[3], key + ": args must be a list");
      const auto idx = static_cast<int64_t>(cfg.layers.size());
      for (int64_t f : l.from) {
        const int64_t abs = f < 0 ? idx + f : f;
        if (abs < 0 || abs >= idx) {
          if (!(idx == 0 && f == -1))
            fail(source, row[0], key + ": 'from' " + std::to_string(f) + " points to no earlier layer");
        }
      }
      cfg.layers.push_back(std::move(l));
    }
  }
  if (cfg.layers.empty()) fail(source, root, "no layers");
  return cfg;
}

ModelConfig load_model_config(const std::string& spec, int64_t nc_override) {
  const std::string path = resolve_model_yaml(spec);
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const YAML::Exception& e) {
    throw std::runtime_error("model config " + path + ": " + e.what());
  }
  return parse_model_config(root, path, guess_model_scale(spec), nc_override);
}

}  // namespace yolo8
