#include "trainer/cli/cli.h"

#include <algorithm>

#include "trainer/cli/settings.h"

namespace yolo8 {
namespace {

const ModeWord* find_mode(const std::vector<ModeWord>& modes, const std::string& name) {
  for (const auto& mode : modes) {
    if (name == mode.name) return &mode;
  }
  return nullptr;
}

// "train, val, predict, export, info, profile, data"
std::string mode_list(const std::vector<ModeWord>& modes) {
  std::string list;
  for (const auto& mode : modes) list += (list.empty() ? "" : ", ") + mode.name;
  return list;
}

bool looks_like_flag(const std::string& word) { return word.size() > 2 && word.rfind("--", 0) == 0; }

// Ultralytics' task words; `yolo8 detect train ...` is `yolo8 train ...`, the others have no model here.
bool is_task_word(const std::string& word) {
  return word == "detect" || word == "segment" || word == "classify" || word == "pose" || word == "obb";
}

void refuse_other_task(const std::string& word) {
  if (word != "detect") {
    throw SettingsError("task '" + word + "' is not supported: yolo8 only does detect (yolo8 detect train ... or " +
                        "yolo8 train ...)");
  }
}

bool is_bool_setting(const std::string& key) {
  for (const auto& info : setting_infos()) {
    if (info.name == key) return info.type == SettingType::kBool;
  }
  return false;
}

std::string normalise_key(std::string key) {
  std::replace(key.begin(), key.end(), '-', '_');
  return key;
}

}  // namespace

CommandLine parse_command_line(const std::vector<std::string>& args, const std::vector<ModeWord>& modes) {
  CommandLine command;
  command.args = args;
  if (args.empty()) {
    command.mode = "help";
    return command;
  }
  size_t index = 0;
  if (is_task_word(args[0])) {
    refuse_other_task(args[0]);
    if (args.size() == 1) throw SettingsError("a mode must follow the task: yolo8 detect train|val|predict|export ...");
    index = 1;
  }
  const std::string& first = args[index];
  if (first == "--version" || first == "-V" || first == "version") {
    command.mode = "version";
    return command;
  }
  if (first == "help" || first == "--help" || first == "-h") {
    command.mode = "help";
    if (index + 1 < args.size()) command.action = args[index + 1];
    for (size_t rest = index + 2; rest < args.size(); ++rest) command.markdown |= args[rest] == "--markdown";
    return command;
  }
  const ModeWord* mode = find_mode(modes, first);
  if (mode == nullptr) {
    if (first.find('=') != std::string::npos || looks_like_flag(first)) {
      throw SettingsError("the first word must be a mode (" + mode_list(modes) + "); got '" + first + "'");
    }
    throw SettingsError("unknown mode '" + first + "'; modes are " + mode_list(modes));
  }
  command.mode = first;
  ++index;
  if (mode->takes_action && index < args.size() && args[index].find('=') == std::string::npos &&
      !looks_like_flag(args[index]) && args[index] != "-h") {
    command.action = args[index++];
  }
  for (; index < args.size(); ++index) {
    const std::string& word = args[index];
    if (word == "--help" || word == "-h" || word == "help") {
      command.help = true;
      continue;
    }
    std::string body = looks_like_flag(word) ? word.substr(2) : word;
    const auto equals = body.find('=');
    if (equals != std::string::npos) {
      if (equals == 0) throw SettingsError("missing setting name before '=' in '" + word + "'");
      command.pairs.emplace_back(normalise_key(body.substr(0, equals)), body.substr(equals + 1));
      continue;
    }
    if (!looks_like_flag(word)) {
      if (is_task_word(word)) {
        refuse_other_task(word);
        continue;  // `yolo8 train detect ...`, as the reference reads the task word anywhere
      }
      // A bare boolean switches it on, as in `yolo8 predict ... save_txt`.
      const std::string key = normalise_key(word);
      if (is_bool_setting(key)) {
        command.pairs.emplace_back(key, "true");
        continue;
      }
      bool known = false;
      for (const auto& info : setting_infos()) known |= info.name == key;
      if (known) throw SettingsError("setting '" + key + "' needs a value: " + key + "=VALUE");
      std::string message = "expected key=value, --key value or a boolean setting, got '" + word + "'";
      const auto suggestions = closest_setting_names(key);
      for (size_t i = 0; i < suggestions.size(); ++i) {
        message += (i == 0 ? "; did you mean " : (i + 1 == suggestions.size() ? " or " : ", ")) +
                   ("'" + suggestions[i] + "'") + (i + 1 == suggestions.size() ? "?" : "");
      }
      throw SettingsError(message);
    }
    const std::string key = normalise_key(body);
    const bool has_next =
        index + 1 < args.size() && !looks_like_flag(args[index + 1]) && args[index + 1].find('=') == std::string::npos;
    if (!has_next) {
      // A bare --flag switches a boolean on.
      if (!is_bool_setting(key)) throw SettingsError("setting '" + key + "' needs a value: --" + key + " VALUE");
      command.pairs.emplace_back(key, "true");
    } else if (is_bool_setting(key)) {
      const std::string& next = args[index + 1];
      const bool next_is_bool =
          next == "true" || next == "false" || next == "True" || next == "False" || next == "0" || next == "1";
      command.pairs.emplace_back(key, next_is_bool ? next : "true");
      if (next_is_bool) ++index;
    } else {
      command.pairs.emplace_back(key, args[++index]);
    }
  }
  return command;
}

}  // namespace yolo8
