#include "quota/store/state_store.h"

#include <libpq-fe.h>

#include <fstream>
#include <memory>

#include "quota/store/postgres_leadership.h"
#include "quota/store/postgres_store.h"
#include "quota/store/store.h"

namespace yolo8::quota {

namespace {

bool starts_with(const std::string& text, const char* prefix) { return text.rfind(prefix, 0) == 0; }

// --db-password-file: its first line ("" when no file is named: libpq's PGPASSWORD / PGPASSFILE apply)
std::string read_password(const std::string& file_name) {
  if (file_name.empty()) return "";
  std::ifstream file(file_name);
  if (!file) throw StoreError("--db-password-file: cannot read " + file_name);
  std::string password;
  std::getline(file, password);
  if (!password.empty() && password.back() == '\r') password.pop_back();
  if (password.empty()) throw StoreError("--db-password-file: " + file_name + " holds no password");
  return password;
}

}  // namespace

DbTarget parse_db_target(const std::string& spec) {
  DbTarget target;
  if (starts_with(spec, "postgresql://") || starts_with(spec, "postgres://")) {
    // libpq reads the URL as it will connect with it: userinfo, host list, ?password=... all count
    char* error = nullptr;
    std::unique_ptr<PQconninfoOption, void (*)(PQconninfoOption*)> options(PQconninfoParse(spec.c_str(), &error),
                                                                           PQconninfoFree);
    if (!options) {
      // the message may quote the URL, and the URL may hold a password: it is not repeated
      const std::string why = error != nullptr ? error : "out of memory";
      PQfreemem(error);
      throw StoreError("--db: not a valid PostgreSQL URL: " + why.substr(0, why.find('"')));
    }
    for (const PQconninfoOption* option = options.get(); option->keyword != nullptr; ++option) {
      if (std::string(option->keyword) == "password" && option->val != nullptr) {
        throw StoreError(
            "--db: the PostgreSQL URL holds a password, which every user of the machine could read on the command "
            "line: remove it and give it in a file with --db-password-file, or through libpq's PGPASSWORD or "
            "PGPASSFILE");
      }
    }
    target.kind = DbTarget::Kind::kPostgres;
    target.location = spec;
    return target;
  }
  target.location = starts_with(spec, "sqlite:") ? spec.substr(7) : spec;
  if (target.location.empty()) throw StoreError("--db: names no SQLite file ('" + spec + "')");
  return target;
}

std::unique_ptr<StateStore> open_store(const DbTarget& target, const StoreOptions& options) {
  if (target.kind == DbTarget::Kind::kSqlite) {
    return std::make_unique<Store>(target.location, options.full_sync, options.busy_timeout_ms);
  }
  return std::make_unique<PostgresStore>(target.location, read_password(options.password_file),
                                         options.busy_timeout_ms);
}

std::unique_ptr<PostgresLeadership> open_leadership(const DbTarget& target, const StoreOptions& options,
                                                    const std::string& address) {
  if (target.kind == DbTarget::Kind::kSqlite) return nullptr;
  return std::make_unique<PostgresLeadership>(target.location, read_password(options.password_file), address);
}

std::unique_ptr<ReportReader> open_report_reader(const DbTarget& target, const StoreOptions& options) {
  if (target.kind == DbTarget::Kind::kSqlite) return std::make_unique<StoreReader>(target.location);
  return std::make_unique<PostgresReportReader>(target.location, read_password(options.password_file));
}

AuditChainCheck verify_audit_chain(const DbTarget& target, const StoreOptions& options) {
  if (target.kind == DbTarget::Kind::kSqlite) return verify_audit_chain(target.location);
  return verify_postgres_audit_chain(target.location, read_password(options.password_file));
}

}  // namespace yolo8::quota
