// yolo8: the training command line. Every error is caught once (run_yolo8, trainer/modes/mode_table.h) and becomes a
// message and an exit code.
#include <string>
#include <vector>

#include "trainer/core/stop_signal.h"
#include "trainer/modes/mode_table.h"
#include "trainer/runtime/console.h"
#include "trainer/runtime/torch_warnings.h"

int main(int argc, char** argv) {
  // Before any output: under a pipe (kubectl logs) stdout would otherwise show its lines a block at a time.
  yolo8::line_buffer_stdout();
  // Then at once: a SIGTERM during start-up must still end in a clean stop, not a killed process.
  yolo8::install_stop_signal_handlers();
  // LibTorch 2.x repeats some warnings on every call (see torch_warnings.h).
  yolo8::print_each_torch_warning_once();
  const std::vector<std::string> args(argv + 1, argv + argc);
  return yolo8::run_yolo8(args);
}
