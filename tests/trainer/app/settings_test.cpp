#include "trainer/app/settings.h"

#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "test_paths.h"

namespace yolo8 {
namespace {

std::string write_temp(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + name;
  std::ofstream(path) << text;
  return path;
}

TEST(Settings, DefaultsMatchUltralytics) {
  const Settings settings;
  EXPECT_EQ(settings.epochs, 100);
  EXPECT_EQ(settings.batch, 16);
  EXPECT_EQ(settings.imgsz, 640);
  EXPECT_DOUBLE_EQ(settings.lr0, 0.01);
  EXPECT_DOUBLE_EQ(settings.momentum, 0.937);
  EXPECT_DOUBLE_EQ(settings.box, 7.5);
  EXPECT_EQ(settings.nbs, 64);
  EXPECT_EQ(settings.close_mosaic, 10);
  EXPECT_EQ(settings.optimizer, "auto");
}

TEST(Settings, PrecedenceDefaultsThenCfgThenCommandLine) {
  const std::string cfg = write_temp("prec.yaml", "epochs: 7\nimgsz: 320\nlr0: 0.02\n");
  const Settings settings = resolve_settings({{"imgsz", "256"}, {"cfg", cfg}}, "train");
  EXPECT_EQ(settings.epochs, 7);          // from cfg
  EXPECT_EQ(settings.imgsz, 256);         // command line beats cfg, wherever cfg= stands
  EXPECT_DOUBLE_EQ(settings.lr0, 0.02);   // from cfg
  EXPECT_EQ(settings.patience, 50);       // default
  EXPECT_EQ(settings.cfg, cfg);
}

TEST(Settings, UnknownKeySuggestsClosestNames) {
  try {
    resolve_settings({{"epoch", "3"}}, "train");
    FAIL() << "no error for an unknown key";
  } catch (const SettingsError& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("unknown setting 'epoch'"), std::string::npos) << message;
    EXPECT_NE(message.find("'epochs'"), std::string::npos) << message;
  }
  EXPECT_EQ(closest_setting_names("imgsize").front(), "imgsz");
  EXPECT_TRUE(closest_setting_names("completely_unrelated_word").empty());
}

TEST(Settings, BadValueNamesKeyAndType) {
  try {
    resolve_settings({{"epochs", "many"}}, "train");
    FAIL();
  } catch (const SettingsError& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("'epochs'"), std::string::npos);
    EXPECT_NE(message.find("an integer"), std::string::npos);
  }
  EXPECT_THROW(resolve_settings({{"amp", "maybe"}}, "train"), SettingsError);
  EXPECT_THROW(resolve_settings({{"lr0", "0.1x"}}, "train"), SettingsError);
  EXPECT_THROW(resolve_settings({{"optimizer", "lion"}}, "train"), SettingsError);
  EXPECT_THROW(resolve_settings({{"batch", "2.5"}}, "train"), SettingsError);
  EXPECT_THROW(resolve_settings({{"device", "gpu0"}}, "train"), SettingsError);
  EXPECT_THROW(resolve_settings({{"fliplr", "1.5"}}, "train"), SettingsError);
}

TEST(Settings, CfgFileErrorsNameFileAndLine) {
  const std::string cfg = write_temp("bad.yaml", "epochs: 3\n\nimgsz: big\n");
  try {
    resolve_settings({{"cfg", cfg}}, "train");
    FAIL();
  } catch (const SettingsError& error) {
    EXPECT_NE(std::string(error.what()).find(cfg + ":3"), std::string::npos) << error.what();
    EXPECT_NE(std::string(error.what()).find("'imgsz'"), std::string::npos) << error.what();
  }
  EXPECT_THROW(resolve_settings({{"cfg", "/nonexistent/cfg.yaml"}}, "train"), SettingsError);
}

TEST(Settings, ListsAndSpecialValues) {
  const Settings settings =
      resolve_settings({{"device", "0,1"}, {"classes", "[0, 2]"}, {"batch", "auto"}, {"cache", "True"}}, "train");
  EXPECT_EQ(settings.device_ids(), (std::vector<int>{0, 1}));
  EXPECT_EQ(settings.classes, (std::vector<int>{0, 2}));
  EXPECT_TRUE(settings.batch_is_auto());
  EXPECT_EQ(settings.cache, "ram");
  EXPECT_TRUE(resolve_settings({{"device", "cpu"}}, "train").device_ids().empty());
  EXPECT_EQ(resolve_settings({{"device", "cuda:3"}}, "train").device_ids(), std::vector<int>{3});
  EXPECT_DOUBLE_EQ(resolve_settings({{"batch", "0.7"}}, "train").batch, 0.7);
  // YAML lists and null reset to the default.
  const std::string cfg = write_temp("list.yaml", "device: [0, 1, 2]\nepochs: null\n");
  const Settings from_yaml = resolve_settings({{"cfg", cfg}}, "train");
  EXPECT_EQ(from_yaml.device_ids(), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(from_yaml.epochs, 100);
}

TEST(Settings, ArgsYamlRoundTrips) {
  Settings settings = resolve_settings({{"epochs", "3"}, {"name", "a: b"}, {"classes", "1,2"}}, "train");
  const std::string path = write_temp("args.yaml", settings_to_yaml(settings));
  const Settings reloaded = resolve_settings({{"cfg", path}}, "train");
  EXPECT_EQ(settings_to_yaml(reloaded).substr(0, 200), settings_to_yaml(settings).substr(0, 200));
  EXPECT_EQ(reloaded.name, "a: b");
  EXPECT_EQ(reloaded.classes, (std::vector<int>{1, 2}));
}

// configs/default.yaml is documentation users read: it must list every setting with its real default.
TEST(Settings, DefaultYamlListsEverySettingWithItsDefault) {
  const std::string path = std::string(test::kSourceDir) + "/configs/default.yaml";
  const YAML::Node root = YAML::LoadFile(path);
  const Settings defaults;
  size_t index = 0;
  for (const auto& item : root) {
    ASSERT_LT(index, setting_infos().size());
    const std::string key = item.first.as<std::string>();
    EXPECT_EQ(key, setting_infos()[index].name) << "order differs at line " << item.first.Mark().line + 1;
    const std::string value = item.second.IsNull() ? "" : item.second.as<std::string>();
    Settings parsed;
    set_setting(parsed, key, value, path);
    EXPECT_EQ(get_setting(parsed, key), get_setting(defaults, key)) << key;
    ++index;
  }
  EXPECT_EQ(index, setting_infos().size());
}

TEST(Settings, TableShowsChangedSettings) {
  const Settings settings = resolve_settings({{"epochs", "3"}}, "train");
  const std::string table = settings_table(settings);
  EXPECT_NE(table.find("epochs"), std::string::npos);
  EXPECT_EQ(table.find("patience"), std::string::npos);
  EXPECT_NE(settings_table(settings, true).find("patience"), std::string::npos);
}

}  // namespace
}  // namespace yolo8
