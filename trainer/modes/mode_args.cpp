#include "trainer/modes/mode_args.h"

#include <algorithm>
#include <filesystem>
#include <iostream>
#include <set>

namespace yolo8 {
namespace {

// val and predict use what the weights were trained with unless the user set it, as the reference does with a
// checkpoint's train_args: val takes data, imgsz and single_cls, predict imgsz.
void adopt_training_arguments(Settings& settings, const SettingPairs& pairs) {
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

std::map<std::string, std::string> take_keys(SettingPairs& pairs, const std::vector<std::string>& keys) {
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

LoadedModel load_model_for_cli(const std::string& spec) {
  try {
    return load_any_model(spec);
  } catch (const SettingsError&) {
    throw;
  } catch (const std::exception& error) {
    throw DataError(error.what());
  }
}

Settings settings_for_mode(const SettingPairs& pairs, const std::string& mode) {
  Settings settings = resolve_settings(pairs, mode);
  warn_of_secrets_on_the_command_line(pairs);
  if (settings.mode == "val" || settings.mode == "predict") adopt_training_arguments(settings, pairs);
  return settings;
}

}  // namespace yolo8
