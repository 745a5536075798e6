#include "trainer/app/cli.h"

#include <algorithm>
#include <iostream>
#include <map>
#include <sstream>

#include "trainer/app/build_info.h"
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
       "yolo8 val model=runs/detect/train/weights/best.pt   (data, imgsz, single_cls: the training run's unless given)",
       {"model", "data", "split", "imgsz", "batch", "conf", "iou", "max_det", "save_json", "plots"}},
      {"predict",
       "detect objects in an image or a folder; saves annotated images (and YOLO txt with save_txt)",
       "yolo8 predict model=best.pt source=images/ conf=0.25 imgsz=640,480 save_txt",
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

CommandLine parse_command_line(const std::vector<std::string>& args) {
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
  ++index;
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
      << "Usage: yolo8 [detect] MODE key=value ...   (--key value works too; a bare boolean like save_txt means "
         "save_txt=true)\n\nModes:\n";
  for (const auto& mode : modes()) {
    out << "  " << mode.name << std::string(9 - std::string(mode.name).size(), ' ') << mode.summary << "\n";
  }
  out << "\nExamples:\n";
  for (const auto& mode : modes()) out << "  " << mode.example << "\n";
  out << "\nSettings: defaults < cfg=FILE.yaml < command line. `yolo8 help settings` lists them all,\n"
      << "`yolo8 MODE --help` the main ones of a mode.\n"
      << "Run folders: runs/detect/NAME (NAME = the mode, then train2, train3 ...; project= and name= change it).\n"
      << "Exit codes: 0 completed, 75 preempted (resume continues), 2 bad settings or data, 1 other failure.\n";
  return out.str();
}

int run_command_line(const std::vector<std::string>& args) {
  const CommandLine command = parse_command_line(args);
  if (command.mode == "version") {
    std::cout << describe(current_build_info());
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
