#include "trainer/app/commands.h"

#include <gtest/gtest.h>

#include <string>

#include "trainer/app/cli.h"
#include "trainer/app/settings.h"

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

}  // namespace
}  // namespace yolo8
