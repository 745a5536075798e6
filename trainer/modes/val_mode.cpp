// `yolo8 val`: weights on a dataset split, the metrics table, the run folder with its plots. Built only with OpenCV.

#include <filesystem>
#include <iomanip>
#include <iostream>

#include "common/exit_codes.h"
#include "trainer/core/autocast.h"
#include "trainer/core/checkpoint.h"
#include "trainer/core/train_step.h"
#include "trainer/modes/mode_args.h"
#include "trainer/modes/modes.h"
#include "trainer/plots/plots.h"
#include "trainer/runtime/run_dir.h"
#include "trainer/runtime/threads.h"
#include "trainer/support/mode_support.h"

namespace yolo8 {
namespace fs = std::filesystem;
using app::as_input_error;
using app::Clock;
using app::seconds_since;

namespace {

int run_val(const Settings& settings) {
  configure_threads(settings);
  if (settings.data.empty()) throw SettingsError("setting 'data' is required for val");
  const torch::Device device = app::pick_device(settings);
  data::DatasetSpec spec = as_input_error([&] { return data::load_data_yaml(settings.data); });
  std::vector<std::string> names = settings.loader.single_cls ? std::vector<std::string>{"item"} : spec.names;
  LoadedModel loaded = load_any_model(settings.model, static_cast<int64_t>(names.size()));
  if (!loaded.names.empty() && !settings.loader.single_cls) names = loaded.names;
  DetectionModel model = loaded.model;
  prepare_for_inference(model, device);
  if (settings.channels_last) to_channels_last(*model);
  const auto index = app::load_split(spec, settings.split, settings, settings.verbose);
  const int stride = static_cast<int>(model->max_stride());
  const int batch = settings.batch >= 1 ? static_cast<int>(settings.batch) : 32;
  data::DataLoader loader(index, app::loader_config(settings, batch, stride, app::LoaderRole::kValidation, device),
                          settings.augment, false);
  ValConfig config;
  config.conf = settings.conf >= 0 ? settings.conf : 0.001;
  config.iou = settings.iou;
  config.max_det = settings.max_det;
  config.single_cls = settings.loader.single_cls;
  config.save_json = settings.save_json;
  DetectionValidator validator(model->nc(), names, config);
  // Like `yolo val`, every run gets its folder (runs/detect/val, val2, ...): plots, and predictions.json.
  const fs::path run_dir =
      make_run_dir(project_dir(settings.project, settings.task), "val", settings.name, settings.exist_ok);
  const auto start = Clock::now();
  const app::ValidationTimes times =
      app::run_validation(model, loader, validator, nullptr, device, settings.channels_last,
                          settings.half && device.is_cuda(), "val", settings.plots ? run_dir : fs::path(), names);
  const double seconds = seconds_since(start);
  std::cout << validator.table();
  std::cout << "Speed: " << std::fixed << std::setprecision(1) << 1000.0 * seconds / std::max<int64_t>(1, loader.size())
            << " ms per image at imgsz " << settings.loader.imgsz << " (loading, inference, NMS): " << times.per_image()
            << "\n";
  if (settings.plots) {
    app::try_plot("validation curves", [&] {
      plot_validation(run_dir.string(), validator.results().per_class, validator.confusion().matrix(), names);
    });
  }
  if (settings.save_json) {
    validator.write_json((run_dir / "predictions.json").string());
    std::cout << "Predictions written to " << (run_dir / "predictions.json").string() << "\n";
  }
  std::cout << "Results saved to " << run_dir.string() << "\n";
  return kExitCompleted;
}

}  // namespace

int val_mode(const CommandLine& command) { return run_val(settings_for_mode(command.pairs, "val")); }

}  // namespace yolo8
