#include "trainer/cli/settings.h"

#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <set>
#include <string>

#include "test_paths.h"

namespace yolo8 {
namespace {

std::string write_temp(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + name;
  std::ofstream(path) << text;
  return path;
}

// The quota token reaches the client, and nothing a run writes or prints: args.yaml and the checkpoints' settings
// hold null, the table says it is set without the value, and a resumed run takes it from the command line again.
TEST(Settings, TheQuotaTokenIsNeverWrittenNorPrinted) {
  const std::string token = "s3cr3t-token-value";
  const Settings settings = resolve_settings({{"quota_token", token}, {"team", "cv"}}, "train");
  EXPECT_EQ(settings.lease.quota_token, token);
  const std::string yaml = settings_to_yaml(settings);
  EXPECT_EQ(yaml.find(token), std::string::npos) << yaml;
  EXPECT_NE(yaml.find("quota_token: null"), std::string::npos) << yaml;
  for (const bool all : {false, true}) {
    const std::string table = settings_table(settings, all);
    EXPECT_EQ(table.find(token), std::string::npos) << table;
    EXPECT_NE(table.find("(set, not shown)"), std::string::npos) << table;
  }
  Settings saved;
  apply_yaml_text(saved, yaml, "args.yaml");
  EXPECT_TRUE(saved.lease.quota_token.empty());
  EXPECT_EQ(merge_resumed_settings(saved, settings).lease.quota_token, token);
  const auto& infos = setting_infos();
  EXPECT_EQ(std::count_if(infos.begin(), infos.end(), [](const SettingInfo& info) { return info.secret; }), 1);
}

// The token comes one way: as text (quota_token, $YOLO8_QUOTA_TOKEN) or from a file (quota_token_file), whose
// path is an ordinary setting, written and shown.
TEST(Settings, AQuotaTokenAndATokenFileTogetherAreAnErrorNamingBoth) {
  try {
    resolve_settings({{"quota_token", "t"}, {"quota_token_file", "/var/run/secrets/quotad/token"}}, "train");
    FAIL() << "both accepted";
  } catch (const SettingsError& error) {
    EXPECT_NE(std::string(error.what()).find("'quota_token' and 'quota_token_file' are both set"), std::string::npos)
        << error.what();
  }
  const Settings settings = resolve_settings({{"quota_token_file", "/var/run/secrets/quotad/token"}}, "train");
  EXPECT_EQ(settings.lease.quota_token_file, "/var/run/secrets/quotad/token");
  EXPECT_NE(settings_to_yaml(settings).find("quota_token_file: /var/run/secrets/quotad/token"), std::string::npos);
}

// A run saved with a token file resumes with a token given now (and the other way round): the one given now is
// the one used, not both refused.
TEST(Settings, AResumeGivenTheTokenAnotherWayUsesTheOneGivenNow) {
  Settings saved;
  apply_yaml_text(saved, settings_to_yaml(resolve_settings({{"quota_token_file", "/secrets/old"}}, "train")),
                  "yolo8_args.yaml");
  ASSERT_EQ(saved.lease.quota_token_file, "/secrets/old");
  Settings merged = merge_resumed_settings(saved, resolve_settings({{"quota_token", "t"}}, "train"));
  EXPECT_EQ(merged.lease.quota_token, "t");
  EXPECT_TRUE(merged.lease.quota_token_file.empty());
  EXPECT_NO_THROW(validate(merged));
  merged = merge_resumed_settings(saved, resolve_settings({{"quota_token_file", "/secrets/new"}}, "train"));
  EXPECT_EQ(merged.lease.quota_token_file, "/secrets/new");
  EXPECT_TRUE(merged.lease.quota_token.empty());
}

TEST(Settings, DefaultsMatchUltralytics) {
  const Settings settings;
  EXPECT_EQ(settings.project, "");  // runs/detect, as the reference lays run folders out
  EXPECT_EQ(settings.epochs, 100);
  EXPECT_EQ(settings.batch, 16);
  EXPECT_EQ(settings.loader.imgsz, 640);
  EXPECT_DOUBLE_EQ(settings.optim.lr0, 0.01);
  EXPECT_DOUBLE_EQ(settings.optim.momentum, 0.937);
  EXPECT_DOUBLE_EQ(settings.loss.box, 7.5);
  EXPECT_EQ(settings.optim.nbs, 64);
  EXPECT_EQ(settings.augment.close_mosaic, 10);
  EXPECT_EQ(settings.optim.optimizer, "auto");
}

// The table writes into the component structs, so a key's default is its component's.
TEST(Settings, KeysFillTheComponentStructs) {
  Settings settings;
  set_setting(settings, "hsv_h", "0.2");
  set_setting(settings, "close_mosaic", "3");
  set_setting(settings, "nbs", "32");
  set_setting(settings, "lrf", "0.5");
  set_setting(settings, "dfl", "2");
  set_setting(settings, "imgsz", "320");
  set_setting(settings, "cache", "disk");
  set_setting(settings, "seed", "7");
  set_setting(settings, "team", "vision");
  set_setting(settings, "gpu_mem", "12");
  EXPECT_DOUBLE_EQ(settings.augment.hsv_h, 0.2);
  EXPECT_EQ(settings.augment.close_mosaic, 3);
  EXPECT_EQ(settings.optim.nbs, 32);
  EXPECT_DOUBLE_EQ(settings.optim.lrf, 0.5);
  EXPECT_DOUBLE_EQ(settings.loss.dfl, 2.0);
  EXPECT_EQ(settings.loader.imgsz, 320);
  EXPECT_EQ(settings.loader.cache, data::CacheMode::kDisk);
  EXPECT_EQ(settings.loader.seed, 7u);
  EXPECT_EQ(settings.lease.team, "vision");
  EXPECT_DOUBLE_EQ(settings.lease.gpu_mem, 12.0);
  // null resets a nested field to the component's default.
  set_setting(settings, "hsv_h", "null");
  EXPECT_DOUBLE_EQ(settings.augment.hsv_h, data::AugmentConfig{}.hsv_h);
  EXPECT_EQ(get_setting(Settings{}, "cache"), "false");  // default.yaml's spelling
  EXPECT_THROW(set_setting(settings, "seed", "-1"), SettingsError);
  EXPECT_THROW(set_setting(settings, "cache", "gpu"), SettingsError);
}

TEST(Settings, PrecedenceDefaultsThenCfgThenCommandLine) {
  const std::string cfg = write_temp("prec.yaml", "epochs: 7\nimgsz: 320\nlr0: 0.02\n");
  const Settings settings = resolve_settings({{"imgsz", "256"}, {"cfg", cfg}}, "train");
  EXPECT_EQ(settings.epochs, 7);               // from cfg
  EXPECT_EQ(settings.loader.imgsz, 256);       // command line beats cfg, wherever cfg= stands
  EXPECT_DOUBLE_EQ(settings.optim.lr0, 0.02);  // from cfg
  EXPECT_EQ(settings.patience, 50);            // default
  EXPECT_EQ(settings.cfg, cfg);
}

// amp_dtype chooses CUDA's autocast type; anything but float16 or bfloat16 is refused naming the key.
TEST(Settings, AmpDtypeIsFloat16OrBfloat16) {
  EXPECT_EQ(resolve_settings({}, "train").amp_dtype, "float16");
  EXPECT_EQ(resolve_settings({{"amp_dtype", "BFloat16"}}, "train").amp_dtype, "bfloat16");
  try {
    resolve_settings({{"amp_dtype", "fp8"}}, "train");
    ADD_FAILURE() << "amp_dtype=fp8 accepted";
  } catch (const SettingsError& error) {
    EXPECT_NE(std::string(error.what()).find("amp_dtype"), std::string::npos) << error.what();
    EXPECT_NE(std::string(error.what()).find("bfloat16"), std::string::npos) << error.what();
  }
}

// `yolo8 val` validates on rectangular batches unless rect=false, as `yolo val` does; training keeps rect off.
TEST(Settings, ValModeDefaultsToRectangularBatches) {
  EXPECT_FALSE(resolve_settings({}, "train").loader.rect);
  EXPECT_TRUE(resolve_settings({{"model", "best.pt"}}, "val").loader.rect);
  EXPECT_FALSE(resolve_settings({{"model", "best.pt"}, {"rect", "false"}}, "val").loader.rect);
}

// Random weights are never what predict or val should run: model= is required and a YAML is refused. export
// writes whatever it is given (a YAML's fresh weights have the names and shapes a loader checks).
TEST(Settings, PredictValAndExportNeedWeights) {
  for (const char* mode : {"predict", "val", "export"}) {
    try {
      resolve_settings({{"source", "images"}}, mode);
      ADD_FAILURE() << mode << " ran without model=";
    } catch (const SettingsError& error) {
      EXPECT_NE(std::string(error.what()).find("setting 'model' is required for " + std::string(mode)),
                std::string::npos)
          << error.what();
    }
  }
  for (const char* mode : {"predict", "val"}) {
    try {
      resolve_settings({{"model", "yolov8n.yaml"}}, mode);
      ADD_FAILURE() << mode << " accepted a model YAML";
    } catch (const SettingsError& error) {
      EXPECT_NE(std::string(error.what()).find("random weights"), std::string::npos) << error.what();
    }
  }
  EXPECT_EQ(resolve_settings({{"model", "yolov8s.yaml"}}, "export").model, "yolov8s.yaml");
  for (const char* mode : {"train", "info", "profile"}) EXPECT_EQ(resolve_settings({}, mode).model, "yolov8n.yaml");
  // A cfg file naming the weights counts as naming them.
  const std::string cfg = write_temp("weights_cfg.yaml", "model: runs/detect/train/weights/best.pt\n");
  EXPECT_EQ(resolve_settings({{"cfg", cfg}}, "predict").model, "runs/detect/train/weights/best.pt");
}

// imgsz=h,w is height then width (Ultralytics' order) for predict and export; train and val keep one square size.
TEST(Settings, RectangularImgszOnlyWherePredictAndExportUseIt) {
  const Settings predict = resolve_settings({{"model", "best.pt"}, {"imgsz", "640,480"}}, "predict");
  EXPECT_EQ(predict.imgsz_hw, (std::vector<int>{640, 480}));
  EXPECT_EQ(predict.loader.imgsz, 640);
  EXPECT_EQ(get_setting(predict, "imgsz"), "640,480");
  EXPECT_EQ(resolve_settings({{"model", "best.pt"}, {"imgsz", "[320, 480]"}}, "export").imgsz_hw,
            (std::vector<int>{320, 480}));
  // One size in list form, or h == w, is the square.
  EXPECT_TRUE(resolve_settings({{"model", "best.pt"}, {"imgsz", "320,320"}}, "predict").imgsz_hw.empty());
  EXPECT_EQ(resolve_settings({{"model", "best.pt"}, {"imgsz", "[320]"}}, "predict").loader.imgsz, 320);
  // A later imgsz replaces the rectangle.
  EXPECT_TRUE(
      resolve_settings({{"model", "best.pt"}, {"imgsz", "640,480"}, {"imgsz", "320"}}, "predict").imgsz_hw.empty());
  for (const char* mode : {"train", "val", "info"}) {
    try {
      resolve_settings({{"model", "best.pt"}, {"imgsz", "640,480"}}, mode);
      ADD_FAILURE() << mode << " accepted imgsz=640,480";
    } catch (const SettingsError& error) {
      EXPECT_NE(std::string(error.what()).find("setting 'imgsz' takes one size for " + std::string(mode)),
                std::string::npos)
          << error.what();
    }
  }
  EXPECT_THROW(resolve_settings({{"model", "best.pt"}, {"imgsz", "640,480,320"}}, "predict"), SettingsError);
  EXPECT_THROW(resolve_settings({{"model", "best.pt"}, {"imgsz", "640,16"}}, "predict"), SettingsError);
}

// The keys the user set decide what val takes from the weights' training run: the pairs' and the cfg file's.
TEST(Settings, GivenKeysIncludeTheCfgFile) {
  const std::string cfg = write_temp("given_cfg.yaml", "imgsz: 320\nconf: 0.5\n");
  EXPECT_EQ(given_setting_keys({{"cfg", cfg}, {"data", "d.yaml"}}),
            (std::set<std::string>{"cfg", "imgsz", "conf", "data"}));
  EXPECT_EQ(given_setting_keys({{"model", "best.pt"}}), (std::set<std::string>{"model"}));
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
  EXPECT_EQ(settings.loader.cache, data::CacheMode::kRam);
  EXPECT_TRUE(resolve_settings({{"device", "cpu"}}, "train").device_ids().empty());
  EXPECT_EQ(resolve_settings({{"device", "cuda:3"}}, "train").device_ids(), std::vector<int>{3});
  EXPECT_DOUBLE_EQ(resolve_settings({{"batch", "0.7"}}, "train").batch, 0.7);
  // YAML lists and null reset to the default.
  const std::string cfg = write_temp("list.yaml", "device: [0, 1, 2]\nepochs: null\n");
  const Settings from_yaml = resolve_settings({{"cfg", cfg}}, "train");
  EXPECT_EQ(from_yaml.device_ids(), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(from_yaml.epochs, 100);
}

// Each component validates its own ranges; the error still names the user's key.
TEST(Settings, ComponentChecksNameTheKey) {
  const auto message = [](const std::string& key, const std::string& value) {
    try {
      resolve_settings({{key, value}}, "train");
    } catch (const SettingsError& error) {
      return std::string(error.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message("scale", "1.5").find("setting 'scale'"), std::string::npos) << message("scale", "1.5");
  EXPECT_NE(message("nbs", "0").find("setting 'nbs'"), std::string::npos) << message("nbs", "0");
  EXPECT_NE(message("workers", "-1").find("setting 'workers'"), std::string::npos);
  EXPECT_NE(message("imgsz", "16").find("setting 'imgsz'"), std::string::npos);
  EXPECT_NE(message("cls", "-1").find("setting 'cls'"), std::string::npos) << message("cls", "-1");
  EXPECT_NE(message("optimizer", "lion").find("setting 'optimizer'"), std::string::npos);
  EXPECT_NE(message("priority", "urgent").find("setting 'priority'"), std::string::npos);
  // imgsz need not be a multiple of the stride yet: train rounds it up once the model is known.
  EXPECT_EQ(resolve_settings({{"imgsz", "100"}}, "train").loader.imgsz, 100);
}

// lrf had two checks with different ranges (settings (0, 1], the optimizer [0, 1]); the one left is (0, 1].
TEST(Settings, LrfIsCheckedOnce) {
  EXPECT_NO_THROW(resolve_settings({{"lrf", "1"}}, "train"));
  for (const char* bad : {"0", "1.5", "-0.1"}) {
    try {
      resolve_settings({{"lrf", bad}}, "train");
      FAIL() << "lrf=" << bad << " accepted";
    } catch (const SettingsError& error) {
      EXPECT_NE(std::string(error.what()).find("setting 'lrf' must be in (0, 1]"), std::string::npos) << error.what();
    }
  }
  OptimSettings optim;
  optim.lrf = 0.0;
  EXPECT_THROW(validate(optim), std::invalid_argument);
}

// Accepted and silently ignored before: a value other than the default is now refused, naming the key.
TEST(Settings, UnimplementedSettingsAreRefused) {
  for (const auto& [key, value] : std::vector<std::pair<std::string, std::string>>{
           {"profile", "true"}, {"label_smoothing", "0.1"}, {"augment", "true"}}) {
    try {
      resolve_settings({{key, value}}, "train");
      FAIL() << key << "=" << value << " accepted";
    } catch (const SettingsError& error) {
      const std::string message = error.what();
      EXPECT_NE(message.find("setting '" + key + "'"), std::string::npos) << message;
      EXPECT_NE(message.find("not implemented"), std::string::npos) << message;
    }
  }
  EXPECT_NO_THROW(resolve_settings({{"profile", "false"}, {"label_smoothing", "0"}}, "train"));
}

// quotad serves HTTPS and the client verifies it against $YOLO8_QUOTA_CA_FILE: https:// is taken; another
// scheme is refused here, before the dataset scan and the model build.
TEST(Settings, QuotaTakesHttpsAndRefusesOtherSchemesUpFront) {
  EXPECT_EQ(resolve_settings({{"quota", "https://quotad:8470"}}, "train").lease.quota, "https://quotad:8470");
  try {
    resolve_settings({{"quota", "ftp://quotad:8470"}}, "train");
    FAIL() << "quota=ftp:// accepted";
  } catch (const SettingsError& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("setting 'quota'"), std::string::npos) << message;
    EXPECT_NE(message.find("https://"), std::string::npos) << message;
  }
  EXPECT_EQ(resolve_settings({{"quota", "http://quotad:8080"}}, "train").lease.quota, "http://quotad:8080");
  EXPECT_EQ(resolve_settings({{"quota", "OFF"}}, "train").lease.quota, "off");
}

// quotad's replicas, listed: every URL is checked up front, and a bad one is named.
TEST(Settings, QuotaTakesTheReplicasUrlsAndNamesABadOne) {
  EXPECT_EQ(resolve_settings({{"quota", "https://a:8470,https://b:8470"}}, "train").lease.quota,
            "https://a:8470,https://b:8470");
  for (const char* bad : {"https://a:8470,http://b:8470", "https://a:8470,https://a:8470/", "https://a:8470,b"}) {
    SCOPED_TRACE(bad);
    try {
      resolve_settings({{"quota", bad}}, "train");
      ADD_FAILURE() << "accepted";
    } catch (const SettingsError& error) {
      const std::string message = error.what();
      EXPECT_EQ(message.rfind("setting 'quota' '", 0), 0u) << message;
    }
  }
}

// One parser for `device`, used by Settings::device_ids and the multi-GPU launch.
TEST(Settings, ParsesDeviceIds) {
  EXPECT_EQ(parse_device_ids("0,1"), (std::vector<int>{0, 1}));
  EXPECT_EQ(parse_device_ids("3"), (std::vector<int>{3}));
  EXPECT_EQ(parse_device_ids("cuda:2,cuda:5"), (std::vector<int>{2, 5}));
  EXPECT_EQ(parse_device_ids("cuda:0,1"), (std::vector<int>{0, 1}));
  EXPECT_EQ(parse_device_ids("[0, 1]"), (std::vector<int>{0, 1}));
  EXPECT_EQ(parse_device_ids(" 0 , 2 "), (std::vector<int>{0, 2}));
  EXPECT_TRUE(parse_device_ids("cpu").empty());
  EXPECT_TRUE(parse_device_ids("CPU").empty());
  EXPECT_TRUE(parse_device_ids("").empty());
  for (const char* bad : {"0,x", "gpu0", "cuda", "-1", "[]", "0.5", "cuda:"}) {
    try {
      parse_device_ids(bad);
      FAIL() << "device=" << bad << " accepted";
    } catch (const SettingsError& error) {
      EXPECT_NE(std::string(error.what()).find("setting 'device'"), std::string::npos) << error.what();
    }
  }
  Settings settings;
  settings.device = "cuda:1,cuda:3";
  EXPECT_EQ(settings.device_ids(), (std::vector<int>{1, 3}));
  EXPECT_THROW(resolve_settings({{"device", "[]"}}, "train"), SettingsError);
}

TEST(Settings, YamlTextIsAppliedInMemory) {
  Settings settings;
  apply_yaml_text(settings, "epochs: 4\nmosaic: 0.5\ndevice: [0, 1]\ncfg: other.yaml\n", "last.pt (saved settings)");
  EXPECT_EQ(settings.epochs, 4);
  EXPECT_DOUBLE_EQ(settings.augment.mosaic, 0.5);
  EXPECT_EQ(settings.device, "0,1");
  EXPECT_EQ(settings.cfg, "");  // a cfg does not chain to another
  try {
    apply_yaml_text(settings, "epochs: 4\nimgsz: big\n", "last.pt (saved settings)");
    FAIL();
  } catch (const SettingsError& error) {
    EXPECT_NE(std::string(error.what()).find("last.pt (saved settings):2"), std::string::npos) << error.what();
    EXPECT_NE(std::string(error.what()).find("'imgsz'"), std::string::npos) << error.what();
  }
  EXPECT_THROW(apply_yaml_text(settings, "[1, 2]", "x"), SettingsError);
  EXPECT_THROW(apply_yaml_text(settings, "a: [", "x"), SettingsError);
}

// The keys a resumed run takes from the command line are flagged in the table; all others come from the
// checkpoint.
TEST(Settings, ResumableKeysAreFlaggedInTheTable) {
  std::vector<std::string> resumable;
  for (const auto& info : setting_infos()) {
    if (info.resumable) resumable.push_back(info.name);
  }
  EXPECT_EQ(resumable,
            (std::vector<std::string>{"batch", "device", "workers", "verbose", "plots", "quota", "quota_db",
                                      "quota_token", "quota_token_file", "quota_retry_s", "gpu_mem", "threads"}));
}

TEST(Settings, ResumeKeepsTheSavedRecipe) {
  Settings saved = resolve_settings({{"epochs", "30"}, {"lr0", "0.02"}, {"workers", "2"}, {"batch", "8"}}, "train");
  const Settings requested = resolve_settings({{"resume", "runs/detect/a/weights/last.pt"},
                                               {"epochs", "99"},
                                               {"lr0", "0.5"},
                                               {"workers", "4"},
                                               {"device", "cpu"},
                                               {"quota", "off"},
                                               {"threads", "3"},
                                               {"plots", "false"}},
                                              "train");
  const Settings merged = merge_resumed_settings(saved, requested);
  EXPECT_EQ(merged.epochs, 30);  // the recipe is the checkpoint's
  EXPECT_DOUBLE_EQ(merged.optim.lr0, 0.02);
  EXPECT_EQ(merged.loader.workers, 4);  // resumable and given
  EXPECT_EQ(merged.device, "cpu");
  EXPECT_EQ(merged.lease.quota, "off");
  EXPECT_EQ(merged.threads, 3);
  EXPECT_FALSE(merged.plots);
  EXPECT_DOUBLE_EQ(merged.batch, 8);  // resumable but left at its default: the saved one stays
  EXPECT_EQ(merged.resume, "runs/detect/a/weights/last.pt");
}

TEST(Settings, ArgsYamlRoundTrips) {
  Settings settings = resolve_settings({{"epochs", "3"}, {"name", "a: b"}, {"classes", "1,2"}}, "train");
  const std::string path = write_temp("args.yaml", settings_to_yaml(settings));
  const Settings reloaded = resolve_settings({{"cfg", path}}, "train");
  EXPECT_EQ(settings_to_yaml(reloaded).substr(0, 200), settings_to_yaml(settings).substr(0, 200));
  EXPECT_EQ(reloaded.name, "a: b");
  EXPECT_EQ(reloaded.classes, (std::vector<int>{1, 2}));
}

// A share needs a quota service to share with; which models may share is the policy's answer, not the trainer's.
TEST(Settings, SharedLeaseSettingsAreCheckedAgainstTheQuotaMode) {
  const Settings shared = resolve_settings({{"shared", "true"}, {"memory_gib", "2.5"}}, "train");
  EXPECT_TRUE(shared.lease.shared);
  EXPECT_DOUBLE_EQ(shared.lease.memory_gib, 2.5);
  try {
    resolve_settings({{"shared", "true"}, {"quota", "off"}}, "train");
    FAIL() << "shared=true accepted with quota=off";
  } catch (const SettingsError& error) {
    EXPECT_NE(std::string(error.what()).find("'shared'"), std::string::npos) << error.what();
  }
  EXPECT_THROW(resolve_settings({{"memory_gib", "-1"}}, "train"), SettingsError);
  EXPECT_THROW(resolve_settings({{"memory_gib", "4"}, {"quota", "off"}}, "train"), SettingsError);
}

// How long the start-up retries an unavailable quotad before the run exits 75: ten minutes unless given.
TEST(Settings, QuotaRetryIsTheStartUpDeadline) {
  EXPECT_DOUBLE_EQ(Settings{}.lease.quota_retry_s, 600);
  EXPECT_DOUBLE_EQ(resolve_settings({{"quota_retry_s", "30"}}, "train").lease.quota_retry_s, 30);
  for (const char* bad : {"0", "-5", "inf"}) {
    try {
      resolve_settings({{"quota_retry_s", bad}}, "train");
      ADD_FAILURE() << "quota_retry_s=" << bad << " accepted";
    } catch (const SettingsError& error) {
      EXPECT_NE(std::string(error.what()).find("'quota_retry_s'"), std::string::npos) << error.what();
    }
  }
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

// Its comments are the table's help texts, so `yolo8 help` and the file say the same.
TEST(Settings, DefaultYamlCommentsAreTheHelpTexts) {
  std::ifstream in(std::string(test::kSourceDir) + "/configs/default.yaml");
  std::string line;
  size_t index = 0;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    ASSERT_LT(index, setting_infos().size());
    const SettingInfo& info = setting_infos()[index++];
    EXPECT_EQ(line.substr(0, line.find(':')), info.name);
    const size_t comment = line.find("  # ");
    ASSERT_NE(comment, std::string::npos) << line;
    EXPECT_EQ(line.substr(comment + 4), info.help) << info.name;
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
