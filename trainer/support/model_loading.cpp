#include "trainer/support/model_loading.h"

#include <caffe2/serialize/inline_container.h>

#include <nlohmann/json.hpp>
#include <yaml-cpp/yaml.h>

#include <filesystem>
#include <iostream>
#include <sstream>
#include <system_error>

#include "models/pickle_reader.h"
#include "trainer/core/checkpoint.h"
#include "trainer/core/ema.h"
#include "trainer/core/memory_meter.h"
#include "trainer/runtime/run_dir.h"

namespace yolo8 {
namespace fs = std::filesystem;

namespace app {

bool is_input_failure(const std::exception& error) {
  if (dynamic_cast<const std::bad_alloc*>(&error) || dynamic_cast<const std::system_error*>(&error)) return false;
  // cuBLAS's and cuDNN's allocation failures come as plain c10::Errors: memory, not the input.
  if (is_out_of_memory(error)) return false;
  if (dynamic_cast<const c10::OutOfMemoryError*>(&error) || dynamic_cast<const c10::AcceleratorError*>(&error)) {
    return false;
  }
  // A CUDA failure that LibTorch reports as a plain c10::Error.
  if (dynamic_cast<const c10::Error*>(&error) && std::string(error.what()).find("CUDA error") != std::string::npos) {
    return false;
  }
  if (dynamic_cast<const std::logic_error*>(&error)) {
    return dynamic_cast<const std::invalid_argument*>(&error) || dynamic_cast<const std::out_of_range*>(&error) ||
           dynamic_cast<const std::domain_error*>(&error) || dynamic_cast<const std::length_error*>(&error);
  }
  // Parse and format errors: std::runtime_error (YAML, JSON, our readers), a c10::Error of a malformed archive.
  return true;
}

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

std::string ultralytics_train_args_yaml(const CheckpointMeta& meta) {
  return meta.ultralytics_args_yaml.empty() ? meta.settings_yaml : meta.ultralytics_args_yaml;
}

UltralyticsView ultralytics_view(const CheckpointMeta& meta) {
  return {meta.model_yaml, meta.names, ultralytics_train_args_yaml(meta)};
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

void prepare_for_inference(DetectionModel& model, const torch::Device& device) {
  model->to(device);
  model->eval();
  model->fuse();
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
  const fs::path project = project_dir(settings.project, settings.task);
  if (resume == "auto") {
    const fs::path candidate =
        project / (settings.name.empty() ? std::string("train") : settings.name) / "weights" / "last.pt";
    std::string error;
    if (fs::exists(candidate) && checkpoint_readable(candidate.string(), &error)) return candidate.string();
    if (fs::exists(candidate))
      std::cout << "resume=auto: " << candidate.string() << " is not resumable (" << error << "); starting fresh\n";
    return "";
  }
  std::string path = resume == "true" ? latest_last_checkpoint(project).string() : resume;
  if (path.empty()) {
    throw SettingsError("resume=true found no */weights/last.pt in " + project.string() +
                        " (set project= to the folder holding the run, or resume=PATH/last.pt)");
  }
  std::string error;
  if (!checkpoint_readable(path, &error)) throw DataError("cannot resume from " + path + ": " + error);
  return path;
}

namespace {

// A pickled scalar or list as setting text (lists as a,b,c); false when it is neither.
bool pickle_value_text(const pickle::Value& value, std::string& text) {
  switch (value.kind) {
    case pickle::Kind::kNone: text = "null"; return true;
    case pickle::Kind::kBool: text = value.b ? "true" : "false"; return true;
    case pickle::Kind::kInt: text = std::to_string(value.i); return true;
    case pickle::Kind::kFloat: {
      std::ostringstream out;
      out << value.f;
      text = out.str();
      return true;
    }
    case pickle::Kind::kString: text = value.s; return true;
    case pickle::Kind::kList:
    case pickle::Kind::kTuple:
      text.clear();
      for (const auto& item : value.items) {
        std::string element;
        if (!item || !pickle_value_text(*item, element)) return false;
        text += (text.empty() ? "" : ",") + element;
      }
      return true;
    default: return false;
  }
}

// An Ultralytics `.pt`'s train_args dict; tensors are not read (only their sizes are needed to unpickle).
std::map<std::string, std::string> ultralytics_train_args(const std::string& path) {
  caffe2::serialize::PyTorchStreamReader zip(path);
  auto [pkl_data, pkl_size] = zip.getRecord("data.pkl");
  const std::string pkl(static_cast<const char*>(pkl_data.get()), pkl_size);
  const pickle::StorageLoader no_storage = [](const std::string&, c10::ScalarType dtype, int64_t numel) {
    return torch::empty({numel}, torch::TensorOptions().dtype(dtype));
  };
  const pickle::ValuePtr root = pickle::unpickle(pkl, no_storage);
  std::map<std::string, std::string> arguments;
  const pickle::Value* train_args = root ? root->get("train_args") : nullptr;
  if (train_args == nullptr || train_args->kind != pickle::Kind::kDict) return arguments;
  for (const auto& [key, value] : train_args->dict) {
    std::string text;
    if (key && key->kind == pickle::Kind::kString && value && pickle_value_text(*value, text)) arguments[key->s] = text;
  }
  return arguments;
}

}  // namespace

std::map<std::string, std::string> training_arguments(const std::string& path) {
  if (fs::path(path).extension() != ".pt" || !fs::is_regular_file(path)) return {};
  if (is_training_checkpoint(path)) {
    const CheckpointMeta meta = decode_meta(load_checkpoint(path).settings_text, path);
    std::map<std::string, std::string> arguments;
    try {
      const YAML::Node root = YAML::Load(meta.settings_yaml);
      for (const auto& item : root) {
        if (item.second.IsScalar()) arguments[item.first.as<std::string>()] = item.second.as<std::string>();
        if (item.second.IsNull()) arguments[item.first.as<std::string>()] = "null";
      }
    } catch (const YAML::Exception& error) {
      throw DataError(path + ": unreadable training settings (" + error.what() + ")");
    }
    return arguments;
  }
  try {
    return ultralytics_train_args(path);
  } catch (const std::exception&) {
    return {};  // a state-dict file or anything else without training arguments
  }
}

}  // namespace yolo8
