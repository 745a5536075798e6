#include "trainer/app/settings.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>
#include <sstream>
#include <variant>

namespace yolo8 {
namespace {

using Member = std::variant<bool Settings::*, int Settings::*, double Settings::*, std::string Settings::*,
                            std::vector<int> Settings::*>;

struct Entry {
  const char* name;
  Member member;
  const char* help;
};

// The one table behind parsing, printing, args.yaml and the default.yaml test.
const std::vector<Entry>& entries() {
  static const std::vector<Entry> kEntries = {
      {"task", &Settings::task, "task; only detect is implemented"},
      {"mode", &Settings::mode, "train, val, predict, export, info, profile, data"},
      {"model", &Settings::model, "model YAML (yolov8n.yaml ... yolov8x.yaml or a path) or weights (.pt)"},
      {"data", &Settings::data, "dataset YAML in Ultralytics format"},
      {"epochs", &Settings::epochs, "number of epochs to train"},
      {"time", &Settings::time, "hours to train; overrides epochs when > 0"},
      {"patience", &Settings::patience, "epochs without fitness improvement before stopping early"},
      {"batch", &Settings::batch, "images per batch; -1 or auto fits the memory budget; 0.7 uses 70% of it"},
      {"imgsz", &Settings::imgsz, "training and validation image size in pixels"},
      {"save", &Settings::save, "save checkpoints and predictions"},
      {"save_period", &Settings::save_period, "save a checkpoint every N epochs; -1 disables"},
      {"cache", &Settings::cache, "cache decoded images: false, ram or disk"},
      {"device", &Settings::device, "cpu, a CUDA device 0, or several 0,1 (one process each); empty = auto"},
      {"workers", &Settings::workers, "data loading threads (per process)"},
      {"project", &Settings::project, "folder holding the run folders"},
      {"name", &Settings::name, "run folder name; empty = the mode's name, incremented"},
      {"exist_ok", &Settings::exist_ok, "reuse an existing run folder instead of incrementing"},
      {"pretrained", &Settings::pretrained, "true, false, or a .pt whose matching tensors are transferred"},
      {"optimizer", &Settings::optimizer, "SGD, Adam, AdamW or auto"},
      {"verbose", &Settings::verbose, "print details"},
      {"seed", &Settings::seed, "random seed"},
      {"deterministic", &Settings::deterministic, "deterministic algorithms (bitwise-reproducible on CPU)"},
      {"single_cls", &Settings::single_cls, "treat every class as one"},
      {"rect", &Settings::rect, "rectangular training batches"},
      {"cos_lr", &Settings::cos_lr, "cosine learning-rate schedule instead of linear"},
      {"close_mosaic", &Settings::close_mosaic, "turn mosaic off for the last N epochs"},
      {"resume", &Settings::resume, "false, true (latest run), auto (this name's run if resumable), or PATH/last.pt"},
      {"amp", &Settings::amp, "automatic mixed precision on CUDA"},
      {"fraction", &Settings::fraction, "fraction of the training set to use"},
      {"profile", &Settings::profile, "profile speeds during training"},
      {"freeze", &Settings::freeze, "freeze the first N layers, or a list of layer indices 0,3,5"},
      {"val", &Settings::val, "validate after every epoch"},
      {"split", &Settings::split, "dataset split for val mode: val, test or train"},
      {"save_json", &Settings::save_json, "write COCO-format predictions JSON during validation"},
      {"conf", &Settings::conf, "confidence threshold; -1 = 0.25 for predict, 0.001 for val"},
      {"iou", &Settings::iou, "NMS IoU threshold"},
      {"max_det", &Settings::max_det, "maximum detections per image"},
      {"half", &Settings::half, "half precision inference on CUDA"},
      {"plots", &Settings::plots, "write plots (curves, matrices, mosaics)"},
      {"source", &Settings::source, "image or folder for predict"},
      {"augment", &Settings::augment, "test-time augmentation for predict (not implemented: must be false)"},
      {"agnostic_nms", &Settings::agnostic_nms, "class-agnostic NMS"},
      {"classes", &Settings::classes, "keep only these class indices, e.g. 0,2"},
      {"save_txt", &Settings::save_txt, "save predictions as YOLO txt"},
      {"save_conf", &Settings::save_conf, "add confidences to saved txt"},
      {"show_labels", &Settings::show_labels, "draw labels on predicted images"},
      {"show_conf", &Settings::show_conf, "draw confidences on predicted images"},
      {"line_width", &Settings::line_width, "box line width; 0 = scaled to the image"},
      {"format", &Settings::format, "export format: state_dict"},
      {"out", &Settings::out, "output path (export, data synth)"},
      {"lr0", &Settings::lr0, "initial learning rate"},
      {"lrf", &Settings::lrf, "final learning rate as a fraction of lr0"},
      {"momentum", &Settings::momentum, "SGD momentum / Adam beta1"},
      {"weight_decay", &Settings::weight_decay, "weight decay at the nominal batch"},
      {"warmup_epochs", &Settings::warmup_epochs, "warm-up epochs (fractions allowed)"},
      {"warmup_momentum", &Settings::warmup_momentum, "momentum at the start of warm-up"},
      {"warmup_bias_lr", &Settings::warmup_bias_lr, "bias learning rate at the start of warm-up"},
      {"box", &Settings::box, "box loss gain"},
      {"cls", &Settings::cls, "class loss gain"},
      {"dfl", &Settings::dfl, "distribution focal loss gain"},
      {"label_smoothing", &Settings::label_smoothing, "label smoothing (fraction)"},
      {"nbs", &Settings::nbs, "nominal batch size: gradients are accumulated up to it"},
      {"hsv_h", &Settings::hsv_h, "hue augmentation (fraction)"},
      {"hsv_s", &Settings::hsv_s, "saturation augmentation (fraction)"},
      {"hsv_v", &Settings::hsv_v, "value augmentation (fraction)"},
      {"degrees", &Settings::degrees, "rotation (+/- degrees)"},
      {"translate", &Settings::translate, "translation (+/- fraction)"},
      {"scale", &Settings::scale, "scale gain (+/-)"},
      {"shear", &Settings::shear, "shear (+/- degrees)"},
      {"perspective", &Settings::perspective, "perspective (+/- fraction, 0 to 0.001)"},
      {"flipud", &Settings::flipud, "up-down flip probability"},
      {"fliplr", &Settings::fliplr, "left-right flip probability"},
      {"mosaic", &Settings::mosaic, "mosaic probability"},
      {"mixup", &Settings::mixup, "mixup probability"},
      {"quota", &Settings::quota, "GPU lease service: local (embedded, shared state file), off, or a quotad URL"},
      {"quota_db", &Settings::quota_db, "state file of the local quota mode; empty = ~/.cache/yolo8/quota.db"},
      {"quota_token", &Settings::quota_token, "bearer token for quotad; empty = $YOLO8_QUOTA_TOKEN"},
      {"team", &Settings::team, "team the lease is charged to"},
      {"user", &Settings::user, "user the lease is charged to; empty = $USER"},
      {"priority", &Settings::priority, "lease priority: low, normal, high or critical (audited emergency)"},
      {"preemptible", &Settings::preemptible, "allow a higher-priority job to preempt this run"},
      {"justification", &Settings::justification, "why a large model or critical priority is needed"},
      {"gpu_mem", &Settings::gpu_mem, "memory budget in GiB per GPU when quota=off; 0 = the whole device"},
      {"threads", &Settings::threads, "CPU threads for tensor math; 0 = all cores"},
      {"channels_last", &Settings::channels_last, "channels-last memory format (faster convolutions)"},
      {"cfg", &Settings::cfg, "YAML file of settings applied before the command line"},
  };
  return kEntries;
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
    if (used != value.size() || parsed < std::numeric_limits<int>::min() ||
        parsed > std::numeric_limits<int>::max()) {
      throw std::invalid_argument(value);
    }
    return static_cast<int>(parsed);
  } catch (const std::exception&) {
    bad_value(key, value, "an integer", origin);
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
            using Field = std::remove_reference_t<decltype(std::declval<Settings>().*member)>;
            if constexpr (std::is_same_v<Field, bool>) return SettingType::kBool;
            if constexpr (std::is_same_v<Field, int>) return SettingType::kInt;
            if constexpr (std::is_same_v<Field, double>) return SettingType::kFloat;
            if constexpr (std::is_same_v<Field, std::string>) return SettingType::kString;
            return SettingType::kIntList;
          },
          entry.member);
      infos.push_back({entry.name, type, entry.help});
    }
    return infos;
  }();
  return kInfos;
}

