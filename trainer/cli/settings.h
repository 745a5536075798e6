#pragma once
// Every setting of the yolo8 command line, with Ultralytics' names and defaults.
// Filled and validated in one place: defaults < cfg=FILE.yaml < command line.

#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "data/config.h"
#include "trainer/core/train_settings.h"

namespace yolo8 {

// A settings problem the user can fix; main() prints it and exits 2.
class SettingsError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// yolo8's own: the GPU lease from the quota service and the memory budget without one.
struct LeaseSettings {
  std::string quota = "local";   // local | off | http://HOST:PORT
  std::string quota_db;          // local mode state file; "" = ~/.cache/yolo8/quota.db
  std::string quota_token;       // bearer token for a remote quotad; "" = $YOLO8_QUOTA_TOKEN
  std::string quota_token_file;  // file holding it instead (a mounted Secret), read again after a 401
  double quota_retry_s = 600;    // start-up: how long an unavailable quotad is retried before exit 75
  std::string team = "default";
  std::string user;  // "" = $USER
  std::string priority = "normal";
  bool preemptible = true;
  std::string justification;
  bool shared = false;      // a share of one GPU (the policy decides which models may)
  double memory_gib = 0.0;  // per GPU: the share (0 = the policy's default), else the least GPU memory
  double gpu_mem = 0.0;     // GiB budget when quota=off; 0 = the whole device
};

// Normalises quota and priority; throws SettingsError naming the key.
void validate(LeaseSettings& lease);

// The settings. The component configs are held whole, so each default lives once, in its struct: the data
// pipeline's (`loader`: imgsz, workers, cache, rect, single_cls, fraction, seed; `augment`), the recipe's
// (`optim`, `loss`) and the lease's.
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
  bool save = true;
  int save_period = -1;
  std::string device;   // "" auto, cpu, 0, 0,1 ...
  std::string project;  // "" = runs/TASK (runs/detect)
  std::string name;
  bool exist_ok = false;
  std::string pretrained = "true";  // true | false | PATH.pt
  bool verbose = true;
  bool deterministic = true;
  std::string resume = "false";  // false | true | auto | PATH/last.pt
  bool amp = true;
  bool profile = false;  // not implemented: must stay false
  std::string freeze;    // N (first N layers) or a list 0,3,5

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
  bool augment_tta = false;  // the `augment` key: test-time augmentation, not implemented
  bool agnostic_nms = false;
  std::vector<int> classes;
  bool save_txt = false;
  bool save_conf = false;
  bool show_labels = true;
  bool show_conf = true;
  int line_width = 0;  // 0: scaled to the image

  // imgsz=h,w (predict, export): the rectangle, height first; empty = the square loader.imgsz (which then holds
  // the longer side).
  std::vector<int> imgsz_hw;

  // Export.
  std::string format = "state_dict";
  std::string out;

  // The components' settings.
  data::LoaderConfig loader;
  data::AugmentConfig augment;
  OptimSettings optim;
  LossGains loss;
  double label_smoothing = 0.0;  // not implemented: must stay 0

  // yolo8's own: quota lease, memory and speed.
  LeaseSettings lease;
  int threads = 0;  // intra-op threads; 0 = the cores this process may use (trainer/runtime/cpu_share.h)
  bool channels_last = true;
  std::string amp_dtype = "float16";  // float16 | bfloat16: autocast's type on CUDA (CPUs use bfloat16)
  std::string cfg;                    // the YAML this came from, if any

  std::vector<int> device_ids() const;  // [] for cpu or auto without CUDA
  bool batch_is_auto() const { return batch < 1.0; }
};

enum class SettingType { kBool, kInt, kFloat, kString, kIntList };

struct SettingInfo {
  std::string name;
  SettingType type;
  std::string help;
  bool resumable;  // a resumed run takes this key from the command line; every other key from its checkpoint
  bool secret;     // never written (args.yaml, checkpoints) nor printed (the settings table): quota_token
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

// Applies a YAML mapping of setting: value; errors name `origin` (a file name), the line and the key.
void apply_yaml_text(Settings& settings, const std::string& text, const std::string& origin);
// The same for a file; errors name the file.
void apply_yaml_file(Settings& settings, const std::string& path);

// "0,1" / "cuda:2,cuda:5" / "[0, 1]" / "0" into CUDA indices; "cpu" and "" give none. Throws SettingsError
// naming `device` for anything else.
std::vector<int> parse_device_ids(const std::string& device);

// The settings of a resumed run: the checkpoint's (`saved`), except the resumable keys given on the command
// line (`requested` differs from the default), and `resume` itself.
Settings merge_resumed_settings(const Settings& saved, const Settings& requested);

// Range and choice checks, done once after all sources are applied.
void validate(Settings& settings);

// defaults < cfg=FILE (from the pairs or explicit) < the key=value pairs, then validate. predict, val and export
// need weights: model= must be given (predict and val refuse a model YAML: its weights are random).
Settings resolve_settings(const std::vector<std::pair<std::string, std::string>>& pairs, const std::string& mode);

// The keys the user set: the pairs' and those of the cfg=FILE they name (read again; call after resolve_settings).
std::set<std::string> given_setting_keys(const std::vector<std::pair<std::string, std::string>>& pairs);

// A secret setting given as key=value can be read by anyone who lists the processes (ps) or the Job's spec: prints
// a warning naming the safer ways ($YOLO8_QUOTA_TOKEN from a Kubernetes Secret, or cfg=FILE.yaml) to stderr.
void warn_of_secrets_on_the_command_line(const std::vector<std::pair<std::string, std::string>>& pairs);

// yolo8_args.yaml text (and the checkpoints' settings): every setting in yolo8's form, one per line; a secret one
// (quota_token) as null, whatever its value. args.yaml is Ultralytics' form (ultralytics_args.h).
std::string settings_to_yaml(const Settings& settings);

// A two-column table of the settings that differ from the defaults (all when `all`); a secret's value is not shown.
std::string settings_table(const Settings& settings, bool all = false);

}  // namespace yolo8
