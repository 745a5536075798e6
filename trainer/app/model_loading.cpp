#include "trainer/app/model_loading.h"

#include <nlohmann/json.hpp>
#include <yaml-cpp/yaml.h>

#include <filesystem>
#include <iostream>

#include "trainer/app/run_dir.h"
#include "trainer/core/checkpoint.h"
#include "trainer/core/ema.h"

namespace yolo8 {
namespace fs = std::filesystem;

namespace app {

std::string encode_meta(const CheckpointMeta& meta) {
  nlohmann::json json;
  json["settings"] = meta.settings_yaml;
  json["model_yaml"] = meta.model_yaml;
  json["names"] = meta.names;
  json["run_dir"] = meta.run_dir;
  return json.dump();
}

CheckpointMeta decode_meta(const std::string& text, const std::string& path) {
  try {
    const nlohmann::json json = nlohmann::json::parse(text);
    return {json.at("settings").get<std::string>(), json.at("model_yaml").get<std::string>(),
            json.at("names").get<std::vector<std::string>>(), json.value("run_dir", std::string())};
  } catch (const std::exception& error) {
    throw DataError(path + ": not a yolo8 training checkpoint (" + error.what() + ")");
  }
}

DetectionModel model_from_meta(const CheckpointMeta& meta, const std::string& source, int64_t nc_override) {
  return build_model(YAML::Load(meta.model_yaml), source, "", nc_override);
}

// Copies every tensor whose name and shape match; returns how many.
size_t transfer_matching(torch::nn::Module& module, const std::map<std::string, torch::Tensor>& source) {
  torch::NoGradGuard no_grad;
  size_t copied = 0;
  for (auto& [name, tensor] : state_dict(module)) {
    const auto found = source.find(name);
    if (found == source.end() || !found->second.sizes().equals(tensor.sizes())) continue;
    tensor.copy_(found->second.to(tensor.dtype()));
    ++copied;
  }
  return copied;
}

std::map<std::string, torch::Tensor> as_map(const NamedTensors& tensors) {
  return std::map<std::string, torch::Tensor>(tensors.begin(), tensors.end());
}

}  // namespace app

using app::as_input_error;
using app::CheckpointMeta;
using app::decode_meta;
using app::model_from_meta;

bool is_training_checkpoint(const std::string& path) {
  if (fs::path(path).extension() != ".pt" || !fs::is_regular_file(path)) return false;
  return checkpoint_readable(path);
}

LoadedModel load_any_model(const std::string& spec, int64_t nc_override) {
  if (!is_training_checkpoint(spec)) return as_input_error([&] { return load_model(spec, nc_override); });
  const CheckpointState state = load_checkpoint(spec);
  const CheckpointMeta meta = decode_meta(state.settings_text, spec);
  DetectionModel model = model_from_meta(meta, spec);
  DetectionModel ema_model = model_from_meta(meta, spec);
  ModelEma ema(ema_model.ptr(), *model);
  CheckpointTargets targets;
  targets.model = model.ptr().get();
  targets.ema = &ema;
  targets.load_grads = false;
  load_checkpoint(spec, targets);
  LoadedModel loaded;
  loaded.model = ema_model;  // the EMA weights are the ones a run validates and ships
  loaded.model->eval();
  loaded.nc = ema_model->nc();
  loaded.names = meta.names;
  loaded.source = spec;
  if (nc_override > 0 && nc_override != loaded.nc) {
    throw DataError(spec + ": weights have " + std::to_string(loaded.nc) + " classes, the data " +
                    std::to_string(nc_override));
  }
  return loaded;
}

std::string resolve_resume_checkpoint(const Settings& settings) {
  const std::string& resume = settings.resume;
  if (resume == "false") return "";
  if (resume == "auto") {
    const fs::path candidate = fs::path(settings.project) / "train" /
                               (settings.name.empty() ? std::string("train") : settings.name) / "weights" / "last.pt";
    std::string error;
    if (fs::exists(candidate) && checkpoint_readable(candidate.string(), &error)) return candidate.string();
    if (fs::exists(candidate))
      std::cout << "resume=auto: " << candidate.string() << " is not resumable (" << error << "); starting fresh\n";
    return "";
  }
  const std::string path = resume == "true" ? latest_last_checkpoint(settings.project, "train").string() : resume;
  if (path.empty()) throw SettingsError("resume=true but no " + settings.project + "/train/*/weights/last.pt exists");
  std::string error;
  if (!checkpoint_readable(path, &error)) throw DataError("cannot resume from " + path + ": " + error);
  return path;
}

}  // namespace yolo8
