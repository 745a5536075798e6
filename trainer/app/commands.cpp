#include "trainer/app/commands.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <map>
#include <set>
#include <sstream>

#include "models/model_info.h"
#include "models/weights.h"
#include "trainer/app/auto_batch_profile.h"
#include "trainer/app/export_mode.h"
#include "trainer/app/launcher.h"
#include "trainer/app/model_loading.h"
#include "trainer/app/modes.h"
#include "trainer/app/profile_mode.h"
#include "trainer/app/settings.h"
#include "trainer/core/distributed.h"
#include "trainer/core/exit_codes.h"

namespace yolo8 {
namespace {

// Keys only one mode reads (`data synth train=N val=M`), taken out before the settings are resolved.
std::map<std::string, std::string> take_keys(std::vector<std::pair<std::string, std::string>>& pairs,
                                             const std::vector<std::string>& keys) {
  std::map<std::string, std::string> taken;
  std::vector<std::pair<std::string, std::string>> rest;
  for (auto& pair : pairs) {
    if (std::find(keys.begin(), keys.end(), pair.first) != keys.end()) {
      taken[pair.first] = pair.second;
    } else {
      rest.push_back(pair);
    }
  }
  pairs = rest;
  return taken;
}

int parse_count(const std::map<std::string, std::string>& keys, const std::string& key, int fallback) {
  const auto found = keys.find(key);
  if (found == keys.end()) return fallback;
  const int count = parse_int_setting(key, found->second);
  if (count < 0) throw SettingsError("setting '" + key + "' must be >= 0");
  return count;
}

// Any weights or YAML; a file the models library cannot read is the user's to fix (exit 2).
LoadedModel load_model_for_cli(const std::string& spec) {
  try {
    return load_any_model(spec);
  } catch (const SettingsError&) {
    throw;
  } catch (const std::exception& error) {
    throw DataError(error.what());
  }
}

// val and predict use what the weights were trained with unless the user set it, as the reference does with a
// checkpoint's train_args: val takes data, imgsz and single_cls, predict imgsz.
void adopt_training_arguments(Settings& settings, const std::vector<std::pair<std::string, std::string>>& pairs) {
  const std::vector<std::string> keys = settings.mode == "val" ? std::vector<std::string>{"data", "imgsz", "single_cls"}
                                                               : std::vector<std::string>{"imgsz"};
  const std::set<std::string> given = given_setting_keys(pairs);
  const std::map<std::string, std::string> arguments =
      app::as_input_error([&] { return training_arguments(settings.model); });
  const std::string origin = settings.model + " (training arguments)";
  std::string adopted;
  bool data_adopted = false;
  for (const std::string& key : keys) {
    const auto found = arguments.find(key);
    if (given.count(key) || found == arguments.end() || found->second.empty() || found->second == "null") continue;
    set_setting(settings, key, found->second, origin);
    adopted += (adopted.empty() ? "" : " ") + key + "=" + found->second;
    data_adopted |= key == "data";
  }
  if (adopted.empty()) return;
  validate(settings);
  std::cout << settings.mode << ": " << adopted << " from the training run of " << settings.model << "\n";
  if (data_adopted && !std::filesystem::exists(settings.data)) {
    throw SettingsError("setting 'data' is required for val: the training run's data '" + settings.data + "' (from " +
                        settings.model + ") does not exist here; give data=PATH.yaml");
  }
}

}  // namespace

int run_mode(const CommandLine& command) {
  auto pairs = command.pairs;
  if (command.mode == "data") {
    if (command.action == "synth") {
      const auto keys = take_keys(pairs, {"train", "val"});
      Settings settings = resolve_settings(pairs, "data");
      const int imgsz = settings.loader.imgsz;
      return run_data_synth(settings.out, parse_count(keys, "train", 256), parse_count(keys, "val", 64), imgsz,
                            settings.loader.seed);
    }
    if (command.action != "check") {
      throw SettingsError("`yolo8 data` needs an action: check (data=d.yaml) or synth (out=DIR train=N val=M)");
    }
    const Settings settings = resolve_settings(pairs, "data");
    return run_data_check(settings);
  }
  if (command.mode == "profile") {
    // batch and variants are lists here: batch=1,2,4,8 variants=n,s,m.
    auto keys = take_keys(pairs, {"batch", "variants"});
    Settings settings = resolve_settings(pairs, "profile");
    const std::string batch_list = keys.count("batch") ? keys["batch"] : "1,2,4,8,16";
    // One value that batch= reads as auto (auto, -1, a fraction) sizes the batch; anything else is a list.
    bool auto_batch = false;
    if (batch_list.find(',') == std::string::npos) {
      Settings single = settings;
      set_setting(single, "batch", batch_list, "command line");
      auto_batch = parse_batch_spec(single.batch).automatic;
      if (auto_batch) settings = single;
    }
    std::vector<int> batches;
    if (!auto_batch) batches = parse_int_list_setting("batch", batch_list);
    for (int batch : batches) {
      if (batch < 1) throw SettingsError("setting 'batch' of profile must list batch sizes >= 1");
    }
    std::vector<std::string> variants;
    if (keys.count("variants")) {
      std::string list = keys["variants"];
      for (char& c : list) c = (c == ',' || c == '[' || c == ']') ? ' ' : c;
      std::istringstream words(list);
      std::string word;
      while (words >> word) variants.push_back(word.size() == 1 ? "yolov8" + word + ".yaml" : word);
    } else {
      variants.push_back(settings.model);
    }
    if (auto_batch) {
      const auto rows = run_auto_batch_profile(settings, variants);
      for (const auto& row : rows) {
        if (!row.fits || row.out_of_memory_after > 0) return kExitFailure;
      }
      return kExitCompleted;
    }
    return run_profile(settings, variants, batches);
  }
  // Export-only keys (opset, dynamic, imgsz as H,W) are read by the export mode itself.
  const auto export_keys =
      command.mode == "export" ? take_keys(pairs, {"opset", "dynamic", "imgsz"}) : std::map<std::string, std::string>{};
  Settings settings = resolve_settings(pairs, command.mode);
  warn_of_secrets_on_the_command_line(pairs);
  if (settings.mode == "val" || settings.mode == "predict") adopt_training_arguments(settings, pairs);
  if (settings.mode == "info") {
    LoadedModel loaded = load_model_for_cli(settings.model);
    const std::string name = std::filesystem::path(settings.model).stem().string();
    std::cout << format_model_info(model_info(loaded.model, settings.loader.imgsz), name);
    return kExitCompleted;
  }
  if (settings.mode == "export") return run_export(settings, export_keys);
  if (settings.mode == "train" && settings.device_ids().size() > 1 && std::getenv("RANK") == nullptr) {
    // device=0,1: one process per GPU, this one only launches and waits (signals are forwarded).
    std::cout << "Starting " << settings.device_ids().size() << " training processes (DDP)\n";
    return launch_local_workers(settings.device_ids(), command.args);
  }
  if (settings.mode == "train") return run_train(settings);
  if (settings.mode == "val") return run_val(settings);
  if (settings.mode == "predict") return run_predict(settings);
  // resolve_settings accepts only the modes above.
  throw SettingsError("unknown mode '" + settings.mode + "'");
}

}  // namespace yolo8
