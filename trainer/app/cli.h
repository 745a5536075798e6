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
  std::vector<std::string> args;  // the words as given (a multi-GPU launch re-runs them once per GPU)
};

// Splits argv; throws SettingsError for words that are neither a mode nor key=value.
CommandLine parse_command_line(const std::vector<std::string>& args);

// Usage text; for a mode when given.
std::string usage_text(const std::string& mode = "");

// Runs the command; returns the process exit code. Throws on errors (main catches them).
int run_command_line(const std::vector<std::string>& args);

}  // namespace yolo8
