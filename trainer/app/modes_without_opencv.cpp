// Built instead of modes.cpp when OpenCV is missing (a bare GPU machine): the modes that read images answer
// with exit 2 and say why; profile, info and export work without them.
#include <iostream>

#include "trainer/app/modes.h"
#include "trainer/core/exit_codes.h"

namespace yolo8 {
namespace {

int needs_opencv(const std::string& mode) {
  std::cerr << "yolo8: mode '" << mode << "' reads images and needs OpenCV, which this build was made without\n";
  return kExitBadInput;
}

}  // namespace

int run_train(const Settings&) { return needs_opencv("train"); }
int run_val(const Settings&) { return needs_opencv("val"); }
int run_predict(const Settings&) { return needs_opencv("predict"); }
int run_data_check(const Settings&) { return needs_opencv("data"); }
int run_data_synth(const std::string&, int, int, int, uint64_t) { return needs_opencv("data"); }

}  // namespace yolo8
