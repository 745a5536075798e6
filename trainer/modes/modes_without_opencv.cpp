// Built instead of the files of the modes that read images when OpenCV is missing (a bare GPU machine): they answer
// with exit 2 and say why; profile, info and export work without them.
#include <iostream>
#include <string>

#include "common/exit_codes.h"
#include "trainer/modes/modes.h"

namespace yolo8 {
namespace {

int needs_opencv(const std::string& mode) {
  std::cerr << "yolo8: mode '" << mode << "' reads images and needs OpenCV, which this build was made without\n";
  return kExitBadInput;
}

}  // namespace

int train_mode(const CommandLine&) { return needs_opencv("train"); }
int val_mode(const CommandLine&) { return needs_opencv("val"); }
int predict_mode(const CommandLine&) { return needs_opencv("predict"); }
int data_mode(const CommandLine&) { return needs_opencv("data"); }

}  // namespace yolo8
