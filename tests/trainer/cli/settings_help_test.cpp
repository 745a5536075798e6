#include "trainer/cli/settings_help.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>
#include <string>

#include "test_paths.h"
#include "trainer/cli/settings.h"

namespace yolo8 {
namespace {

// docs/settings.md is generated from the settings table (`yolo8 help settings --markdown > docs/settings.md`): a
// setting added, renamed or given another default or help fails here until the file is generated again.
TEST(SettingsHelp, DocsSettingsMdIsWhatTheTableProduces) {
  const std::string path = std::string(test::kSourceDir) + "/docs/settings.md";
  std::ifstream in(path);
  ASSERT_TRUE(in) << "cannot read " << path;
  std::ostringstream file;
  file << in.rdbuf();
  EXPECT_EQ(file.str(), settings_markdown())
      << path << " differs from the settings table: run `build/trainer/yolo8 help settings --markdown > "
      << "docs/settings.md`";
}

// One row per setting, in the table's order, with its default.
TEST(SettingsHelp, MarkdownHasARowPerSettingInOrder) {
  const std::string markdown = settings_markdown();
  const Settings defaults;
  size_t position = 0;
  for (const auto& info : setting_infos()) {
    const size_t row = markdown.find("\n| `" + info.name + "` | ", position);
    ASSERT_NE(row, std::string::npos) << info.name;
    const std::string line = markdown.substr(row + 1, markdown.find('\n', row + 1) - row - 1);
    const std::string value = get_setting(defaults, info.name);
    EXPECT_NE(line.find(value.empty() ? " | - | " : "`" + value + "`"), std::string::npos) << line;
    EXPECT_EQ(line.substr(line.size() - 2), " |") << line;
    position = row + 1;
  }
}

TEST(SettingsHelp, TextListsEverySettingWithItsDefault) {
  const std::string text = settings_help_text();
  for (const auto& info : setting_infos()) EXPECT_NE(text.find("  " + info.name + " "), std::string::npos) << info.name;
  EXPECT_NE(text.find("configs/default.yaml"), std::string::npos);
}

}  // namespace
}  // namespace yolo8
