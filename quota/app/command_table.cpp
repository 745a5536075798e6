#include "quota/app/command_table.h"

#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "quota/store/state_store.h"

namespace yolo8::quota {

int CommandTable::run_chosen() const {
  for (const Entry& entry : entries_) {
    if (entry.command->parsed()) return entry.run();
  }
  throw UsageError("no command given (quotad --help lists them)");
}

void write_output(const std::string& path, const std::string& text) {
  if (path.empty()) {
    std::fwrite(text.data(), 1, text.size(), stdout);
    return;
  }
  std::ofstream out(path, std::ios::binary);
  out << text;
  if (!out) throw std::runtime_error(path + ": cannot write");
}

Policy load_policy_with_tokens(const std::string& policy_path) {
  const char* tokens = std::getenv("QUOTAD_TOKENS_FILE");
  return load_policy(policy_path, tokens != nullptr ? tokens : "");
}

std::string sqlite_only(const std::string& db, const std::string& command, const std::string& instead) {
  const DbTarget target = parse_db_target(db);
  if (target.kind == DbTarget::Kind::kPostgres) {
    throw UsageError(command + ": --db names a PostgreSQL database: " + instead +
                     " (see 'PostgreSQL' in docs/quotad-operations.md)");
  }
  return target.location;
}

}  // namespace yolo8::quota
