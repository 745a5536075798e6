#include "quota/store/store.h"

#include <sqlite3.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "quota/core/calendar.h"
#include "quota/core/codec.h"
#include "quota/core/receipt.h"
#include "quota/core/sha256.h"

namespace yolo8::quota {

namespace {

// One numbered step of the schema: applied once, in order, never edited after it shipped (a change is a new step).
// Plain data, so that another backend can carry its own table of the same steps.
struct Migration {
  int version;              // the schema version the step leads to
  const char* description;  // one line, for the log and the audit entry
  const char* sql;
};

// Steps 1 to 8 are the layouts quotad shipped before the versions were numbered, each named by the commit that
// introduced it; a database created now goes through them all.
constexpr Migration kMigrations[] = {
    {1, "the first layout: meta, leases, approvals, the append-only audit log, usage, heartbeats (7f3ad59)", R"SQL(
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE leases (
  id INTEGER PRIMARY KEY, state TEXT NOT NULL, team TEXT NOT NULL, user TEXT NOT NULL,
  ended_ms INTEGER NOT NULL, body TEXT NOT NULL);
CREATE INDEX leases_state ON leases(state, ended_ms);
CREATE TABLE approvals (
  id INTEGER PRIMARY KEY, state TEXT NOT NULL, team TEXT NOT NULL, body TEXT NOT NULL);
CREATE TABLE audit (
  seq INTEGER PRIMARY KEY, ts_ms INTEGER NOT NULL, actor TEXT NOT NULL, action TEXT NOT NULL,
  lease_id INTEGER NOT NULL, team TEXT NOT NULL, detail TEXT NOT NULL);
CREATE TRIGGER audit_no_update BEFORE UPDATE ON audit
  BEGIN SELECT RAISE(ABORT, 'audit log is append-only'); END;
CREATE TRIGGER audit_no_delete BEFORE DELETE ON audit
  BEGIN SELECT RAISE(ABORT, 'audit log is append-only'); END;
CREATE TABLE usage (
  user TEXT NOT NULL, month TEXT NOT NULL, gpu_hours REAL NOT NULL, PRIMARY KEY (user, month));
CREATE TABLE heartbeats (
  lease_id INTEGER NOT NULL, ts_ms INTEGER NOT NULL, step INTEGER, epoch INTEGER, gpu_util REAL,
  memory_used_gib REAL, last_checkpoint_ms INTEGER);
CREATE INDEX heartbeats_lease ON heartbeats(lease_id, ts_ms);
)SQL"},
    {2, "the quarantine table for rows set aside (e181c9f)", R"SQL(
CREATE TABLE quarantine (
  source TEXT NOT NULL, row_id INTEGER NOT NULL, body TEXT, error TEXT NOT NULL, moved_ms INTEGER NOT NULL);
)SQL"},
    {3, "the ledger: loans and grants (d056c17)", R"SQL(
CREATE TABLE loans (
  id INTEGER PRIMARY KEY, state TEXT NOT NULL, user TEXT NOT NULL, month TEXT NOT NULL, body TEXT NOT NULL);
CREATE TABLE grants (
  id INTEGER PRIMARY KEY, user TEXT NOT NULL, month TEXT NOT NULL, body TEXT NOT NULL);
)SQL"},
    {4, "memory observations of real runs (e4631b7)", R"SQL(
CREATE TABLE memory_observations (
  lease_id INTEGER NOT NULL, ts_ms INTEGER NOT NULL, model TEXT NOT NULL, imgsz INTEGER NOT NULL,
  batch INTEGER NOT NULL, amp INTEGER NOT NULL, device TEXT NOT NULL, peak_gib REAL NOT NULL);
CREATE INDEX memory_observations_key ON memory_observations(model, device, lease_id);
)SQL"},
    {5, "heartbeats say where their utilisation came from, with the device's memory (23d2b11)", R"SQL(
ALTER TABLE heartbeats ADD COLUMN gpu_util_source TEXT;
ALTER TABLE heartbeats ADD COLUMN device_memory_used_gib REAL;
)SQL"},
    {6, "memory observations name the LibTorch version (a5a92d4)", R"SQL(
ALTER TABLE memory_observations ADD COLUMN libtorch TEXT;
)SQL"},
    {7, "the audit log's hash chain (abe3393)", R"SQL(
ALTER TABLE audit ADD COLUMN chain TEXT;
)SQL"},
    {8, "heartbeats carry the process's own GPU memory (b1693bb)", R"SQL(
ALTER TABLE heartbeats ADD COLUMN process_memory_used_gib REAL;
)SQL"},
    {9, "the secret grant receipts are signed with (created at random when the step is applied)", R"SQL(
CREATE TABLE receipt_key (id INTEGER PRIMARY KEY CHECK (id = 1), secret TEXT NOT NULL);
)SQL"},
    {10, "heartbeats older than the retention period folded into hourly summaries per lease", R"SQL(
CREATE TABLE heartbeat_hours (
  lease_id INTEGER NOT NULL, hour_ms INTEGER NOT NULL, samples INTEGER NOT NULL,
  first_ts_ms INTEGER NOT NULL, first_util REAL NOT NULL, last_ts_ms INTEGER NOT NULL, last_util REAL NOT NULL,
  util_micro_ms INTEGER NOT NULL, covered_ms INTEGER NOT NULL, low_held_ms INTEGER NOT NULL,
  head_low_end_ms INTEGER NOT NULL, tail_low_since_ms INTEGER NOT NULL, wasted_ms INTEGER NOT NULL,
  longest_low_ms INTEGER NOT NULL, closed_runs INTEGER NOT NULL, threshold REAL NOT NULL,
  waste_after_ms INTEGER NOT NULL, PRIMARY KEY (lease_id, hour_ms));
CREATE INDEX heartbeat_hours_hour ON heartbeat_hours(hour_ms);
CREATE INDEX heartbeats_ts ON heartbeats(ts_ms);
)SQL"},
};
constexpr int kMigrationCount = static_cast<int>(sizeof kMigrations / sizeof kMigrations[0]);
static_assert(kMigrations[kMigrationCount - 1].version == kSchemaVersion, "kSchemaVersion is the last step's");

// The layout that databases from before the numbering are brought to by the bridge below.
constexpr int kLegacyLayoutVersion = 8;

// What opening a database does to its schema, decided from what the file holds. Pure, so that any backend can use
// it: `version` is the recorded schema version, `has_tables` whether the file holds any table at all.
struct SchemaPlan {
  bool bridge_legacy = false;  // a database from before the numbering: bring it to kLegacyLayoutVersion first
  int from = 0;                // the version the numbered steps start from
  std::vector<const Migration*> steps;
};

SchemaPlan plan_schema(const std::string& path, int version, bool has_tables) {
  if (version > kSchemaVersion) {
    throw StoreError(path + ": the quota database has schema version " + std::to_string(version) +
                     ", this quotad knows up to " + std::to_string(kSchemaVersion) +
                     ": upgrade quotad (never downgrade a database; restore a backup only with the quotad that wrote "
                     "it)");
  }
  if (version < 0)
    throw StoreError(path + ": the quota database has an invalid schema version " + std::to_string(version));
  SchemaPlan plan;
  // version 0 with tables: an unnumbered quotad wrote it (it never set the version)
  plan.bridge_legacy = version == 0 && has_tables;
  plan.from = plan.bridge_legacy ? kLegacyLayoutVersion : version;
  for (const Migration& step : kMigrations) {
    if (step.version > plan.from) plan.steps.push_back(&step);
  }
  return plan;
}

// The legacy bridge's schema: every table of the last unnumbered layout, created where missing. Databases of that
// time may lack any table that came later, or (written by hand in tests, or by a branch) hold a later one without
// an earlier one, so their layout is completed piece by piece rather than placed on a numbered step.
constexpr const char* kLegacySchema = R"SQL(
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS leases (
  id INTEGER PRIMARY KEY, state TEXT NOT NULL, team TEXT NOT NULL, user TEXT NOT NULL,
  ended_ms INTEGER NOT NULL, body TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS leases_state ON leases(state, ended_ms);
CREATE TABLE IF NOT EXISTS approvals (
  id INTEGER PRIMARY KEY, state TEXT NOT NULL, team TEXT NOT NULL, body TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS audit (
  seq INTEGER PRIMARY KEY, ts_ms INTEGER NOT NULL, actor TEXT NOT NULL, action TEXT NOT NULL,
  lease_id INTEGER NOT NULL, team TEXT NOT NULL, detail TEXT NOT NULL);
CREATE TRIGGER IF NOT EXISTS audit_no_update BEFORE UPDATE ON audit
  BEGIN SELECT RAISE(ABORT, 'audit log is append-only'); END;
CREATE TRIGGER IF NOT EXISTS audit_no_delete BEFORE DELETE ON audit
  BEGIN SELECT RAISE(ABORT, 'audit log is append-only'); END;
CREATE TABLE IF NOT EXISTS usage (
  user TEXT NOT NULL, month TEXT NOT NULL, gpu_hours REAL NOT NULL, PRIMARY KEY (user, month));
CREATE TABLE IF NOT EXISTS heartbeats (
  lease_id INTEGER NOT NULL, ts_ms INTEGER NOT NULL, step INTEGER, epoch INTEGER, gpu_util REAL,
  memory_used_gib REAL, last_checkpoint_ms INTEGER, gpu_util_source TEXT, device_memory_used_gib REAL,
  process_memory_used_gib REAL);
CREATE INDEX IF NOT EXISTS heartbeats_lease ON heartbeats(lease_id, ts_ms);
CREATE TABLE IF NOT EXISTS memory_observations (
  lease_id INTEGER NOT NULL, ts_ms INTEGER NOT NULL, model TEXT NOT NULL, imgsz INTEGER NOT NULL,
  batch INTEGER NOT NULL, amp INTEGER NOT NULL, device TEXT NOT NULL, peak_gib REAL NOT NULL, libtorch TEXT);
CREATE INDEX IF NOT EXISTS memory_observations_key ON memory_observations(model, device, lease_id);
CREATE TABLE IF NOT EXISTS quarantine (
  source TEXT NOT NULL, row_id INTEGER NOT NULL, body TEXT, error TEXT NOT NULL, moved_ms INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS loans (
  id INTEGER PRIMARY KEY, state TEXT NOT NULL, user TEXT NOT NULL, month TEXT NOT NULL, body TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS grants (
  id INTEGER PRIMARY KEY, user TEXT NOT NULL, month TEXT NOT NULL, body TEXT NOT NULL);
)SQL";

constexpr const char* kLegacyTables[] = {"meta",       "leases",     "approvals", "audit",  "usage",
                                         "heartbeats", "quarantine", "loans",     "grants", "memory_observations"};

// The columns unnumbered quotads added at open when they were missing, in the order they came.
struct LegacyColumn {
  const char* table;
  const char* column;
  const char* type;
};
constexpr LegacyColumn kLegacyColumns[] = {
    {"heartbeats", "gpu_util_source", "TEXT"},
    {"heartbeats", "device_memory_used_gib", "REAL"},
    {"heartbeats", "process_memory_used_gib", "REAL"},
    {"memory_observations", "libtorch", "TEXT"},
    {"audit", "chain", "TEXT"},
};

struct StatementDeleter {
  void operator()(sqlite3_stmt* statement) const { sqlite3_finalize(statement); }
};
using Statement = std::unique_ptr<sqlite3_stmt, StatementDeleter>;

std::string text(sqlite3_stmt* statement, int column) {
  const unsigned char* value = sqlite3_column_text(statement, column);
  return value == nullptr ? std::string() : std::string(reinterpret_cast<const char*>(value));
}

void bind_text(sqlite3_stmt* statement, int index, const std::string& value) {
  sqlite3_bind_text(statement, index, value.c_str(), static_cast<int>(value.size()), SQLITE_TRANSIENT);
}

// The audit entries a restore's `audit.gap` entry declares lost ("entries 43 to 1999999999 lost: ..."); false for
// every other entry (a gap of one entry recorded by repair-db says "this entry was lost ...").
bool declared_gap(const std::string& action, const std::string& detail, int64_t& from, int64_t& to) {
  long long first = 0;
  long long last = 0;
  int consumed = 0;
  if (action != "audit.gap" ||
      std::sscanf(detail.c_str(), "entries %lld to %lld lost%n", &first, &last, &consumed) != 2 || consumed == 0 ||
      first < 1 || last < first) {
    return false;
  }
  from = first;
  to = last;
  return true;
}

// Decodes the JSON body of row `id` of `table`; a malformed body or an unknown state/outcome text is a
// StoreError naming the database, the table and the row (never a silent default).
template <typename Record>
Record decode_row(const std::string& db_path, const char* table, sqlite3_stmt* statement,
                  Record (*from_json)(const nlohmann::json&)) {
  const int64_t id = sqlite3_column_int64(statement, 0);
  try {
    return from_json(nlohmann::json::parse(text(statement, 1)));
  } catch (const std::exception& error) {
    throw StoreError(db_path + ": table " + table + ", row id " + std::to_string(id) + ", column body: " +
                     error.what() + " (quotad repair-db sets such rows aside: see quota/README.md)");
  }
}

// heartbeat_hours: the key, then an hour's UtilSummary
constexpr const char* kHourColumns =
    "lease_id, hour_ms, samples, first_ts_ms, first_util, last_ts_ms, last_util, util_micro_ms, covered_ms, "
    "low_held_ms, head_low_end_ms, tail_low_since_ms, wasted_ms, longest_low_ms, closed_runs, threshold, "
    "waste_after_ms";

// The summary in columns `first` on (after lease_id and hour_ms).
UtilSummary hour_summary(sqlite3_stmt* statement, int first) {
  const auto integer = [&](int column) { return sqlite3_column_int64(statement, first + column); };
  UtilSummary summary;
  summary.samples = static_cast<int>(integer(0));
  summary.first_ts_ms = integer(1);
  summary.first_util = sqlite3_column_double(statement, first + 2);
  summary.last_ts_ms = integer(3);
  summary.last_util = sqlite3_column_double(statement, first + 4);
  summary.util_micro_ms = integer(5);
  summary.covered_ms = integer(6);
  summary.low_held_ms = integer(7);
  summary.head_low_end_ms = integer(8);
  summary.tail_low_since_ms = integer(9);
  summary.wasted_ms = integer(10);
  summary.longest_low_ms = integer(11);
  summary.closed_runs = integer(12);
  summary.threshold = sqlite3_column_double(statement, first + 13);
  summary.waste_after_ms = integer(14);
  return summary;
}

void bind_hour(sqlite3_stmt* statement, int64_t lease_id, int64_t hour_ms, const UtilSummary& summary) {
  const int64_t values[] = {lease_id,
                            hour_ms,
                            summary.samples,
                            summary.first_ts_ms,
                            0,
                            summary.last_ts_ms,
                            0,
                            summary.util_micro_ms,
                            summary.covered_ms,
                            summary.low_held_ms,
                            summary.head_low_end_ms,
                            summary.tail_low_since_ms,
                            summary.wasted_ms,
                            summary.longest_low_ms,
                            summary.closed_runs,
                            0,
                            summary.waste_after_ms};
  for (int i = 0; i < 17; ++i) sqlite3_bind_int64(statement, i + 1, values[i]);
  sqlite3_bind_double(statement, 5, summary.first_util);
  sqlite3_bind_double(statement, 7, summary.last_util);
  sqlite3_bind_double(statement, 16, summary.threshold);
}

}  // namespace

// What fold_heartbeats sums up in one step: the raw rows from the mark, oldest first, at most `max_rows` (more
// only where that many share one time); a step ends between two times, so that what stays is exactly the newer.
int64_t Store::fold_heartbeats(int64_t summarise_before_ms, int64_t delete_before_ms, double threshold,
                               int64_t waste_after_ms, int64_t max_rows) {
  max_rows = std::max<int64_t>(1, max_rows);
  const bool own_tx = !in_tx_;
  if (own_tx) exec("BEGIN IMMEDIATE");
  try {
    const std::string recorded = meta_value(kHeartbeatsSummarisedKey);
    const int64_t mark = recorded.empty() ? 0 : std::stoll(recorded);
    const int64_t before = hour_of(summarise_before_ms);
    std::vector<UtilSample> rows;
    const auto read = [&](sqlite3_stmt* statement) {
      while (sqlite3_step(statement) == SQLITE_ROW) {
        rows.push_back({sqlite3_column_int64(statement, 0), sqlite3_column_int64(statement, 1),
                        sqlite3_column_type(statement, 2) == SQLITE_NULL ? -1 : sqlite3_column_double(statement, 2)});
      }
    };
    int64_t bound = std::max(mark, before);
    if (before > mark) {
      Statement statement(prepare(
          "SELECT lease_id, ts_ms, gpu_util FROM heartbeats WHERE ts_ms >= ? AND ts_ms < ? ORDER BY ts_ms, rowid "
          "LIMIT ?"));
      sqlite3_bind_int64(statement.get(), 1, mark);
      sqlite3_bind_int64(statement.get(), 2, before);
      sqlite3_bind_int64(statement.get(), 3, max_rows);
      read(statement.get());
      if (static_cast<int64_t>(rows.size()) >= max_rows) {
        bound = rows.back().ts_ms;
        while (!rows.empty() && rows.back().ts_ms == bound) rows.pop_back();
        if (rows.empty()) {
          Statement same(prepare("SELECT lease_id, ts_ms, gpu_util FROM heartbeats WHERE ts_ms = ? ORDER BY rowid"));
          sqlite3_bind_int64(same.get(), 1, bound);
          read(same.get());
          ++bound;
        }
      }
    }
    Statement existing(prepare(
        (std::string("SELECT ") + kHourColumns + " FROM heartbeat_hours WHERE lease_id = ? AND hour_ms = ?").c_str()));
    Statement upsert(prepare((std::string("INSERT OR REPLACE INTO heartbeat_hours(") + kHourColumns +
                              ") VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)")
                                 .c_str()));
    for (auto& [key, summary] : summarise_by_hour(rows, threshold, waste_after_ms)) {
      if (summary.empty()) continue;  // only samples without a utilisation
      sqlite3_reset(existing.get());
      sqlite3_bind_int64(existing.get(), 1, key.first);
      sqlite3_bind_int64(existing.get(), 2, key.second);
      UtilSummary merged = summary;
      if (sqlite3_step(existing.get()) == SQLITE_ROW) {  // the hour's first part was summed up by the step before
        merged = hour_summary(existing.get(), 2);
        merged.append(summary);
      }
      sqlite3_reset(upsert.get());
      bind_hour(upsert.get(), key.first, key.second, merged);
      if (sqlite3_step(upsert.get()) != SQLITE_DONE) fail("write table heartbeat_hours");
    }
    if (bound != mark) set_meta(kHeartbeatsSummarisedKey, std::to_string(bound));
    // past the retention period, and summed up
    Statement remove(prepare(
        "DELETE FROM heartbeats WHERE rowid IN (SELECT rowid FROM heartbeats WHERE ts_ms < ? ORDER BY ts_ms LIMIT ?)"));
    sqlite3_bind_int64(remove.get(), 1, std::min(bound, hour_of(delete_before_ms)));
    sqlite3_bind_int64(remove.get(), 2, max_rows);
    if (sqlite3_step(remove.get()) != SQLITE_DONE) fail("delete heartbeats past the retention period");
    const int64_t deleted = sqlite3_changes(db_);
    if (own_tx) exec("COMMIT");
    return static_cast<int64_t>(rows.size()) + deleted;
  } catch (...) {
    if (own_tx) sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
    throw;
  }
}

void Store::util_history(int64_t from_ms, int64_t to_ms, UtilTracker& tracker) {
  StoreReader(path_).fold_util(from_ms, to_ms, tracker);
}

int64_t Store::count_heartbeat_hours() {
  Statement statement(prepare("SELECT COUNT(*) FROM heartbeat_hours"));
  return sqlite3_step(statement.get()) == SQLITE_ROW ? sqlite3_column_int64(statement.get(), 0) : 0;
}

bool Store::has_column(const std::string& table, const std::string& column) {
  Statement statement(prepare("SELECT name FROM pragma_table_info(?)"));
  bind_text(statement.get(), 1, table);
  while (sqlite3_step(statement.get()) == SQLITE_ROW) {
    if (text(statement.get(), 0) == column) return true;
  }
  return false;
}

bool Store::has_table(const char* table) {
  Statement statement(prepare("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?"));
  sqlite3_bind_text(statement.get(), 1, table, -1, SQLITE_STATIC);
  return sqlite3_step(statement.get()) == SQLITE_ROW;
}

// Unnumbered quotads created what was missing and probed for later columns at every open; that probing is kept
// for their databases only, once, and says what it added.
std::string Store::bridge_legacy_layout() {
  std::string added;
  const auto note = [&](const std::string& what) { added += (added.empty() ? "" : ", ") + what; };
  for (const char* table : kLegacyTables) {
    if (!has_table(table)) note(std::string("table ") + table);
  }
  exec(kLegacySchema);
  for (const LegacyColumn& column : kLegacyColumns) {
    if (has_column(column.table, column.column)) continue;
    exec((std::string("ALTER TABLE ") + column.table + " ADD COLUMN " + column.column + " " + column.type).c_str());
    note(std::string("column ") + column.table + "." + column.column);
  }
  // the version is in PRAGMA user_version from now on; the old marker ('1' whatever the layout) would mislead
  exec("DELETE FROM meta WHERE key = 'schema_version'");
  return added.empty() ? "nothing was missing" : "added " + added;
}

int Store::schema_version() {
  Statement statement(prepare("PRAGMA user_version"));
  return sqlite3_step(statement.get()) == SQLITE_ROW ? sqlite3_column_int(statement.get(), 0) : 0;
}

// The version is kept in PRAGMA user_version rather than a meta row: it is in the file's header, written in the
// step's transaction, carried by backups, never copied back by repair's salvage of meta rows from an older file,
// and untouched by unnumbered quotads (which wrote meta.schema_version = '1' whatever their layout).
void Store::set_schema_version(int version) { exec(("PRAGMA user_version = " + std::to_string(version)).c_str()); }

std::vector<std::string> Store::migrate_schema(bool audit_steps) {
  const int found = schema_version();
  Statement any_table(prepare("SELECT 1 FROM sqlite_master WHERE type = 'table' LIMIT 1"));
  const bool has_tables = sqlite3_step(any_table.get()) == SQLITE_ROW;
  any_table.reset();
  // the steps are accounted for in the audit log the file already keeps; a new file (or one no quotad wrote, without
  // an audit table) has no history to account for, and its log starts with its use
  const bool had_audit_log = has_table("audit");
  const SchemaPlan plan = plan_schema(path_, found, has_tables);
  struct Applied {
    int from, to;
    std::string what;
  };
  std::vector<Applied> applied;
  if (plan.bridge_legacy) {
    try {
      applied.push_back(
          {0, kLegacyLayoutVersion, "a database from before numbered schema versions: " + bridge_legacy_layout()});
    } catch (const StoreError& error) {
      throw StoreError(std::string(error.what()) + " (bringing a database from before numbered schema versions to " +
                       "version " + std::to_string(kLegacyLayoutVersion) + "; nothing was changed)");
    }
    set_schema_version(kLegacyLayoutVersion);
  }
  int version = plan.from;
  for (const Migration* step : plan.steps) {
    char* error = nullptr;
    if (sqlite3_exec(db_, step->sql, nullptr, nullptr, &error) != SQLITE_OK) {
      const std::string message = error != nullptr ? error : "unknown error";
      sqlite3_free(error);
      throw StoreError(path_ + ": schema step " + std::to_string(version) + " -> " + std::to_string(step->version) +
                       " (" + step->description + ") failed: " + message +
                       "; nothing was changed, the database stays at schema version " + std::to_string(found));
    }
    set_schema_version(step->version);
    applied.push_back({version, step->version, step->description});
    version = step->version;
  }
  std::vector<std::string> log;
  if (!has_tables) return log;  // a new database: nothing to tell
  const int64_t now_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count();
  std::vector<AuditEntry> entries;
  Statement last(prepare("SELECT COALESCE(MAX(seq), 0) FROM audit"));
  int64_t seq = sqlite3_step(last.get()) == SQLITE_ROW ? sqlite3_column_int64(last.get(), 0) : 0;
  last.reset();
  for (const Applied& step : applied) {
    const std::string what =
        "schema version " + std::to_string(step.from) + " -> " + std::to_string(step.to) + ": " + step.what;
    log.push_back("quotad: " + path_ + ": " + what);
    AuditEntry entry;
    entry.seq = ++seq;
    entry.ts_ms = now_ms;
    entry.actor = "quotad";
    entry.action = "schema.migrate";
    entry.detail = what;
    entries.push_back(entry);
  }
  if (audit_steps && had_audit_log) append_audit(entries);
  return log;
}

void Store::ensure_receipt_key() {
  Statement statement(prepare("INSERT OR IGNORE INTO receipt_key(id, secret) VALUES (1, ?)"));
  bind_text(statement.get(), 1, new_receipt_key_hex());
  if (sqlite3_step(statement.get()) != SQLITE_DONE) fail("create the receipt key");
}

std::string Store::receipt_key() {
  Statement statement(prepare("SELECT secret FROM receipt_key WHERE id = 1"));
  if (sqlite3_step(statement.get()) != SQLITE_ROW) throw StoreError(path_ + ": receipt_key: no key stored");
  try {
    return key_from_hex(text(statement.get(), 0));
  } catch (const std::invalid_argument& error) {
    throw StoreError(path_ + ": " + error.what());
  }
}

bool Store::lease_recorded(int64_t lease_id) {
  Statement statement(prepare(
      "SELECT 1 FROM leases WHERE id = ?1 UNION ALL SELECT 1 FROM quarantine WHERE source = 'leases' AND row_id = ?1"));
  sqlite3_bind_int64(statement.get(), 1, lease_id);
  return sqlite3_step(statement.get()) == SQLITE_ROW;
}

std::string Store::meta_value(const char* key) {
  Statement statement(prepare("SELECT value FROM meta WHERE key = ?"));
  bind_text(statement.get(), 1, key);
  return sqlite3_step(statement.get()) == SQLITE_ROW ? text(statement.get(), 0) : std::string();
}

void Store::set_meta(const std::string& key, const std::string& value) {
  Statement statement(prepare("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)"));
  bind_text(statement.get(), 1, key);
  bind_text(statement.get(), 2, value);
  if (sqlite3_step(statement.get()) != SQLITE_DONE) fail("write meta " + key);
}

std::string audit_chain_link(const std::string& previous_link, const AuditEntry& entry) {
  const nlohmann::json content = {entry.seq,      entry.ts_ms, entry.actor, entry.action,
                                  entry.lease_id, entry.team,  entry.detail};
  return sha256_hex(previous_link + "\n" + content.dump());
}

Store::Store(const std::string& path, bool full_sync, int busy_timeout_ms)
    : Store(path, full_sync, busy_timeout_ms, true) {}

Store::Store(const std::string& path, bool full_sync, int busy_timeout_ms, bool audit_schema_steps) : path_(path) {
  if (sqlite3_open_v2(path.c_str(), &db_, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, nullptr) !=
      SQLITE_OK) {
    const std::string msg = db_ ? sqlite3_errmsg(db_) : "out of memory";
    sqlite3_close(db_);
    db_ = nullptr;
    throw StoreError(path + ": cannot open the quota database: " + msg);
  }
  sqlite3_busy_timeout(db_, busy_timeout_ms);
  // Several trainers may create the database at the same moment (local mode). Switching to WAL can answer
  // "locked" without waiting for the busy timeout, so the set-up is retried while the file is busy.
  for (int attempt = 0;; ++attempt) {
    try {
      exec("PRAGMA journal_mode=WAL");
      exec(full_sync ? "PRAGMA synchronous=FULL" : "PRAGMA synchronous=NORMAL");
      exec("PRAGMA foreign_keys=ON");
      exec("BEGIN IMMEDIATE");
      const std::vector<std::string> log = migrate_schema(audit_schema_steps);
      ensure_receipt_key();
      exec("COMMIT");
      for (const std::string& line : log) std::fprintf(stderr, "%s\n", line.c_str());
      check_integrity();
      break;
    } catch (const StoreError&) {
      const int code = sqlite3_errcode(db_) & 0xff;
      if (integrity_failed_) {
        sqlite3_close(db_);
        db_ = nullptr;
        throw;
      }
      sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
      if ((code != SQLITE_BUSY && code != SQLITE_LOCKED) || attempt >= 300) {
        sqlite3_close(db_);
        db_ = nullptr;
        throw;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
}

void Store::check_integrity() {
  // quick_check: the b-tree structure and the records, without the slower index cross-check. The heartbeat history
  // (the raw rows of the retention period and the hourly summaries) is most of a long-used file: the open checks
  // every other table, so that it takes the same time however long the history; a damaged history page is an
  // error where the replay or a report reads it (StoreReader::next_row), and repair-db checks the whole file.
  std::vector<std::string> tables;
  {
    Statement list(
        prepare("SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT IN ('heartbeats', "
                "'heartbeat_hours') AND name NOT LIKE 'sqlite_%' ORDER BY name"));
    int rc = SQLITE_ROW;
    while ((rc = sqlite3_step(list.get())) == SQLITE_ROW) tables.push_back(text(list.get(), 0));
    if (rc != SQLITE_DONE) {
      integrity_failed_ = true;
      throw StoreError(path_ + ": the database is damaged (its schema cannot be read: " + sqlite3_errmsg(db_) +
                       "); quotad will not serve on it: see 'Repairing the database' in quota/README.md");
    }
  }
  std::string problems;
  for (const std::string& table : tables) {
    Statement statement(prepare(("PRAGMA quick_check(\"" + table + "\")").c_str()));
    int rc = SQLITE_ROW;
    while ((rc = sqlite3_step(statement.get())) == SQLITE_ROW) {
      const std::string line = text(statement.get(), 0);
      if (line != "ok") problems += (problems.empty() ? "" : "; ") + line;
    }
    if (rc != SQLITE_DONE) problems += (problems.empty() ? "" : "; ") + std::string(sqlite3_errmsg(db_));
  }
  if (!problems.empty()) {
    integrity_failed_ = true;
    throw StoreError(path_ + ": the database is damaged (PRAGMA quick_check: " + problems +
                     "); quotad will not serve on it: see 'Repairing the database' in quota/README.md");
  }
}

Store::~Store() {
  if (db_ != nullptr) sqlite3_close(db_);
}

void Store::fail(const std::string& what) { throw StoreError(path_ + ": " + what + ": " + sqlite3_errmsg(db_)); }

void Store::exec(const char* sql) {
  char* err = nullptr;
  if (sqlite3_exec(db_, sql, nullptr, nullptr, &err) != SQLITE_OK) {
    const std::string msg = err ? err : "unknown error";
    sqlite3_free(err);
    throw StoreError(path_ + ": " + msg);
  }
}

sqlite3_stmt* Store::prepare(const char* sql) {
  sqlite3_stmt* statement = nullptr;
  if (sqlite3_prepare_v2(db_, sql, -1, &statement, nullptr) != SQLITE_OK) fail("prepare");
  return statement;
}

void Store::begin_immediate() {
  exec("BEGIN IMMEDIATE");
  in_tx_ = true;
}

void Store::commit() {
  exec("COMMIT");
  in_tx_ = false;
}

void Store::rollback() {
  if (!in_tx_) return;
  in_tx_ = false;
  sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
}

Snapshot Store::load(int64_t now_ms, int64_t keep_ended_ms, size_t audit_tail) {
  audit_head_ = meta_value("audit_head");
  Snapshot snapshot;
  {
    // the texts of the terminal states (is_terminal), as to_string(LeaseState) writes them
    Statement statement(
        // emergency leases whose review is still open are kept however old (else the review would be lost)
        prepare("SELECT id, body FROM leases WHERE state NOT IN ('released','expired','rejected') OR ended_ms >= ? "
                "OR (CASE WHEN json_valid(body) THEN json_extract(body, '$.review_pending') END) = 1"));
    sqlite3_bind_int64(statement.get(), 1, now_ms - keep_ended_ms);
    while (sqlite3_step(statement.get()) == SQLITE_ROW) {
      snapshot.leases.push_back(decode_row<Lease>(path_, "leases", statement.get(), &lease_from_json));
    }
  }
  {
    Statement statement(
        prepare("SELECT step, epoch, gpu_util, memory_used_gib, last_checkpoint_ms, ts_ms, gpu_util_source, "
                "COALESCE(device_memory_used_gib, -1), COALESCE(process_memory_used_gib, -1) FROM heartbeats "
                "WHERE lease_id = ? ORDER BY ts_ms DESC LIMIT 1"));
    Statement seen(prepare("SELECT MAX(ts_ms) FROM heartbeats WHERE lease_id = ? AND ts_ms <= ?"));
    for (auto& lease : snapshot.leases) {
      if (lease.state != LeaseState::kGranted && lease.state != LeaseState::kRevoking) continue;
      sqlite3_reset(statement.get());
      sqlite3_bind_int64(statement.get(), 1, lease.id);
      if (sqlite3_step(statement.get()) == SQLITE_ROW) {
        lease.telemetry.step = sqlite3_column_int64(statement.get(), 0);
        lease.telemetry.epoch = sqlite3_column_int(statement.get(), 1);
        lease.telemetry.gpu_util = sqlite3_column_double(statement.get(), 2);
        lease.telemetry.memory_used_gib = sqlite3_column_double(statement.get(), 3);
        lease.telemetry.last_checkpoint_ms = sqlite3_column_int64(statement.get(), 4);
        if (const unsigned char* source = sqlite3_column_text(statement.get(), 6)) {
          lease.telemetry.gpu_util_source = reinterpret_cast<const char*>(source);
        }
        lease.telemetry.device_memory_used_gib = sqlite3_column_double(statement.get(), 7);
        lease.telemetry.process_memory_used_gib = sqlite3_column_double(statement.get(), 8);
      }
      // the last heartbeat up to now: one stored after now was received before the wall clock was set back, and
      // the lease row's clocks already moved with that step (Engine::clock_stepped; local mode reloads each call)
      sqlite3_reset(seen.get());
      sqlite3_bind_int64(seen.get(), 1, lease.id);
      sqlite3_bind_int64(seen.get(), 2, now_ms);
      if (sqlite3_step(seen.get()) == SQLITE_ROW && sqlite3_column_type(seen.get(), 0) != SQLITE_NULL) {
        lease.last_seen_ms = std::max<int64_t>(lease.last_seen_ms, sqlite3_column_int64(seen.get(), 0));
      }
    }
  }
  {
    Statement statement(prepare("SELECT id, body FROM approvals"));
    while (sqlite3_step(statement.get()) == SQLITE_ROW) {
      snapshot.approvals.push_back(decode_row<Approval>(path_, "approvals", statement.get(), &approval_from_json));
    }
  }
  {
    Statement statement(prepare("SELECT id, body FROM loans ORDER BY id"));
    while (sqlite3_step(statement.get()) == SQLITE_ROW) {
      snapshot.loans.push_back(decode_row<Loan>(path_, "loans", statement.get(), &loan_from_json));
    }
  }
  {
    Statement statement(prepare("SELECT id, body FROM grants ORDER BY id"));
    while (sqlite3_step(statement.get()) == SQLITE_ROW) {
      snapshot.grants.push_back(decode_row<CreditGrant>(path_, "grants", statement.get(), &grant_from_json));
    }
  }
  {
    Statement statement(
        prepare("SELECT MAX(COALESCE((SELECT MAX(id) FROM loans), 0), COALESCE((SELECT MAX(row_id) FROM quarantine "
                "WHERE source = 'loans'), 0), COALESCE((SELECT CAST(value AS INTEGER) FROM meta WHERE key = "
                "'next_loan_id'), 1) - 1) + 1, MAX(COALESCE((SELECT MAX(id) FROM grants), 0), "
                "COALESCE((SELECT MAX(row_id) FROM quarantine WHERE source = 'grants'), 0), COALESCE((SELECT "
                "CAST(value AS INTEGER) FROM meta WHERE key = 'next_grant_id'), 1) - 1) + 1"));
    if (sqlite3_step(statement.get()) == SQLITE_ROW) {
      snapshot.next_loan_id = sqlite3_column_int64(statement.get(), 0);
      snapshot.next_grant_id = sqlite3_column_int64(statement.get(), 1);
    }
  }
  {
    Statement statement(prepare("SELECT user, month, gpu_hours FROM usage"));
    while (sqlite3_step(statement.get()) == SQLITE_ROW) {
      snapshot.usage[{text(statement.get(), 0), text(statement.get(), 1)}] = sqlite3_column_double(statement.get(), 2);
    }
  }
  {
    Statement statement(prepare("SELECT COALESCE(MAX(seq), 0), COUNT(*) FROM audit"));
    if (sqlite3_step(statement.get()) == SQLITE_ROW) {
      snapshot.next_audit_seq = sqlite3_column_int64(statement.get(), 0) + 1;
      // the entries a restore declared lost hold no rows: read only when the count falls short (rarely)
      const auto declared_lost = [&] {
        int64_t lost = 0;
        Statement gaps(prepare("SELECT detail FROM audit WHERE action = 'audit.gap' AND detail LIKE 'entries %'"));
        while (sqlite3_step(gaps.get()) == SQLITE_ROW) {
          int64_t from = 0;
          int64_t to = 0;
          if (declared_gap("audit.gap", text(gaps.get(), 0), from, to)) lost += to - from + 1;
        }
        return lost;
      };
      const int64_t entries = sqlite3_column_int64(statement.get(), 1);
      if (entries != snapshot.next_audit_seq - 1 && entries + declared_lost() != snapshot.next_audit_seq - 1) {
        // every acknowledged change has its entry: a hole means entries were lost, which must not go unnoticed
        Statement first_gap(
            prepare("SELECT CASE WHEN NOT EXISTS (SELECT 1 FROM audit WHERE seq = 1) THEN 1 ELSE "
                    "(SELECT MIN(seq) + 1 FROM audit a WHERE NOT EXISTS (SELECT 1 FROM audit b WHERE b.seq = a.seq + "
                    "1)) END"));
        const int64_t missing =
            sqlite3_step(first_gap.get()) == SQLITE_ROW ? sqlite3_column_int64(first_gap.get(), 0) : 0;
        throw StoreError(path_ + ": table audit: the sequence has a gap: entry " + std::to_string(missing) +
                         " is missing (" + std::to_string(sqlite3_column_int64(statement.get(), 1)) +
                         " entries up to " + std::to_string(snapshot.next_audit_seq - 1) +
                         "); quotad repair-db records the gap explicitly: see quota/README.md");
      }
    }
  }
  {
    Statement statement(
        prepare("SELECT MAX(COALESCE((SELECT CAST(value AS INTEGER) FROM meta WHERE key = 'next_lease_id'), 1), "
                "COALESCE((SELECT MAX(id) FROM leases), 0) + 1, COALESCE((SELECT MAX(lease_id) FROM audit), 0) + 1, "
                "COALESCE((SELECT MAX(lease_id) FROM heartbeats), 0) + 1, "
                "COALESCE((SELECT MAX(row_id) FROM quarantine WHERE source = 'leases'), 0) + 1), "
                "MAX(COALESCE((SELECT CAST(value AS INTEGER) FROM meta WHERE key = 'next_approval_id'), 1), "
                "COALESCE((SELECT MAX(id) FROM approvals), 0) + 1, "
                "COALESCE((SELECT MAX(row_id) FROM quarantine WHERE source = 'approvals'), 0) + 1)"));
    if (sqlite3_step(statement.get()) == SQLITE_ROW) {
      snapshot.next_lease_id = sqlite3_column_int64(statement.get(), 0);
      snapshot.next_approval_id = sqlite3_column_int64(statement.get(), 1);
    }
  }
  if (audit_tail > 0) {
    snapshot.audit = audit(snapshot.next_audit_seq - 1 - static_cast<int64_t>(audit_tail), audit_tail);
  }
  return snapshot;
}

void Store::write(const Engine& engine, const Changes& changes) {
  if (changes.empty()) return;
  const bool own_tx = !in_tx_;
  if (own_tx) exec("BEGIN IMMEDIATE");
  try {
    if (!changes.leases.empty()) {
      Statement statement(
          prepare("INSERT OR REPLACE INTO leases(id, state, team, user, ended_ms, body) VALUES (?,?,?,?,?,?)"));
      for (int64_t id : changes.leases) {
        const Lease* lease = engine.find(id);
        if (lease == nullptr) continue;
        sqlite3_reset(statement.get());
        sqlite3_bind_int64(statement.get(), 1, lease->id);
        bind_text(statement.get(), 2, to_string(lease->state));
        bind_text(statement.get(), 3, lease->req.team);
        bind_text(statement.get(), 4, lease->req.user);
        sqlite3_bind_int64(statement.get(), 5, std::max(lease->ended_ms, lease->free_at_ms));
        bind_text(statement.get(), 6, to_json(*lease, engine.policy()).dump());
        if (sqlite3_step(statement.get()) != SQLITE_DONE) fail("write lease");
      }
    }
    if (!changes.approvals.empty()) {
      Statement statement(prepare("INSERT OR REPLACE INTO approvals(id, state, team, body) VALUES (?,?,?,?)"));
      for (int64_t id : changes.approvals) {
        const Approval* approval = engine.find_approval(id);
        if (approval == nullptr) continue;
        sqlite3_reset(statement.get());
        sqlite3_bind_int64(statement.get(), 1, approval->id);
        bind_text(statement.get(), 2, to_string(approval->state));
        bind_text(statement.get(), 3, approval->team);
        bind_text(statement.get(), 4, to_json(*approval).dump());
        if (sqlite3_step(statement.get()) != SQLITE_DONE) fail("write approval");
      }
    }
    append_audit(changes.audit);
    // rows the engine found breaking an invariant at load: kept whole in the quarantine table, out of leases
    for (const auto& [id, quarantined] : changes.quarantined) {
      Statement copy(prepare(
          "INSERT INTO quarantine(source, row_id, body, error, moved_ms) SELECT 'leases', id, body, ?, ? FROM leases "
          "WHERE id = ?"));
      bind_text(copy.get(), 1, quarantined.why);
      sqlite3_bind_int64(copy.get(), 2, quarantined.at_ms);
      sqlite3_bind_int64(copy.get(), 3, id);
      if (sqlite3_step(copy.get()) != SQLITE_DONE) fail("quarantine lease row");
      Statement remove(prepare("DELETE FROM leases WHERE id = ?"));
      sqlite3_bind_int64(remove.get(), 1, id);
      if (sqlite3_step(remove.get()) != SQLITE_DONE) fail("remove quarantined lease row");
    }
    if (!changes.leases.empty() || !changes.approvals.empty()) {
      // the id sequences, in the same transaction as the rows that use them
      Statement statement(prepare("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)"));
      for (const auto& [key, value] :
           {std::pair<const char*, int64_t>{"next_lease_id", engine.next_lease_id()},
            std::pair<const char*, int64_t>{"next_approval_id", engine.next_approval_id()}}) {
        sqlite3_reset(statement.get());
        bind_text(statement.get(), 1, key);
        bind_text(statement.get(), 2, std::to_string(value));
        if (sqlite3_step(statement.get()) != SQLITE_DONE) fail("write id sequence");
      }
    }
    if (!changes.loans.empty()) {
      Statement statement(prepare("INSERT OR REPLACE INTO loans(id, state, user, month, body) VALUES (?,?,?,?,?)"));
      for (int64_t id : changes.loans) {
        const Loan* loan = engine.find_loan(id);
        if (loan == nullptr) continue;
        sqlite3_reset(statement.get());
        sqlite3_bind_int64(statement.get(), 1, loan->id);
        bind_text(statement.get(), 2, to_string(loan->state));
        bind_text(statement.get(), 3, loan->user);
        bind_text(statement.get(), 4, loan->month);
        bind_text(statement.get(), 5, to_json(*loan).dump());
        if (sqlite3_step(statement.get()) != SQLITE_DONE) fail("write loan");
      }
    }
    if (!changes.grants.empty()) {
      Statement statement(prepare("INSERT OR REPLACE INTO grants(id, user, month, body) VALUES (?,?,?,?)"));
      for (int64_t id : changes.grants) {
        auto it = engine.grants().find(id);
        if (it == engine.grants().end()) continue;
        sqlite3_reset(statement.get());
        sqlite3_bind_int64(statement.get(), 1, it->second.id);
        bind_text(statement.get(), 2, it->second.user);
        bind_text(statement.get(), 3, it->second.month);
        bind_text(statement.get(), 4, to_json(it->second).dump());
        if (sqlite3_step(statement.get()) != SQLITE_DONE) fail("write grant");
      }
    }
    if (!changes.usage.empty()) {
      Statement statement(prepare("INSERT OR REPLACE INTO usage(user, month, gpu_hours) VALUES (?,?,?)"));
      for (const auto& key : changes.usage) {
        auto it = engine.usage().find(key);
        if (it == engine.usage().end()) continue;
        sqlite3_reset(statement.get());
        bind_text(statement.get(), 1, key.first);
        bind_text(statement.get(), 2, key.second);
        sqlite3_bind_double(statement.get(), 3, it->second);
        if (sqlite3_step(statement.get()) != SQLITE_DONE) fail("write usage");
      }
    }
  } catch (...) {
    if (own_tx) sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
    throw;
  }
  if (own_tx) exec("COMMIT");
}

void Store::append_audit(const std::vector<AuditEntry>& entries) {
  if (entries.empty()) return;
  // the head is read inside this transaction: other processes (local mode) append to the same chain
  const std::string head = meta_value("audit_head");
  std::string link = head.empty() ? std::string() : head.substr(head.find(' ') + 1);
  Statement statement(
      prepare("INSERT INTO audit(seq, ts_ms, actor, action, lease_id, team, detail, chain) VALUES (?,?,?,?,?,?,?,?)"));
  for (const auto& entry : entries) {
    link = audit_chain_link(link, entry);
    sqlite3_reset(statement.get());
    sqlite3_bind_int64(statement.get(), 1, entry.seq);
    sqlite3_bind_int64(statement.get(), 2, entry.ts_ms);
    bind_text(statement.get(), 3, entry.actor);
    bind_text(statement.get(), 4, entry.action);
    sqlite3_bind_int64(statement.get(), 5, entry.lease_id);
    bind_text(statement.get(), 6, entry.team);
    bind_text(statement.get(), 7, entry.detail);
    bind_text(statement.get(), 8, link);
    if (sqlite3_step(statement.get()) != SQLITE_DONE) fail("append audit");
  }
  Statement head_row(prepare("INSERT OR REPLACE INTO meta(key, value) VALUES ('audit_head', ?)"));
  bind_text(head_row.get(), 1, std::to_string(entries.back().seq) + " " + link);
  if (sqlite3_step(head_row.get()) != SQLITE_DONE) fail("write the audit chain head");
  audit_head_ = std::to_string(entries.back().seq) + " " + link;
}

void Store::write_heartbeats(const std::vector<HeartbeatSample>& samples) {
  if (samples.empty()) return;
  const bool own_tx = !in_tx_;
  if (own_tx) exec("BEGIN IMMEDIATE");
  try {
    Statement statement(
        prepare("INSERT INTO heartbeats(lease_id, ts_ms, step, epoch, gpu_util, memory_used_gib, "
                "last_checkpoint_ms, gpu_util_source, device_memory_used_gib, process_memory_used_gib) "
                "VALUES (?,?,?,?,?,?,?,?,?,?)"));
    for (const auto& sample : samples) {
      sqlite3_reset(statement.get());
      sqlite3_bind_int64(statement.get(), 1, sample.lease_id);
      sqlite3_bind_int64(statement.get(), 2, sample.ts_ms);
      sqlite3_bind_int64(statement.get(), 3, sample.telemetry.step);
      sqlite3_bind_int(statement.get(), 4, sample.telemetry.epoch);
      sqlite3_bind_double(statement.get(), 5, sample.telemetry.gpu_util);
      sqlite3_bind_double(statement.get(), 6, sample.telemetry.memory_used_gib);
      sqlite3_bind_int64(statement.get(), 7, sample.telemetry.last_checkpoint_ms);
      const std::string& source = sample.telemetry.gpu_util_source;
      if (source.empty()) {
        sqlite3_bind_null(statement.get(), 8);
      } else {
        sqlite3_bind_text(statement.get(), 8, source.c_str(), static_cast<int>(source.size()), SQLITE_TRANSIENT);
      }
      sqlite3_bind_double(statement.get(), 9, sample.telemetry.device_memory_used_gib);
      sqlite3_bind_double(statement.get(), 10, sample.telemetry.process_memory_used_gib);
      if (sqlite3_step(statement.get()) != SQLITE_DONE) fail("write heartbeat");
    }
    // The peaks quotad learns its memory table from (quotad memory-table --observed). A run keeps one row per
    // setting, its highest peak (a heartbeat raises it); a run's first row prunes its key (model, device, AMP,
    // LibTorch) to the latest kMemoryObservationRunsKept runs, so the table stays bounded and follows the
    // recent runs. The three statements number their parameters alike: ?1 lease, ?2 time, ?3..?8 the setting,
    // ?9 the peak, ?10 the runs kept.
    constexpr const char* kSameKey =
        "model = ?3 AND imgsz = ?4 AND batch = ?5 AND amp = ?6 AND device = ?7 AND COALESCE(libtorch, '') = "
        "COALESCE(?8, '')";
    Statement raise(prepare((std::string("UPDATE memory_observations SET peak_gib = MAX(peak_gib, ?9), ts_ms = "
                                         "MAX(ts_ms, ?2) WHERE lease_id = ?1 AND ") +
                             kSameKey)
                                .c_str()));
    Statement observe(
        prepare("INSERT INTO memory_observations(lease_id, ts_ms, model, imgsz, batch, amp, device, libtorch, "
                "peak_gib) VALUES (?1,?2,?3,?4,?5,?6,?7,?8,?9)"));
    Statement prune(
        prepare("DELETE FROM memory_observations WHERE model = ?3 AND amp = ?6 AND device = ?7 AND "
                "COALESCE(libtorch, '') = COALESCE(?8, '') AND lease_id NOT IN (SELECT lease_id FROM "
                "memory_observations WHERE model = ?3 AND amp = ?6 AND device = ?7 AND COALESCE(libtorch, '') = "
                "COALESCE(?8, '') GROUP BY lease_id ORDER BY MAX(ts_ms) DESC, lease_id DESC LIMIT ?10)"));
    const auto bind = [&](sqlite3_stmt* into, const HeartbeatSample& sample) {
      const Telemetry& t = sample.telemetry;
      sqlite3_reset(into);
      sqlite3_clear_bindings(into);
      const auto named = [&](const char* name) { return sqlite3_bind_parameter_index(into, name); };
      // each statement uses a subset of the parameters: bind the ones it has
      if (const int i = named("?1")) sqlite3_bind_int64(into, i, sample.lease_id);
      if (const int i = named("?2")) sqlite3_bind_int64(into, i, sample.ts_ms);
      if (const int i = named("?3")) bind_text(into, i, t.model);
      if (const int i = named("?4")) sqlite3_bind_int(into, i, t.imgsz);
      if (const int i = named("?5")) sqlite3_bind_int(into, i, t.batch);
      if (const int i = named("?6")) sqlite3_bind_int(into, i, t.amp);
      if (const int i = named("?7")) bind_text(into, i, t.device_name);
      if (const int i = named("?8"); i && !t.libtorch.empty()) bind_text(into, i, t.libtorch);
      if (const int i = named("?9")) sqlite3_bind_double(into, i, t.memory_used_gib);
      if (const int i = named("?10")) sqlite3_bind_int(into, i, kMemoryObservationRunsKept);
    };
    for (const auto& sample : samples) {
      if (!sample.telemetry.is_memory_observation()) continue;
      bind(raise.get(), sample);
      if (sqlite3_step(raise.get()) != SQLITE_DONE) fail("raise memory observation");
      if (sqlite3_changes(db_) > 0) continue;
      bind(observe.get(), sample);
      if (sqlite3_step(observe.get()) != SQLITE_DONE) fail("write memory observation");
      bind(prune.get(), sample);
      if (sqlite3_step(prune.get()) != SQLITE_DONE) fail("prune memory observations");
    }
  } catch (...) {
    if (own_tx) sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
    throw;
  }
  if (own_tx) exec("COMMIT");
}

std::vector<AuditEntry> Store::audit(int64_t after_seq, size_t limit, const std::string& team) {
  Statement statement(
      prepare("SELECT seq, ts_ms, actor, action, lease_id, team, detail FROM audit "
              "WHERE seq > ? AND (? = '' OR team = ?) ORDER BY seq LIMIT ?"));
  sqlite3_bind_int64(statement.get(), 1, after_seq);
  bind_text(statement.get(), 2, team);
  bind_text(statement.get(), 3, team);
  sqlite3_bind_int64(statement.get(), 4, static_cast<int64_t>(limit));
  std::vector<AuditEntry> out;
  while (sqlite3_step(statement.get()) == SQLITE_ROW) {
    AuditEntry entry;
    entry.seq = sqlite3_column_int64(statement.get(), 0);
    entry.ts_ms = sqlite3_column_int64(statement.get(), 1);
    entry.actor = text(statement.get(), 2);
    entry.action = text(statement.get(), 3);
    entry.lease_id = sqlite3_column_int64(statement.get(), 4);
    entry.team = text(statement.get(), 5);
    entry.detail = text(statement.get(), 6);
    out.push_back(entry);
  }
  return out;
}

std::vector<MemoryObservation> Store::memory_observations() {
  // one sample per run and setting: the run's highest peak at that (imgsz, batch, AMP)
  Statement statement(
      prepare("SELECT model, device, amp, imgsz, batch, MAX(peak_gib), COALESCE(libtorch, '') FROM "
              "memory_observations GROUP BY lease_id, model, device, amp, imgsz, batch, COALESCE(libtorch, '') "
              "ORDER BY device, model, lease_id"));
  std::vector<MemoryObservation> out;
  while (sqlite3_step(statement.get()) == SQLITE_ROW) {
    MemoryObservation observation;
    observation.model = text(statement.get(), 0);
    observation.device = text(statement.get(), 1);
    observation.amp = sqlite3_column_int(statement.get(), 2) == 1;
    observation.imgsz = sqlite3_column_int(statement.get(), 3);
    observation.batch = sqlite3_column_int(statement.get(), 4);
    observation.peak_gib = sqlite3_column_double(statement.get(), 5);
    observation.libtorch = text(statement.get(), 6);
    out.push_back(observation);
  }
  return out;
}

int64_t Store::count_heartbeats() {
  Statement statement(prepare("SELECT COUNT(*) FROM heartbeats"));
  return sqlite3_step(statement.get()) == SQLITE_ROW ? sqlite3_column_int64(statement.get(), 0) : 0;
}

namespace {

using Connection = std::unique_ptr<sqlite3, int (*)(sqlite3*)>;

Connection open_connection(const std::string& path, int flags) {
  sqlite3* raw = nullptr;
  if (sqlite3_open_v2(path.c_str(), &raw, flags, nullptr) != SQLITE_OK) {
    const std::string msg = raw ? sqlite3_errmsg(raw) : "out of memory";
    sqlite3_close(raw);
    throw StoreError(path + ": cannot open: " + msg);
  }
  sqlite3_busy_timeout(raw, 5000);
  return Connection(raw, sqlite3_close);
}

// 20261201T235959.123Z: sorts as it happened
std::string utc_stamp(int64_t ms) {
  const std::time_t seconds = static_cast<std::time_t>(ms / 1000);
  std::tm tm{};
  gmtime_r(&seconds, &tm);
  char text[32];
  std::strftime(text, sizeof text, "%Y%m%dT%H%M%S", &tm);
  char millis[8];
  std::snprintf(millis, sizeof millis, ".%03dZ", static_cast<int>(ms % 1000));
  return std::string(text) + millis;
}

std::vector<std::string> backups_of(const std::string& path) {
  namespace fs = std::filesystem;
  const fs::path file(path);
  const fs::path dir = file.has_parent_path() ? file.parent_path() : fs::path(".");
  const std::string prefix = file.filename().string() + ".backup-";
  std::vector<std::string> found;
  if (!fs::exists(dir)) return found;
  for (const auto& entry : fs::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind(prefix, 0) == 0 && name.size() > 4 && name.compare(name.size() - 4, 4, ".tmp") != 0) {
      found.push_back(entry.path().string());
    }
  }
  std::sort(found.rbegin(), found.rend());  // newest first
  return found;
}

// A file SQLite opens whose schema holds quotad's meta table.
bool is_quotad_database(const std::string& path) {
  std::error_code error;
  if (std::filesystem::file_size(path, error) == 0 || error) return false;
  try {
    Connection db = open_connection(path, SQLITE_OPEN_READONLY);
    sqlite3_stmt* raw = nullptr;
    if (sqlite3_prepare_v2(db.get(), "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'meta'", -1, &raw,
                           nullptr) != SQLITE_OK) {
      return false;
    }
    Statement statement(raw);
    return sqlite3_step(statement.get()) == SQLITE_ROW;
  } catch (const StoreError&) {
    return false;
  }
}

bool passes_quick_check(const std::string& path) {
  try {
    Connection db = open_connection(path, SQLITE_OPEN_READONLY);
    sqlite3_stmt* raw = nullptr;
    if (sqlite3_prepare_v2(db.get(), "PRAGMA quick_check(1)", -1, &raw, nullptr) != SQLITE_OK) return false;
    Statement statement(raw);
    return sqlite3_step(statement.get()) == SQLITE_ROW && text(statement.get(), 0) == "ok";
  } catch (const StoreError&) {
    return false;
  }
}

// The highest id of any kind a quotad database holds or has handed out: leases (rows, audit entries, heartbeats,
// quarantine, the counters in meta), approvals, loans, grants and audit sequence numbers. Tables a file of an older
// layout lacks, or a damaged file cannot yield, count as empty.
int64_t highest_id(sqlite3* db) {
  int64_t highest = 0;
  for (const char* sql :
       {"SELECT MAX(id) FROM leases", "SELECT MAX(id) FROM approvals", "SELECT MAX(id) FROM loans",
        "SELECT MAX(id) FROM grants", "SELECT MAX(seq) FROM audit", "SELECT MAX(lease_id) FROM audit",
        "SELECT MAX(lease_id) FROM heartbeats", "SELECT MAX(row_id) FROM quarantine",
        "SELECT MAX(CAST(value AS INTEGER)) - 1 FROM meta WHERE key IN ('next_lease_id', 'next_approval_id', "
        "'next_loan_id', 'next_grant_id')",
        "SELECT CAST(value AS INTEGER) FROM meta WHERE key = 'audit_head'"}) {
    sqlite3_stmt* raw = nullptr;
    if (sqlite3_prepare_v2(db, sql, -1, &raw, nullptr) != SQLITE_OK) {
      sqlite3_finalize(raw);
      continue;
    }
    Statement statement(raw);
    if (sqlite3_step(statement.get()) == SQLITE_ROW)
      highest = std::max<int64_t>(highest, sqlite3_column_int64(statement.get(), 0));
  }
  return highest;
}

// highest_id() of the file at `path`, read-only; 0 when it cannot be opened.
int64_t highest_id_of(const std::string& path) {
  try {
    Connection db = open_connection(path, SQLITE_OPEN_READONLY);
    return highest_id(db.get());
  } catch (const StoreError&) {
    return 0;
  }
}

void remove_database_files(const std::string& path) {
  for (const char* suffix : {"", "-wal", "-shm"}) std::filesystem::remove(path + suffix);
}

// How rows read from the damaged file join the rebuilt one: the damaged file is newer than any backup, so its
// state rows replace, its append-only rows add what the backup has not.
struct SalvageTable {
  const char* table;
  const char* conflict;      // "REPLACE" or "IGNORE"
  const char* newer_column;  // rows without a key: only those with this column above the rebuilt table's maximum
};
constexpr SalvageTable kSalvage[] = {
    {"leases", "REPLACE", nullptr},          {"approvals", "REPLACE", nullptr},
    {"loans", "REPLACE", nullptr},           {"grants", "REPLACE", nullptr},
    {"usage", "REPLACE", nullptr},           {"audit", "IGNORE", nullptr},
    {"heartbeats", "IGNORE", "ts_ms"},       {"memory_observations", "IGNORE", "ts_ms"},
    {"quarantine", "IGNORE", "moved_ms"},    {"receipt_key", "REPLACE", nullptr},  // the key that signed the receipts
    {"heartbeat_hours", "REPLACE", nullptr},
};

// Copies what `from` (damaged) still yields into `into`, table by table in rowid order; a read error skips ahead
// (doubling the stride) past the damaged page instead of ending the table.
void salvage(sqlite3* from, sqlite3* into, const std::string& path, RepairReport& report) {
  auto prepare_on = [&](sqlite3* db, const std::string& sql) -> Statement {
    sqlite3_stmt* raw = nullptr;
    if (sqlite3_prepare_v2(db, sql.c_str(), -1, &raw, nullptr) != SQLITE_OK) return Statement(nullptr);
    return Statement(raw);
  };
  for (const SalvageTable& t : kSalvage) {
    int64_t floor = std::numeric_limits<int64_t>::min();
    if (t.newer_column != nullptr) {
      Statement most = prepare_on(into, std::string("SELECT MAX(") + t.newer_column + ") FROM " + t.table);
      if (most && sqlite3_step(most.get()) == SQLITE_ROW && sqlite3_column_type(most.get(), 0) != SQLITE_NULL) {
        floor = sqlite3_column_int64(most.get(), 0);
      }
    }
    int64_t copied = 0, unreadable = 0, last_rowid = std::numeric_limits<int64_t>::min(), stride = 1;
    for (int attempts = 0; attempts < 64;) {
      const std::string from_rowid =
          last_rowid == std::numeric_limits<int64_t>::min() ? "" : " WHERE rowid > " + std::to_string(last_rowid);
      Statement rows =
          prepare_on(from, std::string("SELECT rowid, * FROM ") + t.table + from_rowid + " ORDER BY rowid");
      if (!rows) break;  // the table is not there (older schema) or its root is unreadable
      const int columns = sqlite3_column_count(rows.get());
      std::string names, marks;
      int newer = -1;  // the column of t.newer_column, if any
      for (int c = 1; c < columns; ++c) {
        names += std::string(c > 1 ? ", " : "") + sqlite3_column_name(rows.get(), c);
        marks += c > 1 ? ", ?" : "?";
        if (t.newer_column != nullptr && std::string(sqlite3_column_name(rows.get(), c)) == t.newer_column) newer = c;
      }
      Statement insert = prepare_on(
          into, std::string("INSERT OR ") + t.conflict + " INTO " + t.table + "(" + names + ") VALUES (" + marks + ")");
      if (!insert) break;
      int rc = SQLITE_ROW;
      while ((rc = sqlite3_step(rows.get())) == SQLITE_ROW) {
        last_rowid = sqlite3_column_int64(rows.get(), 0);
        stride = 1;
        if (newer > 0 && sqlite3_column_int64(rows.get(), newer) <= floor) continue;
        sqlite3_reset(insert.get());
        for (int c = 1; c < columns; ++c) sqlite3_bind_value(insert.get(), c, sqlite3_column_value(rows.get(), c));
        if (sqlite3_step(insert.get()) == SQLITE_DONE) ++copied;
      }
      if (rc == SQLITE_DONE) break;
      ++unreadable;  // a damaged page: jump past it
      ++attempts;
      if (last_rowid == std::numeric_limits<int64_t>::min()) last_rowid = 0;
      last_rowid += stride;
      stride *= 2;
    }
    report.salvaged.push_back(
        std::string(t.table) + ": " + std::to_string(copied) + " rows" +
        (unreadable > 0 ? " (" + std::to_string(unreadable) + " unreadable stretches skipped)" : ""));
  }
  // the id sequences: above everything either file used; the chain head as the damaged file last recorded it
  Statement meta = prepare_on(from, "SELECT key, value FROM meta");
  while (meta && sqlite3_step(meta.get()) == SQLITE_ROW) {
    const std::string key = text(meta.get(), 0), value = text(meta.get(), 1);
    const bool counter = key.rfind("next_", 0) == 0;
    Statement upsert = prepare_on(
        into, counter ? "INSERT INTO meta(key, value) VALUES (?1, ?2) ON CONFLICT(key) DO UPDATE SET value = "
                        "CAST(MAX(CAST(value AS INTEGER), CAST(?2 AS INTEGER)) AS TEXT)"
                      : "INSERT OR REPLACE INTO meta(key, value) VALUES (?1, ?2)");
    if (!upsert) continue;
    bind_text(upsert.get(), 1, key);
    bind_text(upsert.get(), 2, value);
    if (sqlite3_step(upsert.get()) != SQLITE_DONE) {
      throw StoreError(path + ": writing the rebuilt database: " + sqlite3_errmsg(into));
    }
  }
}

}  // namespace

std::string backup_database(const std::string& path, int64_t now_ms, int keep) {
  if (!std::filesystem::exists(path)) throw StoreError(path + ": no such database");
  const std::string target = path + ".backup-" + utc_stamp(now_ms);
  const std::string temporary = target + ".tmp";
  remove_database_files(temporary);
  {
    Connection source = open_connection(path, SQLITE_OPEN_READONLY);
    Connection copy = open_connection(temporary, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE);
    sqlite3_backup* backup = sqlite3_backup_init(copy.get(), "main", source.get(), "main");
    if (backup == nullptr) throw StoreError(temporary + ": backup: " + sqlite3_errmsg(copy.get()));
    int rc = SQLITE_OK;
    for (int attempt = 0; attempt < 100; ++attempt) {
      rc = sqlite3_backup_step(backup, -1);
      if (rc != SQLITE_BUSY && rc != SQLITE_LOCKED) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    sqlite3_backup_finish(backup);
    if (rc != SQLITE_DONE) {
      const std::string message = sqlite3_errstr(rc);
      copy.reset();
      remove_database_files(temporary);
      throw StoreError(path + ": backup to " + target + " failed: " + message);
    }
  }
  std::filesystem::rename(temporary, target);
  const std::vector<std::string> all = backups_of(path);
  for (size_t i = static_cast<size_t>(std::max(1, keep)); i < all.size(); ++i) std::filesystem::remove(all[i]);
  return target;
}

std::vector<std::string> good_backups(const std::string& path) {
  std::vector<std::string> good;
  for (const std::string& candidate : backups_of(path)) {
    if (is_quotad_database(candidate) && passes_quick_check(candidate)) good.push_back(candidate);
  }
  return good;
}

namespace {

// When the backup `backup` of `path` was taken (UTC ms, from its name); -1 when the name holds no time.
int64_t backup_taken_ms(const std::string& path, const std::string& backup) {
  const std::string prefix = std::filesystem::path(path).filename().string() + ".backup-";
  const std::string name = std::filesystem::path(backup).filename().string();
  if (name.rfind(prefix, 0) != 0) return -1;
  const std::string stamp = name.substr(prefix.size());
  std::tm tm{};
  int millis = 0;
  if (stamp.size() < 15 || strptime(stamp.c_str(), "%Y%m%dT%H%M%S", &tm) == nullptr) return -1;
  if (stamp.size() >= 19 && stamp[15] == '.') millis = std::atoi(stamp.substr(16, 3).c_str());
  return static_cast<int64_t>(timegm(&tm)) * 1000 + millis;
}

}  // namespace

int64_t newest_backup_ms(const std::string& path) {
  for (const std::string& backup : backups_of(path)) {  // newest first
    const int64_t taken_ms = backup_taken_ms(path, backup);
    if (taken_ms >= 0) return taken_ms;
  }
  return -1;
}

int64_t next_backup_in_ms(const std::string& path, int64_t every_ms, int64_t now_ms) {
  const int64_t taken_ms = newest_backup_ms(path);
  return taken_ms < 0 ? 0 : std::max<int64_t>(0, taken_ms + every_ms - now_ms);
}

struct PeriodicBackup::State {
  std::mutex mutex;
  std::condition_variable wake;
  bool stop = false;
  std::thread thread;
};

PeriodicBackup::PeriodicBackup(std::string path, int every_minutes, int keep) : state_(std::make_shared<State>()) {
  if (every_minutes <= 0) return;
  state_->thread = std::thread([state = state_, path = std::move(path), every_minutes, keep] {
    const auto now_ms = [] {
      return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
          .count();
    };
    const int64_t every_ms = int64_t{every_minutes} * 60000;
    int64_t wait_ms = next_backup_in_ms(path, every_ms, now_ms());
    std::printf("quotad: next backup of %s in %lld s (every %d min, from the newest beside it)\n", path.c_str(),
                static_cast<long long>(wait_ms / 1000), every_minutes);
    std::fflush(stdout);
    std::unique_lock<std::mutex> lock(state->mutex);
    while (!state->wake.wait_for(lock, std::chrono::milliseconds(wait_ms), [&] { return state->stop; })) {
      lock.unlock();
      try {
        std::printf("quotad: backup %s\n", backup_database(path, now_ms(), keep).c_str());
        std::fflush(stdout);
      } catch (const std::exception& error) {
        std::fprintf(stderr, "quotad: backup failed (retried in %d min): %s\n", every_minutes, error.what());
      }
      wait_ms = every_ms;
      lock.lock();
    }
  });
}

PeriodicBackup::~PeriodicBackup() {
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->stop = true;
  }
  state_->wake.notify_all();
  if (state_->thread.joinable()) state_->thread.join();
}

int64_t next_id_epoch(int64_t highest_known) {
  return (std::max<int64_t>(highest_known, 0) + 2 * kIdEpochSpan - 1) / kIdEpochSpan * kIdEpochSpan;
}

RepairReport repair_database(const std::string& path, int64_t now_ms) {
  RepairReport report;
  const std::vector<std::string> backups = good_backups(path);
  // what the file being replaced still tells about the ids it handed out (more than its backup may know)
  int64_t highest_before = 0;
  std::string cause;
  if (!std::filesystem::exists(path)) {
    if (backups.empty()) {
      throw StoreError(path + ": no such database, and no good backup (" + path + ".backup-*) beside it to restore");
    }
    std::filesystem::copy_file(backups.front(), path);
    report.restored_from = backups.front();
    cause = "the database was missing";
  } else {
    report.backup = path + ".bak-" + std::to_string(now_ms);
    // a plain copy of the file and its WAL (quotad is stopped), before anything is changed
    for (const char* suffix : {"", "-wal"}) {
      if (!std::filesystem::exists(path + suffix)) continue;
      std::filesystem::copy_file(path + suffix, report.backup + suffix);
    }
    highest_before = highest_id_of(report.backup);
    if (!is_quotad_database(path)) {
      // an empty file (the shell's `.recover` on Debian's sqlite3 3.40 writes one) or someone else's: never start over
      if (backups.empty()) {
        throw StoreError(path + ": empty or not a quotad database, and no good backup (" + path +
                         ".backup-*) to restore it from: refusing to repair it into a fresh database (every lease, "
                         "audit entry and ledger row would be gone); the untouched file is kept as " +
                         report.backup);
      }
      remove_database_files(path);
      std::filesystem::copy_file(backups.front(), path);
      report.restored_from = backups.front();
      cause = "the database was empty or not a quotad database";
    } else if (!passes_quick_check(path)) {
      const std::string rebuilt = path + ".rebuilt-" + std::to_string(now_ms);
      remove_database_files(rebuilt);
      if (!backups.empty()) {
        std::filesystem::copy_file(backups.front(), rebuilt);
        report.restored_from = backups.front();
      }
      // the current schema (a backup of an older quotad gains its new columns); the steps are not audited here, as
      // the audit rows salvaged next keep their sequence numbers and an entry of this scratch file would take one
      { Store schema(rebuilt, false, 30000, false); }
      {
        Connection from = open_connection(path, SQLITE_OPEN_READWRITE);
        Connection into = open_connection(rebuilt, SQLITE_OPEN_READWRITE);
        sqlite3_exec(into.get(), "BEGIN IMMEDIATE", nullptr, nullptr, nullptr);
        salvage(from.get(), into.get(), path, report);
        if (sqlite3_exec(into.get(), "COMMIT", nullptr, nullptr, nullptr) != SQLITE_OK) {
          throw StoreError(rebuilt + ": " + sqlite3_errmsg(into.get()));
        }
      }
      remove_database_files(path);
      std::filesystem::rename(rebuilt, path);
      for (const char* suffix : {"-wal", "-shm"}) std::filesystem::remove(rebuilt + suffix);
      cause = "the database was damaged; rebuilt from " +
              (backups.empty() ? std::string("what it still yielded") : "a backup and what the file still yielded");
    }
  }
  Store store(path);  // refuses what is still damaged
  store.repair(now_ms, report);
  if (!cause.empty()) {
    if (!report.restored_from.empty()) {
      const int64_t taken_ms = backup_taken_ms(path, report.restored_from);
      cause += "; restored from " + std::filesystem::path(report.restored_from).filename().string() +
               (taken_ms < 0 ? std::string() : " (taken " + utc_text(taken_ms, "%Y-%m-%d %H:%M:%S UTC") + ")");
    }
    report.id_epoch = store.open_id_epoch(now_ms, highest_before, cause);
    int64_t from = 0;
    int64_t to = 0;
    for (const AuditEntry& entry : store.audit(report.id_epoch - 1, 1)) {
      if (declared_gap(entry.action, entry.detail, from, to)) {
        report.lost_entries = "entries " + std::to_string(from) + " to " + std::to_string(to);
      }
    }
  }
  report.unrecorded = store.unrecorded_objects();
  return report;
}

void Store::repair(int64_t now_ms, RepairReport& report) {
  begin_immediate();
  try {
    auto set_aside = [&](const char* table, auto from_json) {
      std::vector<std::pair<int64_t, std::string>> bad;
      {
        Statement statement(prepare((std::string("SELECT id, body FROM ") + table).c_str()));
        while (sqlite3_step(statement.get()) == SQLITE_ROW) {
          try {
            from_json(nlohmann::json::parse(text(statement.get(), 1)));
          } catch (const std::exception& error) {
            bad.emplace_back(sqlite3_column_int64(statement.get(), 0), error.what());
          }
        }
      }
      for (const auto& [id, why] : bad) {
        Statement copy(prepare(
            (std::string(
                 "INSERT INTO quarantine(source, row_id, body, error, moved_ms) SELECT ?, id, body, ?, ? FROM ") +
             table + " WHERE id = ?")
                .c_str()));
        bind_text(copy.get(), 1, table);
        bind_text(copy.get(), 2, why);
        sqlite3_bind_int64(copy.get(), 3, now_ms);
        sqlite3_bind_int64(copy.get(), 4, id);
        if (sqlite3_step(copy.get()) != SQLITE_DONE) fail("quarantine row");
        Statement remove(prepare((std::string("DELETE FROM ") + table + " WHERE id = ?").c_str()));
        sqlite3_bind_int64(remove.get(), 1, id);
        if (sqlite3_step(remove.get()) != SQLITE_DONE) fail("remove row");
        report.quarantined.push_back(std::string(table) + " row " + std::to_string(id) + ": " + why);
      }
    };
    set_aside("leases", &lease_from_json);
    set_aside("approvals", &approval_from_json);
    set_aside("loans", &loan_from_json);
    set_aside("grants", &grant_from_json);
    {
      // every sequence number without an entry, but those a restore's audit.gap entry already declares lost
      Statement entries(prepare("SELECT seq, action, detail FROM audit ORDER BY seq"));
      int64_t expected = 1;
      while (sqlite3_step(entries.get()) == SQLITE_ROW) {
        const int64_t seq = sqlite3_column_int64(entries.get(), 0);
        int64_t from = 0;
        int64_t to = 0;
        const bool declared =
            declared_gap(text(entries.get(), 1), text(entries.get(), 2), from, to) && from == expected && to == seq - 1;
        for (int64_t lost = expected; lost < seq && !declared; ++lost) report.audit_gaps.push_back(lost);
        expected = seq + 1;
      }
    }
    Statement gap(
        prepare("INSERT INTO audit(seq, ts_ms, actor, action, lease_id, team, detail) VALUES (?, ?, 'quotad', "
                "'audit.gap', 0, '', 'this entry was lost before the repair; recorded by quotad repair-db')"));
    for (int64_t seq : report.audit_gaps) {
      sqlite3_reset(gap.get());
      sqlite3_bind_int64(gap.get(), 1, seq);
      sqlite3_bind_int64(gap.get(), 2, now_ms);
      if (sqlite3_step(gap.get()) != SQLITE_DONE) fail("record audit gap");
    }
    commit();
  } catch (...) {
    rollback();
    throw;
  }
}

int64_t Store::open_id_epoch(int64_t now_ms, int64_t highest_elsewhere, const std::string& cause) {
  begin_immediate();
  try {
    const int64_t first = next_id_epoch(std::max(highest_id(db_), highest_elsewhere));
    Statement counter(prepare("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)"));
    for (const char* key : {"next_lease_id", "next_approval_id", "next_loan_id", "next_grant_id"}) {
      sqlite3_reset(counter.get());
      bind_text(counter.get(), 1, key);
      bind_text(counter.get(), 2, std::to_string(first));
      if (sqlite3_step(counter.get()) != SQLITE_DONE) fail("move the id sequences to a new epoch");
    }
    int64_t last_seq = 0;
    {
      Statement statement(prepare("SELECT COALESCE(MAX(seq), 0) FROM audit"));
      if (sqlite3_step(statement.get()) == SQLITE_ROW) last_seq = sqlite3_column_int64(statement.get(), 0);
    }
    AuditEntry gap;
    gap.seq = first;
    gap.ts_ms = now_ms;
    gap.actor = "quotad";
    gap.action = "audit.gap";
    gap.detail = "entries " + std::to_string(last_seq + 1) + " to " + std::to_string(first - 1) + " lost: " + cause +
                 "; every id continues at " + std::to_string(first);
    append_audit({gap});
    commit();
    return first;
  } catch (...) {
    rollback();
    throw;
  }
}

std::vector<std::string> Store::unrecorded_objects() {
  // an audited lease is in the leases table for good (ended ones too) unless repair set it aside; loans and
  // grants likewise, their ids leading the entries' details ("loan 7: ...", "grant 3: ...")
  Statement statement(prepare(
      "SELECT 'lease', lease_id, MIN(seq), action FROM audit WHERE lease_id > 0 AND lease_id NOT IN "
      "(SELECT id FROM leases) AND lease_id NOT IN (SELECT row_id FROM quarantine WHERE source = 'leases') "
      "GROUP BY lease_id "
      "UNION ALL SELECT 'loan', CAST(substr(detail, 6) AS INTEGER) AS id, MIN(seq), action FROM audit WHERE action "
      "LIKE 'loan.%' AND detail LIKE 'loan %' AND CAST(substr(detail, 6) AS INTEGER) NOT IN (SELECT id FROM loans) "
      "AND CAST(substr(detail, 6) AS INTEGER) NOT IN (SELECT row_id FROM quarantine WHERE source = 'loans') "
      "GROUP BY id "
      "UNION ALL SELECT 'grant', CAST(substr(detail, 7) AS INTEGER) AS id, MIN(seq), action FROM audit WHERE action "
      "= 'credit.granted' AND detail LIKE 'grant %' AND CAST(substr(detail, 7) AS INTEGER) NOT IN (SELECT id FROM "
      "grants) AND CAST(substr(detail, 7) AS INTEGER) NOT IN (SELECT row_id FROM quarantine WHERE source = "
      "'grants') GROUP BY id ORDER BY 3"));
  std::vector<std::string> found;
  while (sqlite3_step(statement.get()) == SQLITE_ROW) {
    found.push_back(text(statement.get(), 0) + " " + std::to_string(sqlite3_column_int64(statement.get(), 1)) +
                    ": the audit log records it (" + text(statement.get(), 3) + ", entry " +
                    std::to_string(sqlite3_column_int64(statement.get(), 2)) + ") but no table holds it");
  }
  return found;
}

void prepare_database(const std::string& path, bool init, int64_t now_ms) {
  if (std::filesystem::exists(path)) return;
  const std::vector<std::string> backups = good_backups(path);
  if (backups.empty()) return;  // a first start
  if (!init) {
    throw StoreError(path + ": no such database, but backups of one lie beside it (the newest: " + backups.front() +
                     "); starting on an empty database would lose every lease, audit entry and ledger row: run "
                     "`quotad repair-db --db " +
                     path + "` to restore the newest, or start with --init to begin an empty one");
  }
  int64_t highest = 0;
  for (const std::string& backup : backups) highest = std::max(highest, highest_id_of(backup));
  Store store(path);
  store.open_id_epoch(now_ms, highest,
                      "a new empty database created with --init beside backups of an earlier one (the newest: " +
                          std::filesystem::path(backups.front()).filename().string() + ")");
}

namespace {

bool running(const Lease& lease) { return lease.state == LeaseState::kGranted || lease.state == LeaseState::kRevoking; }

}  // namespace

void replay_heartbeats(const std::string& db_path, const Engine& engine, UtilTracker& tracker) {
  StoreReader reader(db_path);
  for (const auto& [id, lease] : engine.leases()) {
    if (!running(lease)) continue;
    tracker.forget(id);
    reader.fold_util_of(id, tracker);
  }
}

void Store::replay_heartbeats(const Engine& engine, UtilTracker& tracker) {
  yolo8::quota::replay_heartbeats(path_, engine, tracker);
}

StoreReader::StoreReader(const std::string& path) : path_(path) {
  if (sqlite3_open_v2(path.c_str(), &db_, SQLITE_OPEN_READONLY, nullptr) != SQLITE_OK) {
    const std::string msg = db_ ? sqlite3_errmsg(db_) : "out of memory";
    sqlite3_close(db_);
    db_ = nullptr;
    throw StoreError(path + ": cannot open the quota database: " + msg);
  }
  sqlite3_busy_timeout(db_, 10000);
}

StoreReader::~StoreReader() {
  if (db_ != nullptr) sqlite3_close(db_);
}

sqlite3_stmt* StoreReader::prepare(const char* sql) {
  sqlite3_stmt* statement = nullptr;
  if (sqlite3_prepare_v2(db_, sql, -1, &statement, nullptr) != SQLITE_OK) {
    throw StoreError(path_ + ": not a quotad database (" + sqlite3_errmsg(db_) + ")");
  }
  return statement;
}

bool StoreReader::has_table(const char* table) {
  Statement statement(prepare("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?"));
  sqlite3_bind_text(statement.get(), 1, table, -1, SQLITE_STATIC);
  return sqlite3_step(statement.get()) == SQLITE_ROW;
}

std::vector<Lease> StoreReader::leases_since(int64_t ended_since_ms) {
  // the texts of the terminal states (is_terminal), as to_string(LeaseState) writes them
  Statement statement(prepare(
      "SELECT id, body FROM leases WHERE state NOT IN ('released','expired','rejected') OR ended_ms >= ? ORDER BY id"));
  sqlite3_bind_int64(statement.get(), 1, ended_since_ms);
  std::vector<Lease> out;
  while (sqlite3_step(statement.get()) == SQLITE_ROW) {
    out.push_back(decode_row<Lease>(path_, "leases", statement.get(), &lease_from_json));
  }
  return out;
}

void StoreReader::util_samples(int64_t from_ms, int64_t to_ms, const UtilVisitor& visit) {
  Statement statement(
      prepare("SELECT lease_id, ts_ms, gpu_util FROM heartbeats WHERE ts_ms >= ? AND ts_ms < ? AND gpu_util >= 0 "
              "ORDER BY lease_id, ts_ms"));
  sqlite3_bind_int64(statement.get(), 1, from_ms);
  sqlite3_bind_int64(statement.get(), 2, to_ms);
  while (sqlite3_step(statement.get()) == SQLITE_ROW) {
    visit(sqlite3_column_int64(statement.get(), 0), sqlite3_column_int64(statement.get(), 1),
          sqlite3_column_double(statement.get(), 2));
  }
}

// The history is left out of the open's quick_check (Store::check_integrity): a damaged page of it is an error
// here, never a shorter history.
bool StoreReader::next_row(sqlite3_stmt* statement, const char* table) {
  const int rc = sqlite3_step(statement);
  if (rc == SQLITE_ROW) return true;
  if (rc == SQLITE_DONE) return false;
  throw StoreError(path_ + ": table " + table + ": " + sqlite3_errmsg(db_) +
                   " (quotad repair-db checks and repairs the whole file: see quota/README.md)");
}

int64_t StoreReader::summarised_mark() {
  Statement statement(prepare("SELECT value FROM meta WHERE key = ?"));
  sqlite3_bind_text(statement.get(), 1, kHeartbeatsSummarisedKey, -1, SQLITE_STATIC);
  return sqlite3_step(statement.get()) == SQLITE_ROW ? sqlite3_column_int64(statement.get(), 0) : 0;
}

void StoreReader::fold_util(int64_t from_ms, int64_t to_ms, UtilTracker& tracker) {
  Statement raw(
      prepare("SELECT lease_id, ts_ms, gpu_util FROM heartbeats WHERE ts_ms >= ? AND ts_ms < ? AND gpu_util >= 0 "
              "ORDER BY lease_id, ts_ms, rowid"));
  sqlite3_bind_int64(raw.get(), 1, std::max(from_ms, summarised_mark()));
  sqlite3_bind_int64(raw.get(), 2, to_ms);
  Statement hours;
  if (has_table("heartbeat_hours")) {
    hours.reset(prepare((std::string("SELECT ") + kHourColumns +
                         " FROM heartbeat_hours WHERE hour_ms >= ? AND hour_ms < ? ORDER BY lease_id, hour_ms")
                            .c_str()));
    sqlite3_bind_int64(hours.get(), 1, from_ms);
    sqlite3_bind_int64(hours.get(), 2, to_ms);
  }
  // lease by lease: its summed-up hours, then its samples above the mark (all newer)
  bool raw_row = next_row(raw.get(), "heartbeats");
  bool hour_row = hours && next_row(hours.get(), "heartbeat_hours");
  while (raw_row || hour_row) {
    const int64_t lease = !hour_row ? sqlite3_column_int64(raw.get(), 0)
                          : !raw_row
                              ? sqlite3_column_int64(hours.get(), 0)
                              : std::min(sqlite3_column_int64(raw.get(), 0), sqlite3_column_int64(hours.get(), 0));
    while (hour_row && sqlite3_column_int64(hours.get(), 0) == lease) {
      tracker.observe_summary(lease, hour_summary(hours.get(), 2));
      hour_row = next_row(hours.get(), "heartbeat_hours");
    }
    while (raw_row && sqlite3_column_int64(raw.get(), 0) == lease) {
      tracker.observe(lease, sqlite3_column_int64(raw.get(), 1), sqlite3_column_double(raw.get(), 2));
      raw_row = next_row(raw.get(), "heartbeats");
    }
  }
}

void StoreReader::fold_util_of(int64_t lease_id, UtilTracker& tracker) {
  if (has_table("heartbeat_hours")) {
    Statement hours(prepare(
        (std::string("SELECT ") + kHourColumns + " FROM heartbeat_hours WHERE lease_id = ? ORDER BY hour_ms").c_str()));
    sqlite3_bind_int64(hours.get(), 1, lease_id);
    while (next_row(hours.get(), "heartbeat_hours")) tracker.observe_summary(lease_id, hour_summary(hours.get(), 2));
  }
  Statement raw(prepare(
      "SELECT ts_ms, gpu_util FROM heartbeats WHERE lease_id = ? AND ts_ms >= ? AND gpu_util >= 0 ORDER BY ts_ms, "
      "rowid"));
  sqlite3_bind_int64(raw.get(), 1, lease_id);
  sqlite3_bind_int64(raw.get(), 2, summarised_mark());
  while (next_row(raw.get(), "heartbeats")) {
    tracker.observe(lease_id, sqlite3_column_int64(raw.get(), 0), sqlite3_column_double(raw.get(), 1));
  }
}

void StoreReader::util_samples_of(int64_t lease_id, const UtilVisitor& visit) {
  Statement statement(
      prepare("SELECT ts_ms, gpu_util FROM heartbeats WHERE lease_id = ? AND gpu_util >= 0 ORDER BY ts_ms"));
  sqlite3_bind_int64(statement.get(), 1, lease_id);
  while (sqlite3_step(statement.get()) == SQLITE_ROW) {
    visit(lease_id, sqlite3_column_int64(statement.get(), 0), sqlite3_column_double(statement.get(), 1));
  }
}

std::map<std::pair<std::string, std::string>, double> StoreReader::usage(const std::vector<std::string>& months) {
  Statement statement(prepare("SELECT user, month, gpu_hours FROM usage"));
  std::map<std::pair<std::string, std::string>, double> out;
  while (sqlite3_step(statement.get()) == SQLITE_ROW) {
    std::string month = text(statement.get(), 1);
    if (!months.empty() && std::find(months.begin(), months.end(), month) == months.end()) continue;
    out[{text(statement.get(), 0), std::move(month)}] = sqlite3_column_double(statement.get(), 2);
  }
  return out;
}

// Every row of a ledger table (id, body), decoded; none where the database predates the table.
template <typename Record>
std::vector<Record> StoreReader::ledger_rows(const char* table, Record (*from_json)(const nlohmann::json&)) {
  std::vector<Record> out;
  if (!has_table(table)) return out;
  Statement statement(prepare((std::string("SELECT id, body FROM ") + table + " ORDER BY id").c_str()));
  while (sqlite3_step(statement.get()) == SQLITE_ROW)
    out.push_back(decode_row<Record>(path_, table, statement.get(), from_json));
  return out;
}

std::vector<Loan> StoreReader::loans() { return ledger_rows<Loan>("loans", &loan_from_json); }

std::vector<CreditGrant> StoreReader::grants() { return ledger_rows<CreditGrant>("grants", &grant_from_json); }

std::vector<AuditEntry> StoreReader::audit(const std::string& action, int64_t after_seq) {
  Statement statement(
      prepare("SELECT seq, ts_ms, actor, action, lease_id, team, detail FROM audit WHERE seq > ? AND (? = '' OR "
              "action = ?) ORDER BY seq"));
  sqlite3_bind_int64(statement.get(), 1, after_seq);
  bind_text(statement.get(), 2, action);
  bind_text(statement.get(), 3, action);
  std::vector<AuditEntry> out;
  while (sqlite3_step(statement.get()) == SQLITE_ROW) {
    AuditEntry entry;
    entry.seq = sqlite3_column_int64(statement.get(), 0);
    entry.ts_ms = sqlite3_column_int64(statement.get(), 1);
    entry.actor = text(statement.get(), 2);
    entry.action = text(statement.get(), 3);
    entry.lease_id = sqlite3_column_int64(statement.get(), 4);
    entry.team = text(statement.get(), 5);
    entry.detail = text(statement.get(), 6);
    out.push_back(std::move(entry));
  }
  return out;
}

bool AuditChainVerifier::broken(int64_t seq, const std::string& problem) {
  check_.intact = false;
  check_.broken_seq = seq;
  check_.problem = "entry " + std::to_string(seq) + ": " + problem;
  return false;
}

bool AuditChainVerifier::add(const AuditEntry& entry, const std::string* chain) {
  if (!check_.intact) return false;
  ++check_.entries;
  if (entry.seq != expected_) {
    // a restore's declared loss, itself chained (below) to the entries before it
    int64_t lost_from = 0;
    int64_t lost_to = 0;
    if (!declared_gap(entry.action, entry.detail, lost_from, lost_to) || lost_from != expected_ ||
        lost_to != entry.seq - 1) {
      return broken(expected_, "missing: deleted, or lost before a repair");
    }
    check_.recorded_gaps.push_back(entry.detail);
  }
  expected_ = entry.seq + 1;
  if (chain == nullptr) {
    if (!chained_) {
      ++check_.unchained;
      return true;
    }
    return broken(entry.seq, entry.action == "audit.gap"
                                 ? "lost: quotad repair-db recorded the gap"
                                 : "has no hash: written into the log around quotad, after the chain began");
  }
  chained_ = true;
  if (*chain != audit_chain_link(link_, entry)) {
    return broken(entry.seq, "its hash does not match: the entry, or the one before it, was changed");
  }
  link_ = *chain;
  check_.head_seq = entry.seq;
  check_.head = link_;
  return true;
}

AuditChainCheck AuditChainVerifier::finish(const std::string& recorded_head) {
  if (!check_.intact) return check_;
  if (recorded_head.empty()) {
    if (chained_) broken(check_.head_seq, "the recorded head of the chain (meta audit_head) is missing");
    return check_;
  }
  const int64_t head_seq = std::strtoll(recorded_head.c_str(), nullptr, 10);
  const std::string head_link = recorded_head.substr(recorded_head.find(' ') + 1);
  if (head_seq > check_.head_seq) {
    broken(check_.head_seq + 1, "missing: the log ends at " + std::to_string(check_.head_seq) +
                                    ", the recorded head is entry " + std::to_string(head_seq) +
                                    " (the last entries were deleted)");
  } else if (head_seq != check_.head_seq || head_link != check_.head) {
    broken(check_.head_seq, "does not match the recorded head of the chain (entry " + std::to_string(head_seq) +
                                "): it was changed or added after it was written");
  }
  return check_;
}

AuditChainCheck verify_audit_chain(const std::string& db_path) {
  const Connection db = open_connection(db_path, SQLITE_OPEN_READONLY);
  auto query = [&](const char* sql) {
    sqlite3_stmt* statement = nullptr;
    if (sqlite3_prepare_v2(db.get(), sql, -1, &statement, nullptr) != SQLITE_OK) {
      throw StoreError(db_path + ": " + sqlite3_errmsg(db.get()));
    }
    return Statement(statement);
  };
  bool has_chain = false;
  {
    Statement columns = query("SELECT name FROM pragma_table_info('audit')");
    while (sqlite3_step(columns.get()) == SQLITE_ROW) has_chain |= text(columns.get(), 0) == "chain";
  }
  Statement rows =
      query(has_chain ? "SELECT seq, ts_ms, actor, action, lease_id, team, detail, chain FROM audit ORDER BY seq"
                      : "SELECT seq, ts_ms, actor, action, lease_id, team, detail, NULL FROM audit ORDER BY seq");
  AuditChainVerifier verifier;
  int rc = SQLITE_ROW;
  while ((rc = sqlite3_step(rows.get())) == SQLITE_ROW) {
    AuditEntry entry;
    entry.seq = sqlite3_column_int64(rows.get(), 0);
    entry.ts_ms = sqlite3_column_int64(rows.get(), 1);
    entry.actor = text(rows.get(), 2);
    entry.action = text(rows.get(), 3);
    entry.lease_id = sqlite3_column_int64(rows.get(), 4);
    entry.team = text(rows.get(), 5);
    entry.detail = text(rows.get(), 6);
    const bool linked = sqlite3_column_type(rows.get(), 7) != SQLITE_NULL;
    const std::string chain = linked ? text(rows.get(), 7) : std::string();
    if (!verifier.add(entry, linked ? &chain : nullptr)) return verifier.finish("");
  }
  if (rc != SQLITE_DONE) throw StoreError(db_path + ": table audit: " + sqlite3_errmsg(db.get()));
  std::string head;
  {
    Statement meta = query("SELECT value FROM meta WHERE key = 'audit_head'");
    if (sqlite3_step(meta.get()) == SQLITE_ROW) head = text(meta.get(), 0);
  }
  return verifier.finish(head);
}

}  // namespace yolo8::quota
