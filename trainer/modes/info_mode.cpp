// `yolo8 info model=...`: a model's layers, parameters and GFLOPs.

#include <filesystem>
#include <iostream>

#include "common/exit_codes.h"
#include "models/model_info.h"
#include "trainer/modes/mode_args.h"
#include "trainer/modes/modes.h"

namespace yolo8 {

int info_mode(const CommandLine& command) {
  const Settings settings = settings_for_mode(command.pairs, "info");
  LoadedModel loaded = load_model_for_cli(settings.model);
  const std::string name = std::filesystem::path(settings.model).stem().string();
  std::cout << format_model_info(model_info(loaded.model, settings.loader.imgsz), name);
  return kExitCompleted;
}

}  // namespace yolo8