std::vector<int> Settings::device_ids() const {
  const std::string lowered = to_lower(trim(device));
  if (lowered.empty() || lowered == "cpu") return {};
  std::vector<int> ids;
  std::string cleaned = lowered;
  if (cleaned.rfind("cuda:", 0) == 0) cleaned = cleaned.substr(5);
  for (char& c : cleaned) {
    if (c == ',' || c == '[' || c == ']') c = ' ';
  }
  std::istringstream stream(cleaned);
  int id = 0;
  while (stream >> id) ids.push_back(id);
  return ids;
}

void set_setting(Settings& settings, const std::string& raw_key, const std::string& raw_value,
                 const std::string& origin) {
  std::string key = trim(raw_key);
  std::replace(key.begin(), key.end(), '-', '_');
  const Entry* entry = find_entry(key);
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
  if (is_null_text(value)) {
    // null resets to the default, as an Ultralytics cfg with `key: null` means.
    const Settings defaults;
    std::visit([&](auto member) { settings.*member = defaults.*member; }, entry->member);
    return;
  }
  std::visit(
      [&](auto member) {
        using Field = std::remove_reference_t<decltype(settings.*member)>;
        if constexpr (std::is_same_v<Field, bool>) {
          settings.*member = parse_bool(key, value, origin);
        } else if constexpr (std::is_same_v<Field, int>) {
          settings.*member = parse_int(key, value, origin);
        } else if constexpr (std::is_same_v<Field, double>) {
          if (key == "batch" && to_lower(value) == "auto") {
            settings.*member = -1;
          } else {
            settings.*member = parse_double(key, value, origin);
          }
        } else if constexpr (std::is_same_v<Field, std::string>) {
          settings.*member = value;
        } else {
          settings.*member = parse_int_list(key, value, origin);
        }
      },
      entry->member);
}

