#pragma once
// The run's settings in Ultralytics 8.0.232's form: the args.yaml its trainer writes (every key of its
// cfg/default.yaml in that order, then save_dir), with its value types and nulls, so that its get_cfg and
// `YOLO(model).train(cfg=args.yaml)` take our args.yaml as their own. yolo8's own keys (the lease, threads...) are
// left out: get_cfg refuses unknown keys; yolo8_args.yaml holds every setting in yolo8's form.

#include <cstdint>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "trainer/cli/settings.h"

namespace yolo8 {

// Whether a key of the settings table (settings.cpp) is yolo8's own, unknown to Ultralytics: the lease, threads,
// channels_last, export's out. Such keys are left out of args.yaml; yolo8_args.yaml has every setting.
bool is_yolo8_only_setting(const std::string& key);

// A value as Python's YAML reads it: null, bool, int, float, str or a list of ints.
using UltralyticsValue = std::variant<std::monostate, bool, int64_t, double, std::string, std::vector<int64_t>>;
using UltralyticsArgs = std::vector<std::pair<std::string, UltralyticsValue>>;

// A key of Ultralytics' default.yaml that yolo8 has no setting for (segment, classify, pose, video, tracking and
// the other export formats' options), with the value Ultralytics' default.yaml gives it.
struct UltralyticsOnlyKey {
  const char* name;
  const char* after;  // the key it follows in default.yaml (one of ours, or the previous Ultralytics-only key)
  UltralyticsValue value;
};
const std::vector<UltralyticsOnlyKey>& ultralytics_only_keys();

// The Ultralytics form of `settings` for a run in the folder `save_dir` (its name is the run's `name`, as
// Ultralytics' trainer sets it). Where yolo8 has a value for "none" Ultralytics writes null (time 0, conf -1,
// line_width 0, empty strings and lists); batch=auto or a memory fraction is -1 (Ultralytics' AutoBatch);
// resume=auto is false (Ultralytics has no auto: a replay starts afresh); format=state_dict, which Ultralytics
// cannot export, is its default torchscript. Secret settings are never part of it.
UltralyticsArgs ultralytics_args(const Settings& settings, const std::string& save_dir);

// YAML text as Ultralytics' yaml_save writes it (block style, PyYAML's plain scalars; strings that PyYAML would
// read as something else are quoted).
std::string ultralytics_args_yaml(const UltralyticsArgs& args);

// Whether `value` (text from a cfg file or the command line) is what Ultralytics' default.yaml gives `key`:
// yolo8 reads an Ultralytics args.yaml, and accepts its keys it has no setting for only at their defaults.
bool is_ultralytics_default(const UltralyticsOnlyKey& key, const std::string& value);

}  // namespace yolo8
