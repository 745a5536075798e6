#include "trainer/cli/ultralytics_args.h"

#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <fstream>
#include <set>
#include <string>
#include <vector>

namespace yolo8 {
namespace {

// Ultralytics 8.0.232's cfg/default.yaml keys in order; its trainer adds save_dir last (Peer.ArgsYaml... checks
// this list against the installed package).
const std::vector<std::string> kUltralyticsKeys = {"task",
                                                   "mode",
                                                   "model",
                                                   "data",
                                                   "epochs",
                                                   "time",
                                                   "patience",
                                                   "batch",
                                                   "imgsz",
                                                   "save",
                                                   "save_period",
                                                   "cache",
                                                   "device",
                                                   "workers",
                                                   "project",
                                                   "name",
                                                   "exist_ok",
                                                   "pretrained",
                                                   "optimizer",
                                                   "verbose",
                                                   "seed",
                                                   "deterministic",
                                                   "single_cls",
                                                   "rect",
                                                   "cos_lr",
                                                   "close_mosaic",
                                                   "resume",
                                                   "amp",
                                                   "fraction",
                                                   "profile",
                                                   "freeze",
                                                   "overlap_mask",
                                                   "mask_ratio",
                                                   "dropout",
                                                   "val",
                                                   "split",
                                                   "save_json",
                                                   "save_hybrid",
                                                   "conf",
                                                   "iou",
                                                   "max_det",
                                                   "half",
                                                   "dnn",
                                                   "plots",
                                                   "source",
                                                   "vid_stride",
                                                   "stream_buffer",
                                                   "visualize",
                                                   "augment",
                                                   "agnostic_nms",
                                                   "classes",
                                                   "retina_masks",
                                                   "embed",
                                                   "show",
                                                   "save_frames",
                                                   "save_txt",
                                                   "save_conf",
                                                   "save_crop",
                                                   "show_labels",
                                                   "show_conf",
                                                   "show_boxes",
                                                   "line_width",
                                                   "format",
                                                   "keras",
                                                   "optimize",
                                                   "int8",
                                                   "dynamic",
                                                   "simplify",
                                                   "opset",
                                                   "workspace",
                                                   "nms",
                                                   "lr0",
                                                   "lrf",
                                                   "momentum",
                                                   "weight_decay",
                                                   "warmup_epochs",
                                                   "warmup_momentum",
                                                   "warmup_bias_lr",
                                                   "box",
                                                   "cls",
                                                   "dfl",
                                                   "pose",
                                                   "kobj",
                                                   "label_smoothing",
                                                   "nbs",
                                                   "hsv_h",
                                                   "hsv_s",
                                                   "hsv_v",
                                                   "degrees",
                                                   "translate",
                                                   "scale",
                                                   "shear",
                                                   "perspective",
                                                   "flipud",
                                                   "fliplr",
                                                   "mosaic",
                                                   "mixup",
                                                   "copy_paste",
                                                   "cfg",
                                                   "tracker",
                                                   "save_dir"};

// get_cfg's type checks (ultralytics/cfg/__init__.py): these keys must hold such a value when not null.
const std::set<std::string> kFloatKeys = {"warmup_epochs", "box", "cls", "dfl", "degrees", "shear", "time"};
const std::set<std::string> kFractionKeys = {"dropout",
                                             "iou",
                                             "lr0",
                                             "lrf",
                                             "momentum",
                                             "weight_decay",
                                             "warmup_momentum",
                                             "warmup_bias_lr",
                                             "label_smoothing",
                                             "hsv_h",
                                             "hsv_s",
                                             "hsv_v",
                                             "translate",
                                             "scale",
                                             "perspective",
                                             "flipud",
                                             "fliplr",
                                             "mosaic",
                                             "mixup",
                                             "copy_paste",
                                             "conf",
                                             "fraction"};
const std::set<std::string> kIntKeys = {"epochs",       "patience",   "batch",      "workers",    "seed",
                                        "close_mosaic", "mask_ratio", "max_det",    "vid_stride", "line_width",
                                        "workspace",    "nbs",        "save_period"};
const std::set<std::string> kBoolKeys = {
    "save",         "exist_ok", "verbose",      "deterministic", "single_cls",  "rect",        "cos_lr",
    "overlap_mask", "val",      "save_json",    "save_hybrid",   "half",        "dnn",         "plots",
    "show",         "save_txt", "save_conf",    "save_crop",     "save_frames", "show_labels", "show_conf",
    "visualize",    "augment",  "agnostic_nms", "retina_masks",  "show_boxes",  "keras",       "optimize",
    "int8",         "dynamic",  "simplify",     "nms",           "profile"};

const UltralyticsValue& value_of(const UltralyticsArgs& args, const std::string& key) {
  const auto found = std::find_if(args.begin(), args.end(), [&](const auto& item) { return item.first == key; });
  if (found == args.end()) throw std::out_of_range("no key " + key);
  return found->second;
}

template <typename T>
T held(const UltralyticsArgs& args, const std::string& key) {
  const UltralyticsValue& value = value_of(args, key);
  if (!std::holds_alternative<T>(value)) throw std::runtime_error("key " + key + " holds another type");
  return std::get<T>(value);
}

bool is_null(const UltralyticsArgs& args, const std::string& key) {
  return std::holds_alternative<std::monostate>(value_of(args, key));
}

TEST(UltralyticsArgs, HoldsEveryUltralyticsKeyInItsOrderAndNoneOfOurs) {
  const UltralyticsArgs args = ultralytics_args(Settings{}, "runs/detect/train3");
  std::vector<std::string> keys;
  for (const auto& [key, value] : args) keys.push_back(key);
  EXPECT_EQ(keys, kUltralyticsKeys);
  for (const auto& info : setting_infos()) {
    const bool present = std::find(keys.begin(), keys.end(), info.name) != keys.end();
    EXPECT_EQ(present, !is_yolo8_only_setting(info.name)) << info.name;
    if (info.secret) EXPECT_FALSE(present) << info.name;
  }
  const auto& infos = setting_infos();
  EXPECT_EQ(std::count_if(infos.begin(), infos.end(),
                          [](const SettingInfo& info) { return is_yolo8_only_setting(info.name); }),
            17);
}

TEST(UltralyticsArgs, ValuesHaveTheTypesGetCfgChecks) {
  // Settings off their defaults, so that a key holding the wrong type cannot hide behind a null.
  const Settings settings = resolve_settings({{"epochs", "3"},
                                              {"time", "0.5"},
                                              {"conf", "0.3"},
                                              {"line_width", "2"},
                                              {"batch", "8"},
                                              {"classes", "0,2"},
                                              {"lr0", "1e-5"},
                                              {"fraction", "1"}},
                                             "train");
  for (const auto& [key, value] : ultralytics_args(settings, "runs/detect/train")) {
    if (std::holds_alternative<std::monostate>(value)) continue;
    const bool number = std::holds_alternative<int64_t>(value) || std::holds_alternative<double>(value);
    if (kFloatKeys.count(key)) EXPECT_TRUE(number) << key;
    if (kFractionKeys.count(key)) {
      ASSERT_TRUE(number) << key;
      const double fraction =
          std::holds_alternative<double>(value) ? std::get<double>(value) : std::get<int64_t>(value);
      EXPECT_TRUE(fraction >= 0 && fraction <= 1) << key << " = " << fraction;
    }
    if (kIntKeys.count(key)) EXPECT_TRUE(std::holds_alternative<int64_t>(value)) << key;
    if (kBoolKeys.count(key)) EXPECT_TRUE(std::holds_alternative<bool>(value)) << key;
  }
  const UltralyticsArgs args = ultralytics_args(settings, "runs/detect/train");
  EXPECT_DOUBLE_EQ(held<double>(args, "time"), 0.5);
  EXPECT_DOUBLE_EQ(held<double>(args, "conf"), 0.3);
  EXPECT_DOUBLE_EQ(held<double>(args, "fraction"), 1.0);  // float like Ultralytics' 1.0, though given as 1
  EXPECT_EQ(held<int64_t>(args, "line_width"), 2);
  EXPECT_EQ(held<int64_t>(args, "batch"), 8);
  EXPECT_EQ(held<std::vector<int64_t>>(args, "classes"), (std::vector<int64_t>{0, 2}));
}

// Where yolo8 spells "none" with a number or an empty text, Ultralytics writes null; the run's name is its folder's.
TEST(UltralyticsArgs, NullsWhereUltralyticsWritesThemAndTheRunFolder) {
  const UltralyticsArgs args = ultralytics_args(Settings{}, "/runs/job2");
  for (const char* key :
       {"model", "data", "time", "device", "project", "freeze", "conf", "source", "classes", "line_width", "cfg"}) {
    if (std::string(key) == "model") continue;  // yolov8n.yaml by default
    EXPECT_TRUE(is_null(args, key)) << key;
  }
  EXPECT_EQ(held<std::string>(args, "model"), "yolov8n.yaml");
  EXPECT_EQ(held<std::string>(args, "name"), "job2");
  EXPECT_EQ(held<std::string>(args, "save_dir"), "/runs/job2");
  EXPECT_EQ(held<bool>(args, "cache"), false);
  EXPECT_EQ(held<bool>(args, "pretrained"), true);
  EXPECT_EQ(held<bool>(args, "resume"), false);
  EXPECT_EQ(held<std::string>(args, "format"), "torchscript");  // state_dict: no Ultralytics export
  EXPECT_EQ(held<std::string>(args, "tracker"), "botsort.yaml");
  EXPECT_EQ(held<int64_t>(args, "workspace"), 4);
  EXPECT_DOUBLE_EQ(held<double>(args, "pose"), 12.0);
}

TEST(UltralyticsArgs, OurValuesAreMappedWhereTheMeaningIsTheSame) {
  const auto args_of = [](std::vector<std::pair<std::string, std::string>> pairs, const std::string& mode = "train") {
    return ultralytics_args(resolve_settings(pairs, mode), "runs/detect/train");
  };
  EXPECT_EQ(held<int64_t>(args_of({{"batch", "auto"}}), "batch"), -1);
  EXPECT_EQ(held<int64_t>(args_of({{"batch", "0.7"}}), "batch"), -1);  // AutoBatch: 8.0.232 has no fraction
  EXPECT_EQ(held<int64_t>(args_of({{"device", "0"}}), "device"), 0);   // an int, as `yolo device=0` gives
  EXPECT_EQ(held<std::string>(args_of({{"device", "0,1"}}), "device"), "0,1");
  EXPECT_EQ(held<std::string>(args_of({{"device", "cpu"}}), "device"), "cpu");
  EXPECT_EQ(held<bool>(args_of({{"pretrained", "false"}}), "pretrained"), false);
  EXPECT_EQ(held<std::string>(args_of({{"pretrained", "w.pt"}}), "pretrained"), "w.pt");
  EXPECT_EQ(held<bool>(args_of({{"resume", "auto"}}), "resume"), false);
  EXPECT_EQ(held<int64_t>(args_of({{"freeze", "10"}}), "freeze"), 10);
  EXPECT_EQ(held<std::vector<int64_t>>(args_of({{"freeze", "0,3"}}), "freeze"), (std::vector<int64_t>{0, 3}));
  EXPECT_EQ(held<std::string>(args_of({{"cache", "ram"}}), "cache"), "ram");
  EXPECT_EQ(held<std::string>(args_of({{"format", "onnx"}}), "format"), "onnx");
  EXPECT_EQ(held<int64_t>(args_of({{"imgsz", "320"}}), "imgsz"), 320);
  EXPECT_EQ(held<std::vector<int64_t>>(args_of({{"imgsz", "640,480"}, {"model", "best.pt"}}, "predict"), "imgsz"),
            (std::vector<int64_t>{640, 480}));
}

// The text is what PyYAML reads back as the same values: floats keep a dot (PyYAML reads 1e-05 as a string),
// strings that look like other types are quoted, secrets and our keys are not there.
TEST(UltralyticsArgs, YamlTextReadsBackAsTheValues) {
  const std::string token = "s3cr3t-token";
  const Settings settings = resolve_settings({{"lr0", "1e-5"},
                                              {"data", "true"},
                                              {"source", "0123"},
                                              {"classes", "1,2"},
                                              {"quota_token", token},
                                              {"team", "vision"}},
                                             "train");
  const std::string text = ultralytics_args_yaml(ultralytics_args(settings, "runs/detect/a: b"));
  EXPECT_EQ(text.find(token), std::string::npos);
  EXPECT_EQ(text.find("team"), std::string::npos);
  EXPECT_EQ(text.find("quota"), std::string::npos);
  EXPECT_NE(text.find("\nlr0: 1.0e-05\n"), std::string::npos) << text;
  EXPECT_NE(text.find("\nweight_decay: 0.0005\n"), std::string::npos) << text;
  EXPECT_NE(text.find("\nwarmup_epochs: 3.0\n"), std::string::npos) << text;
  EXPECT_NE(text.find("\ndata: \"true\"\n"), std::string::npos) << text;
  EXPECT_NE(text.find("\nsource: \"0123\"\n"), std::string::npos) << text;
  EXPECT_NE(text.find("\nclasses:\n- 1\n- 2\n"), std::string::npos) << text;
  EXPECT_NE(text.find("\ntime: null\n"), std::string::npos) << text;
  const YAML::Node root = YAML::Load(text);
  EXPECT_EQ(root["save_dir"].as<std::string>(), "runs/detect/a: b");
  EXPECT_EQ(root["name"].as<std::string>(), "a: b");
  EXPECT_EQ(root.size(), kUltralyticsKeys.size());
}

// yolo8 reads an Ultralytics args.yaml back (cfg=args.yaml): the shared keys as ours, its keys yolo8 has no
// setting for only at their defaults, save_dir ignored (a new run picks its folder).
TEST(UltralyticsArgs, Yolo8ReadsItsArgsYamlBack) {
  const Settings settings = resolve_settings(
      {{"epochs", "7"}, {"lr0", "1e-5"}, {"freeze", "0,3"}, {"device", "cpu"}, {"conf", "0.4"}, {"batch", "auto"}},
      "train");
  const std::string path = ::testing::TempDir() + "ultralytics_args.yaml";
  std::ofstream(path) << ultralytics_args_yaml(ultralytics_args(settings, "runs/detect/train"));
  const Settings reloaded = resolve_settings({{"cfg", path}}, "train");
  for (const auto& info : setting_infos()) {
    if (is_yolo8_only_setting(info.name) || info.name == "cfg" || info.name == "name" || info.name == "format")
      continue;
    EXPECT_EQ(get_setting(reloaded, info.name), get_setting(settings, info.name)) << info.name;
  }
  EXPECT_EQ(reloaded.name, "train");

  std::ofstream(path) << "dropout: 0.5\n";
  try {
    resolve_settings({{"cfg", path}}, "train");
    FAIL() << "dropout 0.5 was accepted";
  } catch (const SettingsError& error) {
    EXPECT_NE(std::string(error.what()).find("'dropout'"), std::string::npos) << error.what();
    EXPECT_NE(std::string(error.what()).find("0.0"), std::string::npos) << error.what();
    EXPECT_NE(std::string(error.what()).find(":1"), std::string::npos) << error.what();
  }
  EXPECT_NO_THROW(resolve_settings({{"dropout", "0"}, {"tracker", "botsort.yaml"}, {"embed", "null"}}, "train"));
  EXPECT_THROW(resolve_settings({{"opset", "12"}}, "train"), SettingsError);
}

}  // namespace
}  // namespace yolo8
