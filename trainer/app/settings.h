#pragma once
// Every setting of the yolo8 command line, with Ultralytics' names and defaults.
// Filled and validated in one place: defaults < cfg=FILE.yaml < command line.

#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace yolo8 {

// A settings problem the user can fix; main() prints it and exits 2.
class SettingsError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct Settings {
  // What to do.
  std::string task = "detect";
  std::string mode = "train";
  std::string model = "yolov8n.yaml";
  std::string data;

  // Training length and batching.
  int epochs = 100;
  double time = 0.0;  // hours; overrides epochs when > 0
  int patience = 50;
  double batch = 16;  // >= 1 images, -1 auto, 0 < x < 1 fraction of the memory budget
  int imgsz = 640;
  bool save = true;
  int save_period = -1;
  std::string cache = "false";  // false | ram | disk
  std::string device;            // "" auto, cpu, 0, 0,1 ...
  int workers = 8;
  std::string project = "runs";
  std::string name;
  bool exist_ok = false;
  std::string pretrained = "true";  // true | false | PATH.pt
  std::string optimizer = "auto";
  bool verbose = true;
  int seed = 0;
  bool deterministic = true;
  bool single_cls = false;
  bool rect = false;
  bool cos_lr = false;
  int close_mosaic = 10;
  std::string resume = "false";  // false | true | auto | PATH/last.pt
  bool amp = true;
  double fraction = 1.0;
  bool profile = false;
  std::string freeze;  // N (first N layers) or a list 0,3,5

  // Validation and prediction.
  bool val = true;
  std::string split = "val";
  bool save_json = false;
  double conf = -1.0;  // -1: 0.25 for predict, 0.001 for val
  double iou = 0.7;
  int max_det = 300;
  bool half = false;
  bool plots = true;
  std::string source;
  bool augment = false;
  bool agnostic_nms = false;
  std::vector<int> classes;
  bool save_txt = false;
  bool save_conf = false;
  bool show_labels = true;
  bool show_conf = true;
  int line_width = 0;  // 0: scaled to the image

  // Export.
  std::string format = "state_dict";
  std::string out;

  // Hyper-parameters.
  double lr0 = 0.01;
  double lrf = 0.01;
  double momentum = 0.937;
  double weight_decay = 0.0005;
  double warmup_epochs = 3.0;
  double warmup_momentum = 0.8;
  double warmup_bias_lr = 0.1;
  double box = 7.5;
  double cls = 0.5;
  double dfl = 1.5;
  double label_smoothing = 0.0;
  int nbs = 64;
  double hsv_h = 0.015;
  double hsv_s = 0.7;
  double hsv_v = 0.4;
  double degrees = 0.0;
  double translate = 0.1;
  double scale = 0.5;
  double shear = 0.0;
  double perspective = 0.0;
  double flipud = 0.0;
  double fliplr = 0.5;
  double mosaic = 1.0;
  double mixup = 0.0;

  // yolo8's own: quota lease, memory and speed.
  std::string quota = "local";  // local | off | http://HOST:PORT
  std::string quota_db;         // local mode state file; "" = ~/.cache/yolo8/quota.db
  std::string quota_token;      // bearer token for a remote quotad; "" = $YOLO8_QUOTA_TOKEN
  std::string team = "default";
  std::string user;  // "" = $USER
  std::string priority = "normal";
  bool preemptible = true;
  std::string justification;
  double gpu_mem = 0.0;  // GiB budget when quota=off; 0 = the whole device
  int threads = 0;       // intra-op threads; 0 = all cores
  bool channels_last = true;
  std::string cfg;  // the YAML this came from, if any

  std::vector<int> device_ids() const;  // [] for cpu or auto without CUDA
  bool batch_is_auto() const { return batch < 1.0; }
};

enum class SettingType { kBool, kInt, kFloat, kString, kIntList };

struct SettingInfo {
  std::string name;
  SettingType type;
  std::string help;
};

// All settings in the order default.yaml lists them.
const std::vector<SettingInfo>& setting_infos();

// Sets one setting from text; throws SettingsError naming the key and the expected type.
// `origin` says where the text came from ("command line", "cfg.yaml:12").
void set_setting(Settings& settings, const std::string& key, const std::string& value,
                 const std::string& origin = "command line");

// Values of keys that only one mode reads (`data synth train=N`, `profile batch=1,2,4`), checked like settings:
// errors name `key`.
int parse_int_setting(const std::string& key, const std::string& value, const std::string& origin = "command line");
std::vector<int> parse_int_list_setting(const std::string& key, const std::string& value,
                                        const std::string& origin = "command line");

// The value as text (lists as a,b,c).
std::string get_setting(const Settings& settings, const std::string& key);

// Up to three valid names closest to an unknown key.
std::vector<std::string> closest_setting_names(const std::string& key);

// Applies a YAML mapping file; errors name the file, line and key.
void apply_yaml_file(Settings& settings, const std::string& path);

// Range and choice checks, done once after all sources are applied.
void validate(Settings& settings);

// defaults < cfg=FILE (from the pairs or explicit) < the key=value pairs, then validate.
Settings resolve_settings(const std::vector<std::pair<std::string, std::string>>& pairs,
                          const std::string& mode);

// args.yaml text: every setting, one per line.
std::string settings_to_yaml(const Settings& settings);

// A two-column table of the settings that differ from the defaults (all when `all`).
std::string settings_table(const Settings& settings, bool all = false);

}  // namespace yolo8
