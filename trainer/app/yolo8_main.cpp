// yolo8: the training command line. Every error is caught here once and becomes a message and an exit code.
#include <exception>
#include <iostream>
#include <string>
#include <vector>

#include "trainer/app/cli.h"
#include "trainer/app/console.h"
#include "trainer/app/model_loading.h"
#include "trainer/app/settings.h"
#include "trainer/app/torch_warnings.h"
#include "trainer/core/exit_codes.h"
#include "trainer/core/stop_signal.h"

int main(int argc, char** argv) {
  // Before any output: under a pipe (kubectl logs) stdout would otherwise show its lines a block at a time.
  yolo8::line_buffer_stdout();
  // Then at once: a SIGTERM during start-up must still end in a clean stop, not a killed process.
  yolo8::install_stop_signal_handlers();
  // LibTorch 2.x repeats some warnings on every call (see torch_warnings.h).
  yolo8::print_each_torch_warning_once();
  const std::vector<std::string> args(argv + 1, argv + argc);
  try {
    return yolo8::run_command_line(args);
  } catch (const yolo8::StoppedBeforeTraining& stopped) {
    std::cerr << "yolo8: " << stopped.what() << "\n";
    return yolo8::kExitPreempted;
  } catch (const yolo8::SettingsError& error) {
    std::cerr << "yolo8: " << error.what() << "\n";
    return yolo8::kExitBadInput;
  } catch (const yolo8::DataError& error) {
    std::cerr << "yolo8: " << error.what() << "\n";
    return yolo8::kExitBadInput;
  } catch (const std::exception& error) {
    std::cerr << "yolo8: error: " << error.what() << "\n";
    return yolo8::kExitFailure;
  }
}
