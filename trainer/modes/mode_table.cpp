#include "trainer/modes/mode_table.h"

#include <exception>
#include <iostream>
#include <sstream>

#include "common/exit_codes.h"
#include "trainer/cli/settings.h"
#include "trainer/cli/settings_help.h"
#include "trainer/core/stop_signal.h"
#include "trainer/modes/modes.h"
#include "trainer/runtime/build_info.h"
#include "trainer/support/model_loading.h"

#ifndef YOLO8_VERSION
#define YOLO8_VERSION "dev"
#endif

namespace yolo8 {

const std::vector<Mode>& modes() {
  static const std::vector<Mode> kModes = {
      {"train",
       "train a detector (asks the quota service for a GPU lease first)",
       "yolo8 train data=d.yaml model=yolov8s.yaml epochs=100 batch=16 device=0 name=defect-v3",
       {"data", "model", "epochs", "batch", "imgsz", "device", "workers", "name", "resume", "pretrained", "optimizer",
        "lr0", "patience", "quota", "team", "priority", "gpu_mem"},
       false,
       train_mode},
      {"val",
       "validate weights on a dataset split and print the metrics table",
       "yolo8 val model=runs/detect/train/weights/best.pt   (data, imgsz, single_cls: the training run's unless given)",
       {"model", "data", "split", "imgsz", "batch", "conf", "iou", "max_det", "save_json", "plots"},
       false,
       val_mode},
      {"predict",
       "detect objects in an image or a folder; saves annotated images (and YOLO txt with save_txt)",
       "yolo8 predict model=best.pt source=images/ conf=0.25 imgsz=640,480 save_txt",
       {"model", "source", "imgsz", "conf", "iou", "max_det", "classes", "save_txt", "save_conf", "line_width"},
       false,
       predict_mode},
      {"export",
       "write the weights in another format",
       "yolo8 export model=best.pt format=state_dict out=best_state_dict.pt",
       {"model", "format", "out"},
       false,
       export_mode},
      {"info",
       "print a model's layers, parameters and GFLOPs at 640",
       "yolo8 info model=yolov8m.yaml",
       {"model", "imgsz"},
       false,
       info_mode},
      {"profile",
       "measure peak memory and speed of training steps on synthetic batches; variants=n,s,m,l,x profiles "
       "several models; batch=auto gpu_mem=G shows the batch each one gets under a G GiB budget",
       "yolo8 profile model=yolov8s.yaml imgsz=640 batch=1,2,4,8,16",
       {"model", "imgsz", "batch", "device", "gpu_mem"},
       false,
       profile_mode},
      {"data",
       "dataset tools: `data check data=d.yaml`, `data synth out=DIR train=N val=M imgsz=S seed=K`",
       "yolo8 data check data=datasets/defects/data.yaml",
       {"data", "imgsz", "seed", "out", "workers"},
       true,
       data_mode},
  };
  return kModes;
}

const Mode* find_mode(const std::string& name) {
  for (const auto& mode : modes()) {
    if (name == mode.name) return &mode;
  }
  return nullptr;
}

CommandLine parse_command_line(const std::vector<std::string>& args) {
  static const std::vector<ModeWord> kWords = [] {
    std::vector<ModeWord> words;
    for (const auto& mode : modes()) words.push_back({mode.name, mode.takes_action});
    return words;
  }();
  return parse_command_line(args, kWords);
}

std::string usage_text(const std::string& mode_name) {
  std::ostringstream out;
  if (const Mode* mode = find_mode(mode_name)) {
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
  if (mode_name == "settings") return settings_help_text();
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

int run_mode(const CommandLine& command) {
  if (const Mode* mode = find_mode(command.mode)) return mode->run(command);
  // parse_command_line accepts only the table's modes.
  throw SettingsError("unknown mode '" + command.mode + "'");
}

int run_command_line(const std::vector<std::string>& args) {
  const CommandLine command = parse_command_line(args);
  if (command.mode == "version") {
    std::cout << describe(current_build_info());
    return kExitCompleted;
  }
  if (command.mode == "help") {
    std::cout << (command.action == "settings" && command.markdown ? settings_markdown() : usage_text(command.action));
    return kExitCompleted;
  }
  if (command.help) {
    std::cout << usage_text(command.mode);
    return kExitCompleted;
  }
  return run_mode(command);
}

int run_yolo8(const std::vector<std::string>& args) {
  try {
    return run_command_line(args);
  } catch (const StoppedBeforeTraining& stopped) {
    std::cerr << "yolo8: " << stopped.what() << "\n";
    return kExitPreempted;
  } catch (const SettingsError& error) {
    std::cerr << "yolo8: " << error.what() << "\n";
    return kExitBadInput;
  } catch (const DataError& error) {
    std::cerr << "yolo8: " << error.what() << "\n";
    return kExitBadInput;
  } catch (const std::exception& error) {
    std::cerr << "yolo8: error: " << error.what() << "\n";
    return kExitFailure;
  }
}

}  // namespace yolo8