std::string get_setting(const Settings& settings, const std::string& key) {
  const Entry* entry = find_entry(key);
  if (entry == nullptr) throw SettingsError("unknown setting '" + key + "'");
  return std::visit(
      [&](auto member) -> std::string {
        const auto& field = settings.*member;
        using Field = std::remove_cv_t<std::remove_reference_t<decltype(field)>>;
        if constexpr (std::is_same_v<Field, bool>) {
          return field ? "true" : "false";
        } else if constexpr (std::is_same_v<Field, int>) {
          return std::to_string(field);
        } else if constexpr (std::is_same_v<Field, double>) {
          return format_double(field);
        } else if constexpr (std::is_same_v<Field, std::string>) {
          return field;
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
  std::stable_sort(scored.begin(), scored.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<std::string> names;
  for (size_t i = 0; i < scored.size() && i < 3; ++i) names.push_back(scored[i].second);
  return names;
}

void apply_yaml_file(Settings& settings, const std::string& path) {
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const YAML::BadFile&) {
    throw SettingsError("cannot read settings file '" + path + "'");
  } catch (const YAML::Exception& error) {
    throw SettingsError(path + ":" + std::to_string(error.mark.line + 1) + ": invalid YAML: " + error.msg);
  }
  if (root.IsNull()) return;
  if (!root.IsMap()) throw SettingsError(path + ": expected a mapping of setting: value");
  for (const auto& item : root) {
    const std::string key = item.first.as<std::string>();
    const std::string origin = path + ":" + std::to_string(item.first.Mark().line + 1);
    std::string value;
    if (item.second.IsSequence()) {
      for (const auto& element : item.second) value += (value.empty() ? "" : ",") + element.as<std::string>();
    } else if (item.second.IsScalar()) {
      value = item.second.as<std::string>();
    } else if (!item.second.IsNull()) {
      throw SettingsError(origin + ": setting '" + key + "' expects a plain value");
    }
    if (key == "cfg") continue;  // a cfg file does not chain to another
    set_setting(settings, key, value, origin);
  }
}

void validate(Settings& settings) {
  settings.mode = to_lower(settings.mode);
  check_choice("task", settings.task, {"detect"});
  check_choice("mode", settings.mode, {"train", "val", "predict", "export", "info", "profile", "data"});
  check(settings.epochs >= 1, "epochs", "must be at least 1");
  check(settings.time >= 0, "time", "must be >= 0 hours");
  check(settings.patience >= 0, "patience", "must be >= 0");
  check(settings.batch == -1 || (settings.batch > 0 && settings.batch < 1) ||
            (settings.batch >= 1 && std::floor(settings.batch) == settings.batch),
        "batch", "must be a whole number >= 1, -1/auto, or a fraction in (0, 1)");
  check(settings.imgsz >= 32 && settings.imgsz <= 8192, "imgsz", "must be between 32 and 8192");
  settings.cache = to_lower(settings.cache);
  if (settings.cache == "true") settings.cache = "ram";
  check_choice("cache", settings.cache, {"false", "ram", "disk"});
  check(settings.workers >= 0, "workers", "must be >= 0");
  const std::string device = to_lower(trim(settings.device));
  if (!device.empty() && device != "cpu") {
    std::string digits = device.rfind("cuda:", 0) == 0 ? device.substr(5) : device;
    for (char c : digits) {
      check(std::isdigit(static_cast<unsigned char>(c)) || c == ',' || c == ' ' || c == '[' || c == ']', "device",
            "must be cpu, a GPU index like 0, or a list like 0,1; got '" + settings.device + "'");
    }
    check(!settings.device_ids().empty(), "device", "lists no GPU index");
  }
  const std::string optimizer = to_lower(settings.optimizer);
  check_choice("optimizer", optimizer, {"auto", "sgd", "adam", "adamw"});
  const std::string resume = to_lower(settings.resume);
  if (resume == "false" || resume == "true" || resume == "auto") settings.resume = resume;
  const std::string pretrained = to_lower(settings.pretrained);
  if (pretrained == "false" || pretrained == "true") settings.pretrained = pretrained;
  check(settings.fraction > 0 && settings.fraction <= 1, "fraction", "must be in (0, 1]");
  check(settings.close_mosaic >= 0, "close_mosaic", "must be >= 0");
  check(settings.conf == -1 || (settings.conf >= 0 && settings.conf <= 1), "conf", "must be in [0, 1]");
  check(settings.iou >= 0 && settings.iou <= 1, "iou", "must be in [0, 1]");
  check(settings.max_det >= 1, "max_det", "must be at least 1");
  check_choice("split", settings.split, {"train", "val", "test"});
  check(!settings.augment, "augment", "(test-time augmentation) is not implemented");
  check_choice("format", settings.format, {"state_dict"});
  check(settings.lr0 > 0, "lr0", "must be > 0");
  check(settings.lrf > 0 && settings.lrf <= 1, "lrf", "must be in (0, 1]");
  check(settings.momentum >= 0 && settings.momentum < 1, "momentum", "must be in [0, 1)");
  check(settings.weight_decay >= 0, "weight_decay", "must be >= 0");
  check(settings.warmup_epochs >= 0, "warmup_epochs", "must be >= 0");
  check(settings.nbs >= 1, "nbs", "must be >= 1");
  for (const auto& [key, value] : std::vector<std::pair<const char*, double>>{
           {"hsv_h", settings.hsv_h}, {"hsv_s", settings.hsv_s}, {"hsv_v", settings.hsv_v},
           {"translate", settings.translate}, {"flipud", settings.flipud}, {"fliplr", settings.fliplr},
           {"mosaic", settings.mosaic}, {"mixup", settings.mixup}, {"label_smoothing", settings.label_smoothing}}) {
    check(value >= 0 && value <= 1, key, "must be in [0, 1]");
  }
  check(settings.scale >= 0, "scale", "must be >= 0");
  check(settings.box >= 0 && settings.cls >= 0 && settings.dfl >= 0, "box/cls/dfl", "gains must be >= 0");
  const std::string quota = to_lower(settings.quota);
  check(quota == "local" || quota == "off" || quota.rfind("http://", 0) == 0 || quota.rfind("https://", 0) == 0,
        "quota", "must be local, off or a URL like http://quotad:8080; got '" + settings.quota + "'");
  if (quota == "local" || quota == "off") settings.quota = quota;
  settings.priority = to_lower(settings.priority);
  check_choice("priority", settings.priority, {"low", "normal", "high", "critical"});
  check(settings.gpu_mem >= 0, "gpu_mem", "must be >= 0 GiB");
  check(settings.threads >= 0, "threads", "must be >= 0");
  if (!settings.freeze.empty()) parse_int_list("freeze", settings.freeze, "setting");
}

Settings resolve_settings(const std::vector<std::pair<std::string, std::string>>& pairs,
                          const std::string& mode) {
  Settings settings;
  settings.mode = mode;
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
  return settings;
}

std::string settings_to_yaml(const Settings& settings) {
  std::ostringstream out;
  for (const auto& entry : entries()) {
    const std::string value = get_setting(settings, entry.name);
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
    rows.emplace_back(entry.name, value.empty() ? "-" : value);
    width = std::max(width, rows.back().first.size());
  }
  std::ostringstream out;
  out << "  " << std::string("setting").append(width - 7, ' ') << "  value\n";
  for (const auto& [name, value] : rows) {
    out << "  " << name << std::string(width - name.size(), ' ') << "  " << value << "\n";
  }
  if (!all) out << "  (every other setting at its default; args.yaml has them all)\n";
  return out.str();
}

}  // namespace yolo8
