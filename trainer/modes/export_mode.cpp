#include "trainer/modes/export_mode.h"

#include <iostream>

#include "common/exit_codes.h"
#include "models/weights.h"
#include "trainer/modes/mode_args.h"
#include "trainer/modes/modes.h"
#include "trainer/support/model_loading.h"
#ifdef YOLO8_HAVE_ONNX
#include "trainer/export/onnx_export.h"
#include "trainer/export/torchscript_export.h"
#endif

namespace yolo8 {
namespace {

bool parse_flag(const std::string& key, const std::string& value) {
  if (value == "true" || value == "True" || value == "1") return true;
  if (value == "false" || value == "False" || value == "0") return false;
  throw SettingsError("setting '" + key + "' must be true or false, got '" + value + "'");
}

}  // namespace

int run_export(const Settings& settings, const std::map<std::string, std::string>& keys) {
  if (settings.out.empty()) throw SettingsError("setting 'out' is required for export: out=PATH");
  if (settings.format == "state_dict") {
    for (const auto& [key, value] : keys) {
      if (key != "imgsz") throw SettingsError("setting '" + key + "' applies to format=onnx only");
    }
  }
  int64_t height = settings.loader.imgsz, width = settings.loader.imgsz;
  if (keys.count("imgsz")) {
    const std::vector<int> sides = parse_int_list_setting("imgsz", keys.at("imgsz"));
    if (sides.empty() || sides.size() > 2) throw SettingsError("setting 'imgsz' must be H or H,W");
    height = sides.front();
    width = sides.back();
  }
  const LoadedModel loaded = app::as_input_error([&] { return load_any_model(settings.model); });

  if (settings.format == "state_dict") {
    const size_t tensors = export_state_dict(loaded.model, settings.out);
    std::cout << "Exported " << tensors << " tensors (state_dict, Ultralytics names) to " << settings.out << "\n";
    return kExitCompleted;
  }
#ifdef YOLO8_HAVE_ONNX
  try {
    if (settings.format == "torchscript") {
      if (keys.count("opset") || keys.count("dynamic")) {
        throw SettingsError("settings 'opset' and 'dynamic' apply to format=onnx only");
      }
      if (settings.half) throw SettingsError("setting 'half' must be false for format=torchscript (float32 only)");
      export_torchscript(loaded.model, height, width, settings.out);
      std::cout << "Exported TorchScript (" << height << "x" << width << ", traced) to " << settings.out << "\n";
      return kExitCompleted;
    }
    OnnxExportOptions options;
    options.height = height;
    options.width = width;
    if (keys.count("opset")) options.opset = parse_int_setting("opset", keys.at("opset"));
    if (keys.count("dynamic")) options.dynamic = parse_flag("dynamic", keys.at("dynamic"));
    options.half = settings.half;
    options.names = loaded.names;
    options.source = settings.model;
    options.version = YOLO8_VERSION;
    const OnnxExportSummary summary = export_onnx(loaded.model, options, settings.out);
    std::cout << "Exported ONNX (opset " << options.opset << ", input 1x3x" << height << "x" << width << ", output0 1x"
              << 4 + summary.nc << "x" << summary.anchors << ", " << summary.nodes << " nodes) to " << settings.out
              << "\n";
    return kExitCompleted;
  } catch (const std::invalid_argument& error) {
    throw SettingsError(error.what());
  }
#else
  throw SettingsError("format=" + settings.format +
                      " is not in this build: it needs Debian's libonnx-dev at build time (scripts/setup.sh)");
#endif
}

int export_mode(const CommandLine& command) {
  // Export-only keys (opset, dynamic, imgsz as H,W) are read by run_export itself.
  auto pairs = command.pairs;
  const auto keys = take_keys(pairs, {"opset", "dynamic", "imgsz"});
  return run_export(settings_for_mode(pairs, "export"), keys);
}

}  // namespace yolo8
