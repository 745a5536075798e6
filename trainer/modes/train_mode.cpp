// `yolo8 train`: one training run (trainer/run/train_run.h), or with device=0,1,... one process per GPU that this
// one launches and waits for. Built only with OpenCV.

#include <cstdlib>
#include <iostream>

#include "trainer/modes/mode_args.h"
#include "trainer/modes/modes.h"
#include "trainer/run/launcher.h"
#include "trainer/run/train_run.h"

namespace yolo8 {

int train_mode(const CommandLine& command) {
  const Settings settings = settings_for_mode(command.pairs, "train");
  if (settings.device_ids().size() > 1 && std::getenv("RANK") == nullptr) {
    // device=0,1: one process per GPU, this one only launches and waits (signals are forwarded).
    std::cout << "Starting " << settings.device_ids().size() << " training processes (DDP)\n";
    return launch_local_workers(settings.device_ids(), command.args);
  }
  return run_train(settings);
}

}  // namespace yolo8
