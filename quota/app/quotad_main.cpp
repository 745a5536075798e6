// quotad: the GPU lease service (serve), its admin and ledger verbs against a running server, its reports and its
// maintenance commands. Each group lives in its own file; this one is the table of groups and the exit codes.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <stdexcept>

#include "common/exit_codes.h"
#include "quota/app/command_table.h"
#include "quota/core/policy.h"

using namespace yolo8;
using namespace yolo8::quota;

namespace {

using AddCommands = void (*)(CLI::App&, CommandTable&);
// In the order `quotad --help` lists them.
constexpr AddCommands kCommandGroups[] = {add_serve_command, add_admin_commands, add_ledger_commands,
                                          add_report_commands, add_maintenance_commands};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"quotad: GPU leases with department quotas"};
  app.require_subcommand(1);
  CommandTable table;
  for (const AddCommands add : kCommandGroups) add(app, table);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    const int code = app.exit(error);  // prints the help, or the error with a hint
    return code == 0 ? kExitCompleted : kExitBadInput;
  }
  try {
    return table.run_chosen();
  } catch (const UsageError& error) {
    std::fprintf(stderr, "quotad: %s\n", error.what());
    return kExitBadInput;
  } catch (const PolicyError& error) {  // the policy, a memory table or the ledger refused a value
    std::fprintf(stderr, "quotad: %s\n", error.what());
    return kExitBadInput;
  } catch (const std::invalid_argument& error) {  // a malformed flag value (--month, --quarter)
    std::fprintf(stderr, "quotad: %s\n", error.what());
    return kExitBadInput;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "quotad: %s\n", error.what());
    return kExitFailure;
  }
}
