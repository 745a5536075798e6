#include "trainer/commands.h"

#include <iostream>

#include "trainer/exit_codes.h"
#include "trainer/settings.h"

namespace yolo8 {
namespace {

int not_built(const std::string& what) {
  std::cerr << "yolo8: " << what << " is not built yet\n";
  return kExitBadInput;
}

}  // namespace

int run_mode(const CommandLine& command) {
  const Settings settings = resolve_settings(command.pairs, command.mode);
  return not_built("mode '" + settings.mode + "'");
}

}  // namespace yolo8
