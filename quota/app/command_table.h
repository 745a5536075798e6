#pragma once
// quotad's commands: each group of commands (serve, admin, ledger, reports, maintenance) adds its subcommands to
// the command line and one entry per subcommand to a CommandTable, which runs the one chosen. main() maps what a
// command throws to the exit-code contract yolo8 shares (common/exit_codes.h): a refusal that retrying cannot
// change (UsageError, PolicyError, RequestError, a bad flag) is kExitBadInput, anything else kExitFailure.
#include <CLI/CLI.hpp>

#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "quota/core/policy.h"

namespace yolo8::quota {

// A command refused what it was given (a flag's value, a combination of flags, a database it cannot use).
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class CommandTable {
 public:
  using Run = std::function<int()>;
  void add(CLI::App* command, Run run) { entries_.push_back({command, std::move(run)}); }
  // The exit code of the subcommand the command line chose; throws what it throws.
  int run_chosen() const;

 private:
  struct Entry {
    CLI::App* command;
    Run run;
  };
  std::vector<Entry> entries_;
};

// The command groups, one file each.
void add_serve_command(CLI::App& app, CommandTable& table);
void add_admin_commands(CLI::App& app, CommandTable& table);
void add_ledger_commands(CLI::App& app, CommandTable& table);
void add_report_commands(CLI::App& app, CommandTable& table);
void add_maintenance_commands(CLI::App& app, CommandTable& table);

// Shared by the groups.
// A command's output: to `path`, or to stdout when it is empty. Throws naming the file it could not write.
void write_output(const std::string& path, const std::string& text);
// The policy with the token hashes of $QUOTAD_TOKENS_FILE (the Secret the deployment mounts) when it is set.
Policy load_policy_with_tokens(const std::string& policy_path);
// The SQLite file `db` names, for what only SQLite has; a PostgreSQL database is a UsageError saying what to use
// instead.
std::string sqlite_only(const std::string& db, const std::string& command, const std::string& instead);

}  // namespace yolo8::quota
