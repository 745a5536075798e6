#include "trainer/cli/settings.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <sstream>
#include <variant>

#include "quota/client/client.h"
#include "trainer/cli/ultralytics_args.h"

namespace yolo8 {
namespace {

// The table points into the nested component structs; an accessor per key (a member pointer cannot reach
// into a member's members). The type of the field decides parsing and printing.
template <typename T>
using Accessor = T& (*)(Settings&);
using Member = std::variant<Accessor<bool>, Accessor<int>, Accessor<int64_t>, Accessor<uint64_t>, Accessor<double>,
                            Accessor<std::string>, Accessor<std::vector<int>>, Accessor<data::CacheMode>>;
// `path` is a member path (loader.imgsz), which cannot be parenthesised.
// NOLINTBEGIN(bugprone-macro-parentheses)
#define YOLO8_FIELD(path)      \
  +[](Settings & s) -> auto& { \
    return s.path;             \
  }
// NOLINTEND(bugprone-macro-parentheses)

// Flags of an entry, or-ed together.
// May change when a run resumes: where and how fast it runs, what it prints. Everything else (the recipe, the
// data, the model) comes from the checkpoint.
constexpr unsigned kResumable = 1;
// Never written or printed: yolo8_args.yaml, the checkpoints' settings and the console table show it as not there.
constexpr unsigned kSecret = 2;
// yolo8's own (the lease, threads, memory format, export's output path): Ultralytics does not know the key, so
// its args.yaml leaves it out (get_cfg refuses unknown keys); yolo8_args.yaml has it.
constexpr unsigned kYolo8Only = 4;

struct Entry {
  Entry(const char* key, Member accessor, const char* help_text, unsigned flags = 0)
      : name(key),
        member(accessor),
        help(help_text),
        resumable(flags & kResumable),
        secret(flags & kSecret),
        yolo8_only(flags & kYolo8Only) {}
  const char* name;
  Member member;
  const char* help;
  bool resumable;
  bool secret;
  bool yolo8_only;
};

// The one table behind parsing, printing, args.yaml (which keys), yolo8_args.yaml, resuming and the default.yaml
// test.
const std::vector<Entry>& entries() {
  static const std::vector<Entry> kEntries = {
      {"task", YOLO8_FIELD(task), "task; only detect is implemented"},
      {"mode", YOLO8_FIELD(mode), "train, val, predict, export, info, profile, data"},
      {"model", YOLO8_FIELD(model), "model YAML (yolov8n.yaml ... yolov8x.yaml or a path) or weights (.pt)"},
      {"data", YOLO8_FIELD(data), "dataset YAML in Ultralytics format"},
      {"epochs", YOLO8_FIELD(epochs), "number of epochs to train"},
      {"time", YOLO8_FIELD(time), "hours to train; overrides epochs when > 0"},
      {"patience", YOLO8_FIELD(patience), "epochs without fitness improvement before stopping early"},
      {"batch", YOLO8_FIELD(batch), "images per batch; -1 or auto fits the memory budget; 0.7 uses 70% of it",
       kResumable},
      {"imgsz", YOLO8_FIELD(loader.imgsz), "image size in pixels; predict and export also take h,w"},
      {"save", YOLO8_FIELD(save), "save checkpoints and predictions"},
      {"save_period", YOLO8_FIELD(save_period), "save a checkpoint every N epochs; -1 disables"},
      {"cache", YOLO8_FIELD(loader.cache), "cache decoded images: false, ram or disk"},
      {"device", YOLO8_FIELD(device), "cpu, a CUDA device 0, or several 0,1 (one process each); empty = auto",
       kResumable},
      {"workers", YOLO8_FIELD(loader.workers), "data loading threads (per process, at most the cores it may use)",
       kResumable},
      {"project", YOLO8_FIELD(project), "folder holding the run folders; empty = runs/detect"},
      {"name", YOLO8_FIELD(name), "run folder name; empty = the mode's name, incremented"},
      {"exist_ok", YOLO8_FIELD(exist_ok), "reuse an existing run folder instead of incrementing"},
      {"pretrained", YOLO8_FIELD(pretrained), "true, false, or a .pt whose matching tensors are transferred"},
      {"optimizer", YOLO8_FIELD(optim.optimizer), "SGD, Adam, AdamW or auto"},
      {"verbose", YOLO8_FIELD(verbose), "print details", kResumable},
      {"seed", YOLO8_FIELD(loader.seed), "random seed"},
      {"deterministic", YOLO8_FIELD(deterministic), "deterministic algorithms (bitwise-reproducible on CPU)"},
      {"single_cls", YOLO8_FIELD(loader.single_cls), "treat every class as one"},
      {"rect", YOLO8_FIELD(loader.rect), "rectangular batches (train; val, where it is on unless rect=false)"},
      {"cos_lr", YOLO8_FIELD(optim.cos_lr), "cosine learning-rate schedule instead of linear"},
      {"close_mosaic", YOLO8_FIELD(augment.close_mosaic), "turn mosaic off for the last N epochs"},
      {"resume", YOLO8_FIELD(resume), "false, true (latest run), auto (this name's run if resumable), or PATH/last.pt"},
      {"amp", YOLO8_FIELD(amp), "mixed precision: float16 on CUDA, bfloat16 on CPUs with native bfloat16"},
      {"fraction", YOLO8_FIELD(loader.fraction), "fraction of the training set to use"},
      {"profile", YOLO8_FIELD(profile), "profile speeds during training (not implemented: must be false)"},
      {"freeze", YOLO8_FIELD(freeze), "freeze the first N layers, or a list of layer indices 0,3,5"},
      {"val", YOLO8_FIELD(val), "validate after every epoch"},
      {"split", YOLO8_FIELD(split), "dataset split for val mode: val, test or train"},
      {"save_json", YOLO8_FIELD(save_json), "write COCO-format predictions JSON during validation"},
      {"conf", YOLO8_FIELD(conf), "confidence threshold; -1 = 0.25 for predict, 0.001 for val"},
      {"iou", YOLO8_FIELD(iou), "NMS IoU threshold"},
      {"max_det", YOLO8_FIELD(max_det), "maximum detections per image"},
      {"half", YOLO8_FIELD(half), "half precision inference on CUDA"},
      {"plots", YOLO8_FIELD(plots), "write plots (curves, matrices, mosaics)", kResumable},
      {"source", YOLO8_FIELD(source), "image or folder for predict"},
      {"augment", YOLO8_FIELD(augment_tta), "test-time augmentation for predict (not implemented: must be false)"},
      {"agnostic_nms", YOLO8_FIELD(agnostic_nms), "class-agnostic NMS"},
      {"classes", YOLO8_FIELD(classes), "keep only these class indices, e.g. 0,2"},
      {"save_txt", YOLO8_FIELD(save_txt), "save predictions as YOLO txt"},
      {"save_conf", YOLO8_FIELD(save_conf), "add confidences to saved txt"},
      {"show_labels", YOLO8_FIELD(show_labels), "draw labels on predicted images"},
      {"show_conf", YOLO8_FIELD(show_conf), "draw confidences on predicted images"},
      {"line_width", YOLO8_FIELD(line_width), "box line width; 0 = scaled to the image"},
      {"format", YOLO8_FIELD(format), "export format: state_dict, onnx or torchscript"},
      {"out", YOLO8_FIELD(out), "output path (export, data synth)", kYolo8Only},
      {"lr0", YOLO8_FIELD(optim.lr0), "initial learning rate"},
      {"lrf", YOLO8_FIELD(optim.lrf), "final learning rate as a fraction of lr0"},
      {"momentum", YOLO8_FIELD(optim.momentum), "SGD momentum / Adam beta1"},
      {"weight_decay", YOLO8_FIELD(optim.weight_decay), "weight decay at the nominal batch"},
      {"warmup_epochs", YOLO8_FIELD(optim.warmup_epochs), "warm-up epochs (fractions allowed)"},
      {"warmup_momentum", YOLO8_FIELD(optim.warmup_momentum), "momentum at the start of warm-up"},
      {"warmup_bias_lr", YOLO8_FIELD(optim.warmup_bias_lr), "bias learning rate at the start of warm-up"},
      {"box", YOLO8_FIELD(loss.box), "box loss gain"},
      {"cls", YOLO8_FIELD(loss.cls), "class loss gain"},
      {"dfl", YOLO8_FIELD(loss.dfl), "distribution focal loss gain"},
      {"label_smoothing", YOLO8_FIELD(label_smoothing), "label smoothing (fraction; not implemented: must be 0)"},
      {"nbs", YOLO8_FIELD(optim.nbs), "nominal batch size: gradients are accumulated up to it"},
      {"hsv_h", YOLO8_FIELD(augment.hsv_h), "hue augmentation (fraction)"},
      {"hsv_s", YOLO8_FIELD(augment.hsv_s), "saturation augmentation (fraction)"},
      {"hsv_v", YOLO8_FIELD(augment.hsv_v), "value augmentation (fraction)"},
      {"degrees", YOLO8_FIELD(augment.degrees), "rotation (+/- degrees)"},
      {"translate", YOLO8_FIELD(augment.translate), "translation (+/- fraction)"},
      {"scale", YOLO8_FIELD(augment.scale), "scale gain (+/-)"},
      {"shear", YOLO8_FIELD(augment.shear), "shear (+/- degrees)"},
      {"perspective", YOLO8_FIELD(augment.perspective), "perspective (+/- fraction, 0 to 0.001)"},
      {"flipud", YOLO8_FIELD(augment.flipud), "up-down flip probability"},
      {"fliplr", YOLO8_FIELD(augment.fliplr), "left-right flip probability"},
      {"mosaic", YOLO8_FIELD(augment.mosaic), "mosaic probability"},
      {"mixup", YOLO8_FIELD(augment.mixup), "mixup probability"},
      {"quota", YOLO8_FIELD(lease.quota),
       "GPU lease service: local (embedded, shared state file), off, or quotad's URL (its replicas' URLs: "
       "comma-separated)",
       kResumable | kYolo8Only},
      {"quota_db", YOLO8_FIELD(lease.quota_db), "state file of the local quota mode; empty = ~/.cache/yolo8/quota.db",
       kResumable | kYolo8Only},
      {"quota_token", YOLO8_FIELD(lease.quota_token), "bearer token for quotad; empty = $YOLO8_QUOTA_TOKEN",
       kResumable | kSecret | kYolo8Only},
      {"quota_token_file", YOLO8_FIELD(lease.quota_token_file),
       "file holding the bearer token for quotad (a mounted Secret), read again after a 401: a rotation",
       kResumable | kYolo8Only},
      {"quota_retry_s", YOLO8_FIELD(lease.quota_retry_s),
       "seconds the lease request retries an unavailable quotad (no answer, 429, 500, 502, 503, 504) before exit 75",
       kResumable | kYolo8Only},
      {"team", YOLO8_FIELD(lease.team), "team the lease is charged to", kYolo8Only},
      {"user", YOLO8_FIELD(lease.user), "user the lease is charged to; empty = $USER", kYolo8Only},
      {"priority", YOLO8_FIELD(lease.priority), "lease priority: low, normal, high or critical (audited emergency)",
       kYolo8Only},
      {"preemptible", YOLO8_FIELD(lease.preemptible), "allow a higher-priority job to preempt this run", kYolo8Only},
      {"justification", YOLO8_FIELD(lease.justification), "why a large model or critical priority is needed",
       kYolo8Only},
      {"shared", YOLO8_FIELD(lease.shared),
       "ask for a share of one GPU (small models, where the policy allows it) instead of whole GPUs", kYolo8Only},
      {"memory_gib", YOLO8_FIELD(lease.memory_gib),
       "GiB per GPU: the share of a shared lease (0 = the policy's default for the model), else the least GPU "
       "memory to be placed on",
       kYolo8Only},
      {"gpu_mem", YOLO8_FIELD(lease.gpu_mem), "memory budget in GiB per GPU when quota=off; 0 = the whole device",
       kResumable | kYolo8Only},
      {"threads", YOLO8_FIELD(threads),
       "CPU threads for tensor math; 0 = the cores this process may use (affinity, cgroup quota, split among the ranks "
       "on this node)",
       kResumable | kYolo8Only},
      {"channels_last", YOLO8_FIELD(channels_last), "channels-last memory format (faster convolutions)", kYolo8Only},
      {"amp_dtype", YOLO8_FIELD(amp_dtype),
       "autocast dtype on CUDA: float16 (loss scaling, as Ultralytics) or bfloat16 (compute capability 8.0+, no "
       "scaling)",
       kYolo8Only},
      {"cfg", YOLO8_FIELD(cfg), "YAML file of settings applied before the command line"},
  };
  return kEntries;
}

#undef YOLO8_FIELD

// Reading goes through the same accessors; they do not modify.
template <typename T>
const T& read(const Settings& settings, Accessor<T> accessor) {
  return accessor(const_cast<Settings&>(settings));
}

const Entry* find_entry(const std::string& key) {
  for (const auto& entry : entries()) {
    if (key == entry.name) return &entry;
  }
  return nullptr;
}

std::string to_lower(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(), [](unsigned char c) { return std::tolower(c); });
  return text;
}

std::string trim(const std::string& text) {
  const auto first = text.find_first_not_of(" \t\r\n");
  if (first == std::string::npos) return "";
  const auto last = text.find_last_not_of(" \t\r\n");
  return text.substr(first, last - first + 1);
}

[[noreturn]] void bad_value(const std::string& key, const std::string& value, const std::string& expected,
                            const std::string& origin) {
  throw SettingsError(origin + ": setting '" + key + "' expects " + expected + ", got '" + value + "'");
}

bool parse_bool(const std::string& key, const std::string& value, const std::string& origin) {
  const std::string lowered = to_lower(value);
  if (lowered == "true" || lowered == "1" || lowered == "yes" || lowered == "on") return true;
  if (lowered == "false" || lowered == "0" || lowered == "no" || lowered == "off") return false;
  bad_value(key, value, "true or false", origin);
}

int parse_int(const std::string& key, const std::string& value, const std::string& origin) {
  try {
    size_t used = 0;
    const long long parsed = std::stoll(value, &used);
    if (used != value.size() || parsed < std::numeric_limits<int>::min() || parsed > std::numeric_limits<int>::max()) {
      throw std::invalid_argument(value);
    }
    return static_cast<int>(parsed);
  } catch (const std::exception&) {
    bad_value(key, value, "an integer", origin);
  }
}

uint64_t parse_uint64(const std::string& key, const std::string& value, const std::string& origin) {
  try {
    size_t used = 0;
    const long long parsed = std::stoll(value, &used);
    if (used != value.size() || parsed < 0) throw std::invalid_argument(value);
    return static_cast<uint64_t>(parsed);
  } catch (const std::exception&) {
    bad_value(key, value, "a non-negative integer", origin);
  }
}

double parse_double(const std::string& key, const std::string& value, const std::string& origin) {
  try {
    size_t used = 0;
    const double parsed = std::stod(value, &used);
    if (used != value.size() || !std::isfinite(parsed)) throw std::invalid_argument(value);
    return parsed;
  } catch (const std::exception&) {
    bad_value(key, value, "a number", origin);
  }
}

// Accepts 0,2 / [0, 2] / "0 2".
std::vector<int> parse_int_list(const std::string& key, const std::string& value, const std::string& origin) {
  std::string cleaned;
  for (char c : value) cleaned += (c == '[' || c == ']' || c == ',') ? ' ' : c;
  std::istringstream stream(cleaned);
  std::vector<int> parsed;
  std::string token;
  while (stream >> token) {
    try {
      parsed.push_back(parse_int(key, token, origin));
    } catch (const SettingsError&) {
      bad_value(key, value, "a list of integers like 0,2", origin);
    }
  }
  return parsed;
}

std::string format_double(double value) {
  std::ostringstream stream;
  stream.precision(10);
  stream << value;
  return stream.str();
}

bool is_null_text(const std::string& value) {
  const std::string lowered = to_lower(value);
  return lowered.empty() || lowered == "null" || lowered == "none" || lowered == "~";
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> previous(b.size() + 1), current(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) previous[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    current[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t substitution = previous[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      current[j] = std::min({previous[j] + 1, current[j - 1] + 1, substitution});
    }
    std::swap(previous, current);
  }
  return previous[b.size()];
}

void check_choice(const std::string& key, const std::string& value, const std::vector<std::string>& choices) {
  if (std::find(choices.begin(), choices.end(), value) != choices.end()) return;
  std::string joined;
  for (const auto& choice : choices) joined += (joined.empty() ? "" : ", ") + choice;
  throw SettingsError("setting '" + key + "' must be one of " + joined + ", got '" + value + "'");
}

void check(bool condition, const std::string& key, const std::string& message) {
  if (!condition) throw SettingsError("setting '" + key + "' " + message);
}

// The component structs validate themselves with std::invalid_argument("KEY: what"); KEY is the user's key.
template <typename Function>
void check_component(Function&& function) {
  try {
    function();
  } catch (const std::invalid_argument& error) {
    const std::string message = error.what();
    const size_t colon = message.find(": ");
    if (colon == std::string::npos) throw SettingsError(message);
    throw SettingsError("setting '" + message.substr(0, colon) + "' " + message.substr(colon + 2));
  }
}

std::string cache_text(data::CacheMode mode) {
  return mode == data::CacheMode::kNone ? "false" : data::to_string(mode);  // default.yaml's spelling
}

}  // namespace

int parse_int_setting(const std::string& key, const std::string& value, const std::string& origin) {
  return parse_int(key, value, origin);
}

std::vector<int> parse_int_list_setting(const std::string& key, const std::string& value, const std::string& origin) {
  return parse_int_list(key, value, origin);
}

const std::vector<SettingInfo>& setting_infos() {
  static const std::vector<SettingInfo> kInfos = [] {
    std::vector<SettingInfo> infos;
    for (const auto& entry : entries()) {
      const SettingType type = std::visit(
          [](auto member) {
            using Field = std::remove_reference_t<decltype(member(std::declval<Settings&>()))>;
            if constexpr (std::is_same_v<Field, bool>) return SettingType::kBool;
            if constexpr (std::is_same_v<Field, int> || std::is_same_v<Field, int64_t> ||
                          std::is_same_v<Field, uint64_t>) {
              return SettingType::kInt;
            }
            if constexpr (std::is_same_v<Field, double>) return SettingType::kFloat;
            if constexpr (std::is_same_v<Field, std::string> || std::is_same_v<Field, data::CacheMode>) {
              return SettingType::kString;
            }
            return SettingType::kIntList;
          },
          entry.member);
      infos.push_back({entry.name, type, entry.help, entry.resumable, entry.secret});
    }
    return infos;
  }();
  return kInfos;
}

bool is_yolo8_only_setting(const std::string& key) {
  const Entry* entry = find_entry(key);
  return entry != nullptr && entry->yolo8_only;
}

std::vector<int> parse_device_ids(const std::string& device) {
  const std::string lowered = to_lower(trim(device));
  if (lowered.empty() || lowered == "cpu") return {};
  std::string cleaned;
  for (char c : lowered) cleaned += (c == ',' || c == '[' || c == ']') ? ' ' : c;
  std::istringstream stream(cleaned);
  std::vector<int> ids;
  std::string token;
  while (stream >> token) {
    if (token.rfind("cuda:", 0) == 0) token = token.substr(5);
    const bool digits = !token.empty() && token.size() <= 6 &&
                        std::all_of(token.begin(), token.end(), [](unsigned char c) { return std::isdigit(c); });
    if (!digits) {
      throw SettingsError("setting 'device' must be cpu, a GPU index like 0, or a list like 0,1; got '" + device + "'");
    }
    ids.push_back(std::stoi(token));
  }
  if (ids.empty()) throw SettingsError("setting 'device' lists no GPU index: '" + device + "'");
  return ids;
}

std::vector<int> Settings::device_ids() const { return parse_device_ids(device); }

void set_setting(Settings& settings, const std::string& raw_key, const std::string& raw_value,
                 const std::string& origin) {
  std::string key = trim(raw_key);
  std::replace(key.begin(), key.end(), '-', '_');
  const Entry* entry = find_entry(key);
  // An Ultralytics args.yaml or habit: its keys yolo8 has no setting for are taken at their defaults only.
  for (const auto& extra : ultralytics_only_keys()) {
    if (entry != nullptr) break;
    if (key != extra.name) continue;
    if (is_ultralytics_default(extra, trim(raw_value))) return;
    std::string default_text = ultralytics_args_yaml({{extra.name, extra.value}});
    default_text = trim(default_text.substr(default_text.find(':') + 1));
    throw SettingsError(origin + ": setting '" + key +
                        "' is Ultralytics' (segment, classify, pose, video, tracking or another export format's); "
                        "yolo8 does not implement it and takes only its default " +
                        default_text + ", got '" + trim(raw_value) + "'");
  }
  if (entry == nullptr) {
    std::string message = origin + ": unknown setting '" + key + "'";
    const auto suggestions = closest_setting_names(key);
    if (!suggestions.empty()) {
      message += "; did you mean ";
      for (size_t i = 0; i < suggestions.size(); ++i) {
        message += (i ? (i + 1 == suggestions.size() ? " or " : ", ") : "") + ("'" + suggestions[i] + "'");
      }
      message += "?";
    }
    throw SettingsError(message + " (yolo8 help lists every setting)");
  }
  const std::string value = trim(raw_value);
  if (key == "imgsz") settings.imgsz_hw.clear();
  if (is_null_text(value)) {
    // null resets to the default, as an Ultralytics cfg with `key: null` means.
    const Settings defaults;
    std::visit([&](auto member) { member(settings) = read(defaults, member); }, entry->member);
    return;
  }
  if (key == "imgsz" && value.find_first_of(",[") != std::string::npos) {
    // imgsz=640,480 is height, width (Ultralytics' order); the square size keeps the longer side.
    const std::vector<int> sizes = parse_int_list(key, value, origin);
    if (sizes.empty() || sizes.size() > 2)
      bad_value(key, value, "one size like 640, or height,width like 640,480", origin);
    settings.loader.imgsz = *std::max_element(sizes.begin(), sizes.end());
    if (sizes.size() == 2 && sizes[0] != sizes[1]) settings.imgsz_hw = sizes;
    return;
  }
  std::visit(
      [&](auto member) {
        auto& field = member(settings);
        using Field = std::remove_reference_t<decltype(field)>;
        if constexpr (std::is_same_v<Field, bool>) {
          field = parse_bool(key, value, origin);
        } else if constexpr (std::is_same_v<Field, int> || std::is_same_v<Field, int64_t>) {
          field = parse_int(key, value, origin);
        } else if constexpr (std::is_same_v<Field, uint64_t>) {
          field = parse_uint64(key, value, origin);
        } else if constexpr (std::is_same_v<Field, double>) {
          if (key == "batch" && to_lower(value) == "auto") {
            field = -1;
          } else {
            field = parse_double(key, value, origin);
          }
        } else if constexpr (std::is_same_v<Field, std::string>) {
          field = value;
        } else if constexpr (std::is_same_v<Field, data::CacheMode>) {
          try {
            field = data::parse_cache_mode(value);
          } catch (const std::invalid_argument&) {
            bad_value(key, value, "false, ram or disk", origin);
          }
        } else {
          field = parse_int_list(key, value, origin);
        }
      },
      entry->member);
}

std::string get_setting(const Settings& settings, const std::string& key) {
  const Entry* entry = find_entry(key);
  if (entry == nullptr) throw SettingsError("unknown setting '" + key + "'");
  if (key == "imgsz" && settings.imgsz_hw.size() == 2) {
    return std::to_string(settings.imgsz_hw[0]) + "," + std::to_string(settings.imgsz_hw[1]);
  }
  return std::visit(
      [&](auto member) -> std::string {
        const auto& field = read(settings, member);
        using Field = std::remove_cv_t<std::remove_reference_t<decltype(field)>>;
        if constexpr (std::is_same_v<Field, bool>) {
          return field ? "true" : "false";
        } else if constexpr (std::is_same_v<Field, int> || std::is_same_v<Field, int64_t> ||
                             std::is_same_v<Field, uint64_t>) {
          return std::to_string(field);
        } else if constexpr (std::is_same_v<Field, double>) {
          return format_double(field);
        } else if constexpr (std::is_same_v<Field, std::string>) {
          return field;
        } else if constexpr (std::is_same_v<Field, data::CacheMode>) {
          return cache_text(field);
        } else {
          std::string joined;
          for (size_t i = 0; i < field.size(); ++i) joined += (i ? "," : "") + std::to_string(field[i]);
          return joined;
        }
      },
      entry->member);
}

std::vector<std::string> closest_setting_names(const std::string& key) {
  std::vector<std::pair<size_t, std::string>> scored;
  for (const auto& entry : entries()) {
    const std::string name = entry.name;
    size_t distance = edit_distance(key, name);
    // A key that contains a name (or is contained) is close whatever its length.
    if (!key.empty() && (name.find(key) != std::string::npos || key.find(name) != std::string::npos)) {
      distance = std::min<size_t>(distance, 1);
    }
    const size_t limit = std::max<size_t>(2, std::max(key.size(), name.size()) / 3);
    if (distance <= limit) scored.emplace_back(distance, name);
  }
  std::stable_sort(scored.begin(), scored.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<std::string> names;
  for (size_t i = 0; i < scored.size() && i < 3; ++i) names.push_back(scored[i].second);
  return names;
}

void apply_yaml_text(Settings& settings, const std::string& text, const std::string& origin) {
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& error) {
    throw SettingsError(origin + ":" + std::to_string(error.mark.line + 1) + ": invalid YAML: " + error.msg);
  }
  if (root.IsNull()) return;
  if (!root.IsMap()) throw SettingsError(origin + ": expected a mapping of setting: value");
  for (const auto& item : root) {
    const std::string key = item.first.as<std::string>();
    const std::string where = origin + ":" + std::to_string(item.first.Mark().line + 1);
    std::string value;
    if (item.second.IsSequence()) {
      for (const auto& element : item.second) value += (value.empty() ? "" : ",") + element.as<std::string>();
    } else if (item.second.IsScalar()) {
      value = item.second.as<std::string>();
    } else if (!item.second.IsNull()) {
      throw SettingsError(where + ": setting '" + key + "' expects a plain value");
    }
    if (key == "cfg") continue;       // a cfg file does not chain to another
    if (key == "save_dir") continue;  // an Ultralytics args.yaml's run folder: a new run picks its own, as there
    set_setting(settings, key, value, where);
  }
}

void apply_yaml_file(Settings& settings, const std::string& path) {
  std::ifstream in(path);
  if (!in || std::filesystem::is_directory(path)) throw SettingsError("cannot read settings file '" + path + "'");
  std::ostringstream text;
  text << in.rdbuf();
  apply_yaml_text(settings, text.str(), path);
}

void validate(LeaseSettings& lease) {
  const std::string quota = to_lower(lease.quota);
  check(quota == "local" || quota == "off" || quota.rfind("http://", 0) == 0 || quota.rfind("https://", 0) == 0,
        "quota",
        "must be local, off or a URL like http://quotad:8470 or https://quotad:8470 (the CA in $YOLO8_QUOTA_CA_FILE), "
        "or the URLs of quotad's replicas, comma-separated; got '" +
            lease.quota + "'");
  // each URL of a list, here rather than when the lease is asked for: a bad one is a bad setting (exit 2)
  if (quota != "local" && quota != "off") check_component([&] { quota::parse_endpoints(lease.quota); });
  if (quota == "local" || quota == "off") lease.quota = quota;
  check(lease.quota_token.empty() || lease.quota_token_file.empty(), "quota_token",
        "and 'quota_token_file' are both set: give the token one way");
  lease.priority = to_lower(lease.priority);
  check_choice("priority", lease.priority, {"low", "normal", "high", "critical"});
  check(std::isfinite(lease.quota_retry_s) && lease.quota_retry_s > 0, "quota_retry_s", "must be > 0 seconds");
  check(std::isfinite(lease.gpu_mem) && lease.gpu_mem >= 0, "gpu_mem", "must be >= 0 GiB");
  check(std::isfinite(lease.memory_gib) && lease.memory_gib >= 0, "memory_gib", "must be >= 0 GiB");
  // Whether the model may share is the policy's answer (quotad refuses with the reason); without a quota
  // service there is nothing to share.
  check(!lease.shared || lease.quota != "off", "shared",
        "needs a quota service to share a GPU with (quota=local or a quotad URL), not quota=off");
  check(lease.memory_gib == 0 || lease.quota != "off", "memory_gib",
        "is the lease's memory; with quota=off use gpu_mem for the budget");
}

void validate(Settings& settings) {
  settings.mode = to_lower(settings.mode);
  check_choice("task", settings.task, {"detect"});
  // Which modes exist is the mode table's (trainer/modes/mode_table.cpp): the command line accepts only those, and
  // resolve_settings sets the mode from it.
  check(!settings.mode.empty(), "mode", "must name a mode");
  check(settings.epochs >= 1, "epochs", "must be at least 1");
  check(settings.time >= 0, "time", "must be >= 0 hours");
  check(settings.patience >= 0, "patience", "must be >= 0");
  check(settings.batch == -1 || (settings.batch > 0 && settings.batch < 1) ||
            (settings.batch >= 1 && std::floor(settings.batch) == settings.batch),
        "batch", "must be a whole number >= 1, -1/auto, or a fraction in (0, 1)");
  // The model's stride is not known yet (train rounds imgsz up to it): any whole size passes the stride rule.
  data::LoaderConfig loader = settings.loader;
  loader.stride = 1;
  check_component([&] { data::validate(loader); });
  if (!settings.imgsz_hw.empty()) {
    check(settings.mode == "predict" || settings.mode == "export", "imgsz",
          "takes one size for " + settings.mode + ", got " + get_setting(settings, "imgsz") +
              ": train and val use square images, as Ultralytics does (rect=true gives rectangular batches); "
              "height,width is for predict and export");
    for (const int side : settings.imgsz_hw) {
      loader.imgsz = side;
      check_component([&] { data::validate(loader); });
    }
  }
  check_component([&] { data::validate(settings.augment); });
  check_component([&] { validate(settings.optim); });
  check_component([&] { validate(settings.loss); });
  validate(settings.lease);
  parse_device_ids(settings.device);
  const std::string resume = to_lower(settings.resume);
  if (resume == "false" || resume == "true" || resume == "auto") settings.resume = resume;
  const std::string pretrained = to_lower(settings.pretrained);
  if (pretrained == "false" || pretrained == "true") settings.pretrained = pretrained;
  check(settings.conf == -1 || (settings.conf >= 0 && settings.conf <= 1), "conf", "must be in [0, 1]");
  check(settings.iou >= 0 && settings.iou <= 1, "iou", "must be in [0, 1]");
  check(settings.max_det >= 1, "max_det", "must be at least 1");
  check_choice("split", settings.split, {"train", "val", "test"});
  check(!settings.augment_tta, "augment", "(test-time augmentation) is not implemented");
  check(!settings.profile, "profile", "(speed profiling during training) is not implemented; use yolo8 profile");
  check(settings.label_smoothing == 0, "label_smoothing",
        "is not implemented: must be 0, got " + format_double(settings.label_smoothing));
  check_choice("format", settings.format, {"state_dict", "onnx", "torchscript"});
  settings.amp_dtype = to_lower(settings.amp_dtype);
  check_choice("amp_dtype", settings.amp_dtype, {"float16", "bfloat16"});
  check(settings.threads >= 0, "threads", "must be >= 0");
  if (!settings.freeze.empty()) parse_int_list("freeze", settings.freeze, "setting");
}

Settings resolve_settings(const std::vector<std::pair<std::string, std::string>>& pairs, const std::string& mode) {
  Settings settings;
  settings.mode = mode;
  // Mode defaults, as the reference's `val` sets them: rectangular batches unless rect=false.
  if (mode == "val") settings.loader.rect = true;
  // These modes need weights the user names; yolov8n.yaml is the default only where fresh weights make sense.
  const bool needs_weights = mode == "predict" || mode == "val" || mode == "export";
  if (needs_weights) settings.model.clear();
  for (const auto& [key, value] : pairs) {
    if (key == "cfg" && !is_null_text(value)) {
      apply_yaml_file(settings, value);
      settings.cfg = value;
    }
  }
  for (const auto& [key, value] : pairs) {
    if (key != "cfg") set_setting(settings, key, value);
  }
  settings.mode = mode;
  validate(settings);
  if (needs_weights && settings.model.empty()) {
    throw SettingsError("setting 'model' is required for " + mode +
                        ": model=PATH.pt, e.g. model=runs/detect/train/weights/best.pt");
  }
  const std::string extension = to_lower(std::filesystem::path(settings.model).extension().string());
  if ((mode == "predict" || mode == "val") && (extension == ".yaml" || extension == ".yml")) {
    throw SettingsError("setting 'model' of " + mode + " must be trained weights (.pt), got '" + settings.model +
                        "': a model YAML has random weights");
  }
  if (extension == ".onnx" && mode != "predict") {
    throw SettingsError("setting 'model' is an ONNX file ('" + settings.model + "'), which only predict runs; " + mode +
                        " needs the .pt weights it was exported from");
  }
  return settings;
}

std::set<std::string> given_setting_keys(const std::vector<std::pair<std::string, std::string>>& pairs) {
  std::set<std::string> keys;
  for (const auto& [key, value] : pairs) {
    keys.insert(key);
    if (key != "cfg" || is_null_text(value)) continue;
    try {
      const YAML::Node root = YAML::LoadFile(value);
      if (!root.IsMap()) continue;
      for (const auto& item : root) keys.insert(item.first.as<std::string>());
    } catch (const YAML::Exception& error) {
      throw SettingsError(value + ": invalid YAML: " + error.msg);
    }
  }
  return keys;
}

Settings merge_resumed_settings(const Settings& saved, const Settings& requested) {
  const Settings defaults;
  Settings merged = saved;
  for (const auto& entry : entries()) {
    if (!entry.resumable) continue;
    const std::string value = get_setting(requested, entry.name);
    if (value != get_setting(defaults, entry.name)) set_setting(merged, entry.name, value);
  }
  // The token comes one way: one given now (quota_token= or $YOLO8_QUOTA_TOKEN) replaces the file the run was
  // saved with, rather than both being refused.
  if (!requested.lease.quota_token.empty() && requested.lease.quota_token_file.empty()) {
    merged.lease.quota_token_file.clear();
  }
  merged.resume = requested.resume;
  return merged;
}

void warn_of_secrets_on_the_command_line(const std::vector<std::pair<std::string, std::string>>& pairs) {
  for (const auto& [key, value] : pairs) {
    const Entry* entry = find_entry(key);
    if (entry == nullptr || !entry->secret || is_null_text(value)) continue;
    std::cerr
        << "yolo8: warning: " << entry->name << "= on the command line shows in `ps` and in the Job's spec; "
        << "set $YOLO8_QUOTA_TOKEN (from a Kubernetes Secret), give quota_token_file= (a mounted Secret) or put it in "
        << "a cfg=FILE.yaml only you can read. "
        << "It is never written to args.yaml, yolo8_args.yaml, the checkpoints or the console.\n";
  }
}

std::string settings_to_yaml(const Settings& settings) {
  std::ostringstream out;
  for (const auto& entry : entries()) {
    const std::string value = entry.secret ? std::string() : get_setting(settings, entry.name);
    YAML::Emitter emitter;
    emitter << value;
    out << entry.name << ": " << (value.empty() ? std::string("null") : std::string(emitter.c_str())) << "\n";
  }
  return out.str();
}

std::string settings_table(const Settings& settings, bool all) {
  const Settings defaults;
  std::vector<std::pair<std::string, std::string>> rows;
  size_t width = 7;
  for (const auto& entry : entries()) {
    const std::string value = get_setting(settings, entry.name);
    if (!all && value == get_setting(defaults, entry.name) && std::string(entry.name) != "model" &&
        std::string(entry.name) != "data") {
      continue;
    }
    rows.emplace_back(entry.name, value.empty() ? "-" : entry.secret ? "(set, not shown)" : value);
    width = std::max(width, rows.back().first.size());
  }
  std::ostringstream out;
  out << "  " << std::string("setting").append(width - 7, ' ') << "  value\n";
  for (const auto& [name, value] : rows) {
    out << "  " << name << std::string(width - name.size(), ' ') << "  " << value << "\n";
  }
  if (!all) out << "  (every other setting at its default; yolo8_args.yaml has them all)\n";
  return out.str();
}

}  // namespace yolo8
