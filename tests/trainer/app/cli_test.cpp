#include "trainer/app/cli.h"

#include <gtest/gtest.h>

#include "trainer/app/settings.h"

namespace yolo8 {
namespace {

using Pairs = std::vector<std::pair<std::string, std::string>>;

TEST(CommandLine, UltralyticsStyleKeyValue) {
  const CommandLine command = parse_command_line(
      {"train", "data=d.yaml", "model=yolov8s.yaml", "epochs=100", "batch=16", "device=0,1", "resume=true"});
  EXPECT_EQ(command.mode, "train");
  EXPECT_EQ(command.pairs, (Pairs{{"data", "d.yaml"},
                                  {"model", "yolov8s.yaml"},
                                  {"epochs", "100"},
                                  {"batch", "16"},
                                  {"device", "0,1"},
                                  {"resume", "true"}}));
}

TEST(CommandLine, DashDashForms) {
  const CommandLine command =
      parse_command_line({"train", "--epochs", "5", "--exist-ok", "--amp", "false", "--name=x", "--plots"});
  EXPECT_EQ(command.pairs,
            (Pairs{{"epochs", "5"}, {"exist_ok", "true"}, {"amp", "false"}, {"name", "x"}, {"plots", "true"}}));
}

TEST(CommandLine, DataActionAndHelp) {
  const CommandLine command = parse_command_line({"data", "check", "data=d.yaml"});
  EXPECT_EQ(command.action, "check");
  EXPECT_TRUE(parse_command_line({"train", "--help"}).help);
  EXPECT_EQ(parse_command_line({}).mode, "help");
  EXPECT_EQ(parse_command_line({"--version"}).mode, "version");
}

TEST(CommandLine, RejectsWhatItCannotRead) {
  EXPECT_THROW(parse_command_line({"trian"}), SettingsError);
  EXPECT_THROW(parse_command_line({"epochs=3"}), SettingsError);
  EXPECT_THROW(parse_command_line({"train", "epochs"}), SettingsError);
  EXPECT_THROW(parse_command_line({"train", "--epochs"}), SettingsError);
  EXPECT_THROW(parse_command_line({"train", "=3"}), SettingsError);
}

TEST(CommandLine, UsageMentionsEveryModeAndExitCodes) {
  const std::string text = usage_text();
  for (const char* mode : {"train", "val", "predict", "export", "info", "profile", "data"}) {
    EXPECT_NE(text.find(mode), std::string::npos) << mode;
  }
  EXPECT_NE(text.find("75"), std::string::npos);
  EXPECT_NE(usage_text("train").find("epochs"), std::string::npos);
  EXPECT_NE(usage_text("settings").find("quota"), std::string::npos);
}

}  // namespace
}  // namespace yolo8
