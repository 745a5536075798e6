#include "trainer/cli/ultralytics_args.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <sstream>
#include <stdexcept>

namespace yolo8 {
namespace {

using Value = UltralyticsValue;

bool all_digits(const std::string& text) {
  return !text.empty() && std::all_of(text.begin(), text.end(), [](unsigned char c) { return std::isdigit(c); });
}

std::vector<int64_t> int_list(const std::string& text) {
  std::vector<int64_t> values;
  std::string cleaned = text;
  std::replace(cleaned.begin(), cleaned.end(), ',', ' ');
  std::istringstream stream(cleaned);
  for (int64_t value = 0; stream >> value;) values.push_back(value);
  return values;
}

// The value of one of our settings in Ultralytics' form. The type of the field decides, except where the two
// spell a meaning differently.
Value to_ultralytics(const Settings& settings, const SettingInfo& info, const std::string& save_dir) {
  const std::string& key = info.name;
  const std::string text = get_setting(settings, key);
  if (key == "name") return std::filesystem::path(save_dir).filename().string();  // as its trainer sets it
  if (key == "time") return settings.time > 0 ? Value(settings.time) : Value();
  if (key == "conf") return settings.conf >= 0 ? Value(settings.conf) : Value();
  if (key == "line_width") return settings.line_width > 0 ? Value(int64_t{settings.line_width}) : Value();
  if (key == "batch") return settings.batch_is_auto() ? int64_t{-1} : static_cast<int64_t>(settings.batch);
  if (key == "imgsz") {
    if (settings.imgsz_hw.size() == 2) return std::vector<int64_t>(settings.imgsz_hw.begin(), settings.imgsz_hw.end());
    return int64_t{settings.loader.imgsz};
  }
  if (key == "cache") return text == "false" ? Value(false) : Value(text);
  if (key == "device") {
    if (text.empty()) return {};
    return all_digits(text) ? Value(int64_t{std::stoll(text)}) : Value(text);  // device=0 is an int there
  }
  if (key == "pretrained") {
    if (text == "true" || text == "false") return text == "true";
    return text;
  }
  if (key == "resume") {
    if (text == "false" || text == "auto") return false;
    if (text == "true") return true;
    return text;
  }
  if (key == "freeze") {
    if (text.empty()) return {};
    const std::vector<int64_t> layers = int_list(text);
    if (all_digits(text) && layers.size() == 1) return layers[0];
    return layers;
  }
  if (key == "format") return text == "state_dict" ? std::string("torchscript") : text;
  switch (info.type) {
    case SettingType::kBool: return text == "true";
    case SettingType::kInt: return int64_t{std::stoll(text)};
    case SettingType::kFloat: return std::stod(text);
    case SettingType::kIntList: return text.empty() ? Value() : Value(int_list(text));
    case SettingType::kString: break;
  }
  return text.empty() ? Value() : Value(text);
}

// PyYAML reads a float only with a dot (1e-05 would be a string): shortest round-trip digits, then a dot.
std::string python_float(double value) {
  if (std::isnan(value)) return ".nan";
  if (std::isinf(value)) return value > 0 ? ".inf" : "-.inf";
  char buffer[40];
  for (int precision = 1; precision <= 17; ++precision) {
    std::snprintf(buffer, sizeof(buffer), "%.*g", precision, value);
    if (std::stod(buffer) == value) break;
  }
  std::string text = buffer;
  const size_t exponent = text.find('e');
  const std::string mantissa = text.substr(0, exponent);
  if (mantissa.find('.') == std::string::npos) {
    text.insert(exponent == std::string::npos ? text.size() : exponent, ".0");
  }
  return text;
}

// A string PyYAML would read as a bool, null, number or date when plain is quoted.
std::string python_string(const std::string& text) {
  static const char* const kSpecialWords[] = {"y", "n", "yes", "no", "true", "false", "on", "off", "null", "~"};
  std::string lowered = text;
  std::transform(lowered.begin(), lowered.end(), lowered.begin(), [](unsigned char c) { return std::tolower(c); });
  const bool special =
      std::find(std::begin(kSpecialWords), std::end(kSpecialWords), lowered) != std::end(kSpecialWords);
  const bool numeric_start = !text.empty() && (std::isdigit(static_cast<unsigned char>(text[0])) || text[0] == '+' ||
                                               text[0] == '-' || text[0] == '.');
  YAML::Emitter emitter;
  if (text.empty() || special || numeric_start) emitter << YAML::DoubleQuoted;
  emitter << text;
  return emitter.c_str();
}

}  // namespace

const std::vector<UltralyticsOnlyKey>& ultralytics_only_keys() {
  // Ultralytics 8.0.232's cfg/default.yaml: its keys yolo8 has no setting for, where each stands, its default.
  static const std::vector<UltralyticsOnlyKey> kKeys = {
      {"overlap_mask", "freeze", true},
      {"mask_ratio", "overlap_mask", int64_t{4}},
      {"dropout", "mask_ratio", 0.0},
      {"save_hybrid", "save_json", false},
      {"dnn", "half", false},
      {"vid_stride", "source", int64_t{1}},
      {"stream_buffer", "vid_stride", false},
      {"visualize", "stream_buffer", false},
      {"retina_masks", "classes", false},
      {"embed", "retina_masks", Value()},
      {"show", "embed", false},
      {"save_frames", "show", false},
      {"save_crop", "save_conf", false},
      {"show_boxes", "show_conf", true},
      {"keras", "format", false},
      {"optimize", "keras", false},
      {"int8", "optimize", false},
      {"dynamic", "int8", false},
      {"simplify", "dynamic", false},
      {"opset", "simplify", Value()},
      {"workspace", "opset", int64_t{4}},
      {"nms", "workspace", false},
      {"pose", "dfl", 12.0},
      {"kobj", "pose", 1.0},
      {"copy_paste", "mixup", 0.0},
      {"tracker", "cfg", std::string("botsort.yaml")},
  };
  return kKeys;
}

UltralyticsArgs ultralytics_args(const Settings& settings, const std::string& save_dir) {
  UltralyticsArgs args;
  const auto add_followers = [&](const std::string& key, const auto& self) -> void {
    for (const auto& extra : ultralytics_only_keys()) {
      if (key != extra.after) continue;
      args.emplace_back(extra.name, extra.value);
      self(extra.name, self);
    }
  };
  for (const auto& info : setting_infos()) {
    if (is_yolo8_only_setting(info.name) || info.secret) continue;
    args.emplace_back(info.name, to_ultralytics(settings, info, save_dir));
    add_followers(info.name, add_followers);
  }
  args.emplace_back("save_dir", save_dir);  // its trainer adds it last
  return args;
}

std::string ultralytics_args_yaml(const UltralyticsArgs& args) {
  std::ostringstream out;
  for (const auto& [key, value] : args) {
    out << key << ":";
    std::visit(
        [&](const auto& held) {
          using Held = std::decay_t<decltype(held)>;
          if constexpr (std::is_same_v<Held, std::monostate>) {
            out << " null\n";
          } else if constexpr (std::is_same_v<Held, bool>) {
            out << (held ? " true\n" : " false\n");
          } else if constexpr (std::is_same_v<Held, int64_t>) {
            out << " " << held << "\n";
          } else if constexpr (std::is_same_v<Held, double>) {
            out << " " << python_float(held) << "\n";
          } else if constexpr (std::is_same_v<Held, std::string>) {
            out << " " << python_string(held) << "\n";
          } else {
            if (held.empty()) out << " []";
            out << "\n";
            for (const int64_t item : held) out << "- " << item << "\n";
          }
        },
        value);
  }
  return out.str();
}

bool is_ultralytics_default(const UltralyticsOnlyKey& key, const std::string& value) {
  std::string lowered = value;
  std::transform(lowered.begin(), lowered.end(), lowered.begin(), [](unsigned char c) { return std::tolower(c); });
  const bool null_text = lowered.empty() || lowered == "null" || lowered == "none" || lowered == "~";
  return std::visit(
      [&](const auto& held) -> bool {
        using Held = std::decay_t<decltype(held)>;
        if constexpr (std::is_same_v<Held, std::monostate>) {
          return null_text;
        } else if constexpr (std::is_same_v<Held, bool>) {
          return held ? lowered == "true" : lowered == "false";
        } else if constexpr (std::is_same_v<Held, int64_t>) {
          return value == std::to_string(held);
        } else if constexpr (std::is_same_v<Held, double>) {
          try {
            size_t used = 0;
            return std::stod(value, &used) == held && used == value.size();
          } catch (const std::exception&) {
            return false;
          }
        } else if constexpr (std::is_same_v<Held, std::string>) {
          return value == held;
        } else {
          return null_text && held.empty();
        }
      },
      key.value);
}

}  // namespace yolo8
