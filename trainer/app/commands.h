#pragma once
// One function per `yolo8` mode; run_mode dispatches.

#include "trainer/app/cli.h"

namespace yolo8 {

int run_mode(const CommandLine& command);

}  // namespace yolo8
