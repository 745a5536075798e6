#include "trainer/app/cli.h"

#include <algorithm>
#include <iostream>
#include <map>
#include <sstream>

#include "trainer/app/commands.h"
#include "trainer/app/settings.h"
#include "trainer/core/exit_codes.h"

#ifndef YOLO8_VERSION
#define YOLO8_VERSION "dev"
#endif

namespace yolo8 {
namespace {

struct ModeInfo {
  const char* name;
  const char* summary;
  const char* example;
  std::vector<std::string> keys;  // the settings most relevant to the mode
};

const std::vector<ModeInfo>& modes() {
  static const std::vector<ModeInfo> kModes = {
      {"train",
       "train a detector (asks the quota service for a GPU lease first)",
       "yolo8 train data=d.yaml model=yolov8s.yaml epochs=100 batch=16 device=0 name=defect-v3",
       {"data", "model", "epochs", "batch", "imgsz", "device", "workers", "name", "resume", "pretrained", "optimizer",
        "lr0", "patience", "quota", "team", "priority", "gpu_mem"}},
      {"val",
       "validate weights on a dataset split and print the metrics table",
       "yolo8 val model=runs/train/exp/weights/best.pt data=d.yaml",
       {"model", "data", "split", "imgsz", "batch", "conf", "iou", "max_det", "save_json", "plots"}},
      {"predict",
       "detect objects in an image or a folder; saves annotated images and YOLO txt",
       "yolo8 predict model=best.pt source=images/ conf=0.25",
       {"model", "source", "imgsz", "conf", "iou", "max_det", "classes", "save_txt", "save_conf", "line_width"}},
      {"export",
       "write the weights in another format",
       "yolo8 export model=best.pt format=state_dict out=best_state_dict.pt",
       {"model", "format", "out"}},
      {"info",
       "print a model's layers, parameters and GFLOPs at 640",
       "yolo8 info model=yolov8m.yaml",
       {"model", "imgsz"}},
      {"profile",
       "measure peak memory and speed of training steps on synthetic batches; variants=n,s,m,l,x profiles "
       "several models; batch=auto gpu_mem=G shows the batch each one gets under a G GiB budget",
       "yolo8 profile model=yolov8s.yaml imgsz=640 batch=1,2,4,8,16",
       {"model", "imgsz", "batch", "device", "gpu_mem"}},
      {"data",
       "dataset tools: `data check data=d.yaml`, `data synth out=DIR train=N val=M imgsz=S seed=K`",
       "yolo8 data check data=datasets/defects/data.yaml",
       {"data", "imgsz", "seed", "out", "workers"}},
  };
  return kModes;
}

const ModeInfo* find_mode(const std::string& name) {
  for (const auto& mode : modes()) {
    if (name == mode.name) return &mode;
  }
  return nullptr;
}

bool looks_like_flag(const std::string& word) { return word.size() > 2 && word.rfind("--", 0) == 0; }

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

CommandLine parse_command_line(const std::vector<std::string>& args) {
  CommandLine command;
  command.args = args;
  if (args.empty()) {
    command.mode = "help";
    return command;
  }
  const std::string& first = args[0];
  if (first == "--version" || first == "-V" || first == "version") {
    command.mode = "version";
    return command;
  }
  if (first == "help" || first == "--help" || first == "-h") {
    command.mode = "help";
    if (args.size() > 1) command.action = args[1];
    return command;
  }
  if (find_mode(first) == nullptr) {
    if (first.find('=') != std::string::npos || looks_like_flag(first)) {
      throw SettingsError("the first word must be a mode (train, val, predict, export, info, profile, data); got '" +
                          first + "'");
    }
    throw SettingsError("unknown mode '" + first + "'; modes are train, val, predict, export, info, profile, data");
  }
  command.mode = first;
  size_t index = 1;
  if (command.mode == "data" && index < args.size() && args[index].find('=') == std::string::npos &&
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
      throw SettingsError("expected key=value or --key value, got '" + word + "'");
    }
    const std::string key = normalise_key(body);
    const bool has_next =
        index + 1 < args.size() && !looks_like_flag(args[index + 1]) && args[index + 1].find('=') == std::string::npos;
    if (!has_next) {
      // A bare --flag switches a boolean on.
      if (!is_bool_setting(key)) throw SettingsError("setting '" + key + "' needs a value: --" + key + " VALUE");
      command.pairs.emplace_back(key, "true");
    } else if (is_bool_setting(key)) {
      const std::string next = args[index + 1];
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

std::string usage_text(const std::string& mode_name) {
  std::ostringstream out;
  if (const ModeInfo* mode = find_mode(mode_name)) {
    out << "yolo8 " << mode->name << ": " << mode->summary << "\n\n  e.g. " << mode->example << "\n\n"
        << "Main settings (key=value or --key value; every setting works, see `yolo8 help settings`):\n";
    const Settings defaults;
    for (const auto& key : mode->keys) {
      for (const auto& info : setting_infos()) {
        if (info.name != key) continue;
        std::string value = get_setting(defaults, key);
        out << "  " << key << std::string(key.size() < 16 ? 16 - key.size() : 1, ' ') << (value.empty() ? "-" : value)
            << std::string(value.size() < 14 ? 14 - value.size() : 1, ' ') << info.help << "\n";
      }
    }
    return out.str();
  }
  if (mode_name == "settings") {
    const Settings defaults;
    out << "Every setting, its default and meaning (configs/default.yaml lists the same):\n";
    for (const auto& info : setting_infos()) {
      const std::string value = get_setting(defaults, info.name);
      out << "  " << info.name << std::string(info.name.size() < 16 ? 16 - info.name.size() : 1, ' ')
          << (value.empty() ? "-" : value) << std::string(value.size() < 14 ? 14 - value.size() : 1, ' ') << info.help
          << "\n";
    }
    return out.str();
  }
  out << "yolo8 " << YOLO8_VERSION << " - YOLOv8 training in C++ that shares GPUs fairly\n\n"
      << "Usage: yolo8 MODE key=value ...   (--key value works too)\n\nModes:\n";
  for (const auto& mode : modes()) {
    out << "  " << mode.name << std::string(9 - std::string(mode.name).size(), ' ') << mode.summary << "\n";
  }
  out << "\nExamples:\n";
  for (const auto& mode : modes()) out << "  " << mode.example << "\n";
  out << "\nSettings: defaults < cfg=FILE.yaml < command line. `yolo8 help settings` lists them all,\n"
      << "`yolo8 MODE --help` the main ones of a mode.\n"
      << "Exit codes: 0 completed, 75 preempted (resume continues), 2 bad settings or data, 1 other failure.\n";
  return out.str();
}

int run_command_line(const std::vector<std::string>& args) {
  const CommandLine command = parse_command_line(args);
  if (command.mode == "version") {
    std::cout << "yolo8 " << YOLO8_VERSION << "\n";
    return kExitCompleted;
  }
  if (command.mode == "help") {
    std::cout << usage_text(command.action);
    return kExitCompleted;
  }
  if (command.help) {
    std::cout << usage_text(command.mode);
    return kExitCompleted;
  }
  return run_mode(command);
}

}  // namespace yolo8
