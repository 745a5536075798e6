#pragma once
// The `yolo8 MODE key=value ...` command line, in the style Ultralytics users know.

#include <string>
#include <utility>
#include <vector>

namespace yolo8 {

struct CommandLine {
  std::string mode;    // train, val, predict, export, info, profile, data, help, version
  std::string action;  // the word after `data` (check, synth)
  std::vector<std::pair<std::string, std::string>> pairs;  // key=value and --key value, in order
  bool help = false;                                       // MODE --help
  bool markdown = false;                                   // help settings --markdown (docs/settings.md)
  std::vector<std::string> args;  // the words as given (a multi-GPU launch re-runs them once per GPU)
};

// A mode word the command line accepts, as the mode table (trainer/modes/mode_table.h) lists it.
struct ModeWord {
  std::string name;
  bool takes_action = false;  // a word after the mode names what to do: `data check`, `data synth`
};

// Splits argv; throws SettingsError for words that are neither one of `modes` nor key=value.
// trainer/modes/mode_table.h has the form with yolo8's modes.
CommandLine parse_command_line(const std::vector<std::string>& args, const std::vector<ModeWord>& modes);

}  // namespace yolo8
