#pragma once
// The settings table as text for people: `yolo8 help settings` and docs/settings.md
// (`yolo8 help settings --markdown`, checked against the file by tests/trainer/cli/settings_help_test.cpp).

#include <string>

namespace yolo8 {

// Every setting, its default and its help, one a line.
std::string settings_help_text();

// The same as a Markdown table, the whole of docs/settings.md.
std::string settings_markdown();

}  // namespace yolo8
