#include "trainer/modes/mode_table.h"

#include <gtest/gtest.h>

#include <string>

#include "trainer/cli/settings.h"

namespace yolo8 {
namespace {

// The SettingsError run_mode throws for these words, or "" when it throws none.
std::string settings_error(const std::vector<std::string>& words) {
  try {
    run_mode(parse_command_line(words));
  } catch (const SettingsError& error) {
    return error.what();
  }
  return "";
}

// Keys that only one mode reads are checked like settings: the error names the key the user typed.
TEST(RunMode, DataSynthCountErrorNamesTheKey) {
  const std::string message = settings_error({"data", "synth", "out=unused", "train=x"});
  EXPECT_NE(message.find("setting 'train'"), std::string::npos) << message;
  EXPECT_NE(message.find("an integer"), std::string::npos) << message;
}

TEST(RunMode, ProfileBatchListErrorNamesBatch) {
  const std::string message = settings_error({"profile", "batch=1,x"});
  EXPECT_NE(message.find("setting 'batch'"), std::string::npos) << message;
  EXPECT_EQ(settings_error({"profile", "batch=1,0"}).find("setting 'batch'"), 0u);
}

TEST(CommandLine, UsageMentionsEveryModeAndExitCodes) {
  const std::string text = usage_text();
  for (const char* mode : {"train", "val", "predict", "export", "info", "profile", "data"}) {
    EXPECT_NE(text.find(mode), std::string::npos) << mode;
  }
  EXPECT_NE(text.find("75"), std::string::npos);
  EXPECT_NE(usage_text("train").find("epochs"), std::string::npos);
  EXPECT_NE(usage_text("settings").find("quota"), std::string::npos);
  EXPECT_NE(text.find("runs/detect"), std::string::npos);
  EXPECT_EQ(text.find("runs/train"), std::string::npos);  // the old layout is gone from the help
}

}  // namespace
}  // namespace yolo8
