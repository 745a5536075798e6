#include "trainer/cli/cli.h"

#include <gtest/gtest.h>

#include "trainer/cli/settings.h"
#include "trainer/modes/mode_table.h"  // parse_command_line with yolo8's modes

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

// `yolo8 detect train ...` is `yolo8 train ...`, as Ultralytics users type it; no other task has a model here.
TEST(CommandLine, OptionalDetectTaskWord) {
  const CommandLine command = parse_command_line({"detect", "train", "data=d.yaml", "epochs=3"});
  EXPECT_EQ(command.mode, "train");
  EXPECT_EQ(command.pairs, (Pairs{{"data", "d.yaml"}, {"epochs", "3"}}));
  EXPECT_EQ(command.args.front(), "detect");  // a DDP launch re-runs the words as given
  EXPECT_EQ(parse_command_line({"detect", "data", "check", "data=d.yaml"}).action, "check");
  EXPECT_EQ(parse_command_line({"detect", "help", "settings"}).action, "settings");
  EXPECT_EQ(parse_command_line({"train", "detect", "epochs=3"}).pairs, (Pairs{{"epochs", "3"}}));
  for (const char* task : {"segment", "classify", "pose", "obb"}) {
    for (const auto& words : {std::vector<std::string>{task, "train", "data=d.yaml"},
                              std::vector<std::string>{"predict", task, "model=best.pt"}}) {
      try {
        parse_command_line(words);
        ADD_FAILURE() << task << " was accepted";
      } catch (const SettingsError& error) {
        const std::string message = error.what();
        EXPECT_NE(message.find("task '" + std::string(task) + "' is not supported"), std::string::npos) << message;
        EXPECT_NE(message.find("only does detect"), std::string::npos) << message;
      }
    }
  }
  EXPECT_THROW(parse_command_line({"detect"}), SettingsError);
}

// A bare boolean setting switches it on (`yolo8 predict ... save_txt`); any other bare word stays an error that
// says what was expected.
TEST(CommandLine, BareBooleanWordsSwitchOn) {
  const CommandLine command =
      parse_command_line({"predict", "model=best.pt", "save_txt", "save-conf", "agnostic_nms", "show_labels=false"});
  EXPECT_EQ(command.pairs, (Pairs{{"model", "best.pt"},
                                  {"save_txt", "true"},
                                  {"save_conf", "true"},
                                  {"agnostic_nms", "true"},
                                  {"show_labels", "false"}}));
  const auto message_of = [](const std::vector<std::string>& words) -> std::string {
    try {
      parse_command_line(words);
    } catch (const SettingsError& error) {
      return error.what();
    }
    return "";
  };
  EXPECT_NE(message_of({"predict", "conf"}).find("setting 'conf' needs a value: conf=VALUE"), std::string::npos);
  const std::string unknown = message_of({"predict", "save_tx"});
  EXPECT_NE(unknown.find("expected key=value, --key value or a boolean setting, got 'save_tx'"), std::string::npos)
      << unknown;
  EXPECT_NE(unknown.find("did you mean"), std::string::npos) << unknown;
  EXPECT_NE(unknown.find("'save_txt'"), std::string::npos) << unknown;
  EXPECT_NE(message_of({"train", "images/"}).find("got 'images/'"), std::string::npos);
}

}  // namespace
}  // namespace yolo8
