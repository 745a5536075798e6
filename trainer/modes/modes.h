#pragma once
// One function per `yolo8` mode, each in its own file (train_mode.cpp, val_mode.cpp ...), each the `run` of the
// mode's entry in the mode table (mode_table.cpp): it reads the command's settings, does the work and returns the
// process exit code (common/exit_codes.h). train, val, predict and data read images and need OpenCV: without
// it, modes_without_opencv.cpp answers them with exit 2.

#include "trainer/cli/cli.h"

namespace yolo8 {

int train_mode(const CommandLine& command);
int val_mode(const CommandLine& command);
int predict_mode(const CommandLine& command);
int export_mode(const CommandLine& command);
int info_mode(const CommandLine& command);
int profile_mode(const CommandLine& command);
int data_mode(const CommandLine& command);

}  // namespace yolo8
