#pragma once
// yolo8's modes, one table (mode_table.cpp) that drives the command line's mode words, the dispatch, the help text
// and the exit code. Adding a mode is one entry there and its file (modes.h).

#include <string>
#include <vector>

#include "trainer/cli/cli.h"

namespace yolo8 {

struct Mode {
  const char* name;
  const char* summary;
  const char* example;
  std::vector<std::string> keys;  // the settings most relevant to the mode (`yolo8 MODE --help`)
  bool takes_action;              // a word after the mode names what to do: `data check`, `data synth`
  // Does the work; returns the process exit code (common/exit_codes.h). Errors throw: run_yolo8 maps them.
  int (*run)(const CommandLine& command);
};

// In the order the help lists them.
const std::vector<Mode>& modes();
const Mode* find_mode(const std::string& name);

// Splits argv with the table's modes; throws SettingsError for words that are neither a mode nor key=value.
CommandLine parse_command_line(const std::vector<std::string>& args);

// Usage text; for a mode when given; `settings` lists every setting.
std::string usage_text(const std::string& mode = "");

// Runs the command's mode; returns its exit code.
int run_mode(const CommandLine& command);

// Runs the command (version, help, MODE --help or a mode); returns the process exit code. Throws on errors.
int run_command_line(const std::vector<std::string>& args);

// The whole program: run_command_line, with every error caught here once and turned into a message on stderr and
// its exit code: bad settings, data or weights 2; a stop before training (SIGTERM, lease lost) 75; anything else 1.
int run_yolo8(const std::vector<std::string>& args);

}  // namespace yolo8
