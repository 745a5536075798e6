// `yolo8 data check data=d.yaml` and `yolo8 data synth out=DIR train=N val=M`. Built only with OpenCV.

#include <algorithm>
#include <iostream>

#include "common/exit_codes.h"
#include "data/dataset.h"
#include "data/synth.h"
#include "trainer/modes/mode_args.h"
#include "trainer/modes/modes.h"

namespace yolo8 {
namespace {

int run_data_check(const Settings& settings) {
  if (settings.data.empty()) throw SettingsError("setting 'data' is required: yolo8 data check data=d.yaml");
  const bool usable = data::check_dataset(settings.data, std::cout, std::max(1, settings.loader.workers));
  return usable ? kExitCompleted : kExitBadInput;
}

int run_data_synth(const std::string& out, int train_images, int val_images, int imgsz, uint64_t seed) {
  if (out.empty()) throw SettingsError("setting 'out' is required: yolo8 data synth out=DIR train=N val=M");
  const data::SynthResult result = data::synthesize_dataset(out, train_images, val_images, imgsz, seed);
  std::cout << "Wrote " << result.train_images << " training images (" << result.train_instances << " objects) and "
            << result.val_images << " validation images (" << result.val_instances << " objects): " << result.yaml_path
            << "\n";
  return kExitCompleted;
}

}  // namespace

int data_mode(const CommandLine& command) {
  auto pairs = command.pairs;
  if (command.action == "synth") {
    const auto keys = take_keys(pairs, {"train", "val"});
    Settings settings = resolve_settings(pairs, "data");
    const int imgsz = settings.loader.imgsz;
    return run_data_synth(settings.out, parse_count(keys, "train", 256), parse_count(keys, "val", 64), imgsz,
                          settings.loader.seed);
  }
  if (command.action != "check") {
    throw SettingsError("`yolo8 data` needs an action: check (data=d.yaml) or synth (out=DIR train=N val=M)");
  }
  const Settings settings = resolve_settings(pairs, "data");
  return run_data_check(settings);
}

}  // namespace yolo8
