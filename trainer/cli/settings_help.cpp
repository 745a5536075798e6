#include "trainer/cli/settings_help.h"

#include <sstream>

#include "trainer/cli/settings.h"

namespace yolo8 {
namespace {

// A table cell: a pipe would end the cell, so it is escaped.
std::string markdown_cell(const std::string& text) {
  std::string cell;
  for (const char c : text) {
    if (c == '|') cell += '\\';
    cell += c;
  }
  return cell;
}

}  // namespace

std::string settings_help_text() {
  std::ostringstream out;
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

std::string settings_markdown() {
  std::ostringstream out;
  const Settings defaults;
  out << "# Settings\n\n"
      << "<!-- Generated from the settings table (trainer/cli/settings.cpp) by `yolo8 help settings --markdown > "
         "docs/settings.md`; a test fails when this file differs. -->\n\n"
      << "Every `yolo8` setting, in the order configs/default.yaml lists them. Precedence: these defaults < "
         "cfg=FILE.yaml < the command line (`key=value` or `--key value`).\n\n"
      << "| Setting | Default | Meaning |\n"
      << "|---|---|---|\n";
  for (const auto& info : setting_infos()) {
    const std::string value = get_setting(defaults, info.name);
    out << "| `" << info.name << "` | " << (value.empty() ? "-" : "`" + markdown_cell(value) + "`") << " | "
        << markdown_cell(info.help) << " |\n";
  }
  return out.str();
}

}  // namespace yolo8
