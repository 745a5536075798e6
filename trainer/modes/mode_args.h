#pragma once
// What the modes share in reading their command: keys only one mode reads, and the settings of a mode that runs a
// model (val and predict take what the weights were trained with unless the user set it).

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "trainer/cli/settings.h"
#include "trainer/support/model_loading.h"

namespace yolo8 {

using SettingPairs = std::vector<std::pair<std::string, std::string>>;

// Keys only one mode reads (`data synth train=N val=M`), taken out before the settings are resolved.
std::map<std::string, std::string> take_keys(SettingPairs& pairs, const std::vector<std::string>& keys);

// A count key taken by take_keys: `fallback` when absent; throws SettingsError naming the key when < 0.
int parse_count(const std::map<std::string, std::string>& keys, const std::string& key, int fallback);

// The settings of train, val, predict, export and info: resolved, a secret on the command line warned of, and for
// val and predict the training run's arguments adopted where the user gave none.
Settings settings_for_mode(const SettingPairs& pairs, const std::string& mode);

// Any weights or YAML; a file the models library cannot read is the user's to fix (exit 2).
LoadedModel load_model_for_cli(const std::string& spec);

}  // namespace yolo8
