// Numbered schema steps: every layout quotad shipped before the numbering is brought to the newest version with
// nothing lost, a newer database is refused, and a step that fails leaves the file as it was.
#include <sqlite3.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "quota/core/receipt.h"
#include "quota/store/store.h"
#include "tests/quota/quota_test_util.h"

namespace yolo8::quota {
namespace {

using testing::kHour;
using testing::kMonday;
using testing::temp_db;

// A database as an older quotad created it: its kSchema text, copied from the commit that shipped it, then what that
// quotad's open added to a new file; `added` is what the bridge reports adding to it.
struct Layout {
  const char* commit;
  const char* what;
  const char* sql;
  const char* added;
};

constexpr Layout kLayouts[] = {
    {"7f3ad59", "the first layout (quota: SQLite store, API service, HTTP server, client, quotad CLI)",
     R"SQL(
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
  memory_used_gib REAL, last_checkpoint_ms INTEGER);
CREATE INDEX IF NOT EXISTS heartbeats_lease ON heartbeats(lease_id, ts_ms);
INSERT OR IGNORE INTO meta(key, value) VALUES ('schema_version', '1');
)SQL",
     "table quarantine, table loans, table grants, table memory_observations, column heartbeats.gpu_util_source, "
     "column heartbeats.device_memory_used_gib, column heartbeats.process_memory_used_gib, column audit.chain"},
    {"e181c9f", "the quarantine table (quotad persists, then applies)",
     R"SQL(
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
  memory_used_gib REAL, last_checkpoint_ms INTEGER);
CREATE INDEX IF NOT EXISTS heartbeats_lease ON heartbeats(lease_id, ts_ms);
CREATE TABLE IF NOT EXISTS quarantine (
  source TEXT NOT NULL, row_id INTEGER NOT NULL, body TEXT, error TEXT NOT NULL, moved_ms INTEGER NOT NULL);
INSERT OR IGNORE INTO meta(key, value) VALUES ('schema_version', '1');
)SQL",
     "table loans, table grants, table memory_observations, column heartbeats.gpu_util_source, column "
     "heartbeats.device_memory_used_gib, column heartbeats.process_memory_used_gib, column audit.chain"},
    {"d056c17", "the ledger's loans and grants (branch 'ledger')",
     R"SQL(
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
  memory_used_gib REAL, last_checkpoint_ms INTEGER);
CREATE INDEX IF NOT EXISTS heartbeats_lease ON heartbeats(lease_id, ts_ms);
CREATE TABLE IF NOT EXISTS quarantine (
  source TEXT NOT NULL, row_id INTEGER NOT NULL, body TEXT, error TEXT NOT NULL, moved_ms INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS loans (
  id INTEGER PRIMARY KEY, state TEXT NOT NULL, user TEXT NOT NULL, month TEXT NOT NULL, body TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS grants (
  id INTEGER PRIMARY KEY, user TEXT NOT NULL, month TEXT NOT NULL, body TEXT NOT NULL);
INSERT OR IGNORE INTO meta(key, value) VALUES ('schema_version', '1');
)SQL",
     "table memory_observations, column heartbeats.gpu_util_source, column heartbeats.device_memory_used_gib, column "
     "heartbeats.process_memory_used_gib, column audit.chain"},
    {"e4631b7", "memory observations without the ledger (branch 'lease', before it merged main)",
     R"SQL(
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
  memory_used_gib REAL, last_checkpoint_ms INTEGER);
CREATE INDEX IF NOT EXISTS heartbeats_lease ON heartbeats(lease_id, ts_ms);
CREATE TABLE IF NOT EXISTS memory_observations (
  lease_id INTEGER NOT NULL, ts_ms INTEGER NOT NULL, model TEXT NOT NULL, imgsz INTEGER NOT NULL,
  batch INTEGER NOT NULL, amp INTEGER NOT NULL, device TEXT NOT NULL, peak_gib REAL NOT NULL);
CREATE INDEX IF NOT EXISTS memory_observations_key ON memory_observations(model, device, lease_id);
CREATE TABLE IF NOT EXISTS quarantine (
  source TEXT NOT NULL, row_id INTEGER NOT NULL, body TEXT, error TEXT NOT NULL, moved_ms INTEGER NOT NULL);
INSERT OR IGNORE INTO meta(key, value) VALUES ('schema_version', '1');
)SQL",
     "table loans, table grants, column heartbeats.gpu_util_source, column heartbeats.device_memory_used_gib, column "
     "heartbeats.process_memory_used_gib, column memory_observations.libtorch, column audit.chain"},
    {"3e4f9e3", "the ledger and memory observations together (the merge)",
     R"SQL(
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
  memory_used_gib REAL, last_checkpoint_ms INTEGER);
CREATE INDEX IF NOT EXISTS heartbeats_lease ON heartbeats(lease_id, ts_ms);
CREATE TABLE IF NOT EXISTS memory_observations (
  lease_id INTEGER NOT NULL, ts_ms INTEGER NOT NULL, model TEXT NOT NULL, imgsz INTEGER NOT NULL,
  batch INTEGER NOT NULL, amp INTEGER NOT NULL, device TEXT NOT NULL, peak_gib REAL NOT NULL);
CREATE INDEX IF NOT EXISTS memory_observations_key ON memory_observations(model, device, lease_id);
CREATE TABLE IF NOT EXISTS quarantine (
  source TEXT NOT NULL, row_id INTEGER NOT NULL, body TEXT, error TEXT NOT NULL, moved_ms INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS loans (
  id INTEGER PRIMARY KEY, state TEXT NOT NULL, user TEXT NOT NULL, month TEXT NOT NULL, body TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS grants (
  id INTEGER PRIMARY KEY, user TEXT NOT NULL, month TEXT NOT NULL, body TEXT NOT NULL);
INSERT OR IGNORE INTO meta(key, value) VALUES ('schema_version', '1');
)SQL",
     "column heartbeats.gpu_util_source, column heartbeats.device_memory_used_gib, column "
     "heartbeats.process_memory_used_gib, column memory_observations.libtorch, column audit.chain"},
    {"23d2b11", "heartbeats with gpu_util_source and device_memory_used_gib",
     R"SQL(
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
  memory_used_gib REAL, last_checkpoint_ms INTEGER, gpu_util_source TEXT, device_memory_used_gib REAL);
CREATE INDEX IF NOT EXISTS heartbeats_lease ON heartbeats(lease_id, ts_ms);
CREATE TABLE IF NOT EXISTS memory_observations (
  lease_id INTEGER NOT NULL, ts_ms INTEGER NOT NULL, model TEXT NOT NULL, imgsz INTEGER NOT NULL,
  batch INTEGER NOT NULL, amp INTEGER NOT NULL, device TEXT NOT NULL, peak_gib REAL NOT NULL);
CREATE INDEX IF NOT EXISTS memory_observations_key ON memory_observations(model, device, lease_id);
CREATE TABLE IF NOT EXISTS quarantine (
  source TEXT NOT NULL, row_id INTEGER NOT NULL, body TEXT, error TEXT NOT NULL, moved_ms INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS loans (
  id INTEGER PRIMARY KEY, state TEXT NOT NULL, user TEXT NOT NULL, month TEXT NOT NULL, body TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS grants (
  id INTEGER PRIMARY KEY, user TEXT NOT NULL, month TEXT NOT NULL, body TEXT NOT NULL);
INSERT OR IGNORE INTO meta(key, value) VALUES ('schema_version', '1');
)SQL",
     "column heartbeats.process_memory_used_gib, column memory_observations.libtorch, column audit.chain"},
    {"a5a92d4", "memory observations with libtorch",
     R"SQL(
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
  memory_used_gib REAL, last_checkpoint_ms INTEGER, gpu_util_source TEXT, device_memory_used_gib REAL);
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
INSERT OR IGNORE INTO meta(key, value) VALUES ('schema_version', '1');
)SQL",
     "column heartbeats.process_memory_used_gib, column audit.chain"},
    {"abe3393", "the audit chain: the same CREATE statements as a5a92d4, and the column its open added",
     R"SQL(
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
  memory_used_gib REAL, last_checkpoint_ms INTEGER, gpu_util_source TEXT, device_memory_used_gib REAL);
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
INSERT OR IGNORE INTO meta(key, value) VALUES ('schema_version', '1');
ALTER TABLE audit ADD COLUMN chain TEXT;
)SQL",
     "column heartbeats.process_memory_used_gib"},
    {"b1693bb", "heartbeats with process_memory_used_gib: the last layout before numbered versions",
     R"SQL(
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
INSERT OR IGNORE INTO meta(key, value) VALUES ('schema_version', '1');
ALTER TABLE audit ADD COLUMN chain TEXT;
)SQL",
     "nothing was missing"},
};

// Rows are compared as text, NULL apart.
using Rows = std::vector<std::vector<std::string>>;
constexpr const char* kNull = "<NULL>";

class Db {
 public:
  explicit Db(const std::string& path) { EXPECT_EQ(sqlite3_open(path.c_str(), &db_), SQLITE_OK) << path; }
  ~Db() { sqlite3_close(db_); }
  Db(const Db&) = delete;
  Db& operator=(const Db&) = delete;

  void execute(const std::string& sql) {
    char* error = nullptr;
    EXPECT_EQ(sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, &error), SQLITE_OK)
        << (error != nullptr ? error : "") << "\n"
        << sql;
    sqlite3_free(error);
  }

  Rows rows(const std::string& sql) {
    sqlite3_stmt* statement = nullptr;
    EXPECT_EQ(sqlite3_prepare_v2(db_, sql.c_str(), -1, &statement, nullptr), SQLITE_OK)
        << sqlite3_errmsg(db_) << ": " << sql;
    Rows out;
    while (statement != nullptr && sqlite3_step(statement) == SQLITE_ROW) {
      std::vector<std::string> row;
      for (int c = 0; c < sqlite3_column_count(statement); ++c) {
        const unsigned char* value = sqlite3_column_text(statement, c);
        row.push_back(value == nullptr ? kNull : reinterpret_cast<const char*>(value));
      }
      out.push_back(row);
    }
    sqlite3_finalize(statement);
    return out;
  }

  std::string value(const std::string& sql) {
    const Rows found = rows(sql);
    return found.empty() || found[0].empty() ? "" : found[0][0];
  }

  std::vector<std::string> tables() {
    std::vector<std::string> names;
    for (const auto& row : rows("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name"))
      names.push_back(row[0]);
    return names;
  }

  std::vector<std::string> columns(const std::string& table) {
    std::vector<std::string> names;
    for (const auto& row : rows("SELECT name FROM pragma_table_info('" + table + "') ORDER BY cid"))
      names.push_back(row[0]);
    return names;
  }

  // Every table with its columns (name, type, not null, default, key), every index and trigger with its columns.
  std::map<std::string, Rows> layout() {
    std::map<std::string, Rows> out;
    for (const auto& row : rows("SELECT type, name, tbl_name FROM sqlite_master ORDER BY type, name")) {
      if (row[0] == "table") {
        out["table " + row[1]] =
            rows("SELECT name, type, \"notnull\", dflt_value, pk FROM pragma_table_info('" + row[1] + "')");
      } else if (row[0] == "index") {
        out["index " + row[1]] = rows("SELECT name FROM pragma_index_info('" + row[1] + "') ORDER BY seqno");
        out["index " + row[1]].push_back({row[2]});
      } else {
        out[row[0] + " " + row[1]] = {{row[2]}};
      }
    }
    return out;
  }

  // The named columns of every row, by rowid.
  Rows dump(const std::string& table, const std::vector<std::string>& names) {
    std::string list;
    for (const auto& name : names) list += (list.empty() ? "" : ", ") + name;
    return rows("SELECT " + list + " FROM " + table + " ORDER BY rowid");
  }

 private:
  sqlite3* db_ = nullptr;
};

// Every table with its columns and rows, as found.
struct Contents {
  std::map<std::string, std::vector<std::string>> columns;
  std::map<std::string, Rows> rows;
};

Contents contents(const std::string& path) {
  Db db(path);
  Contents found;
  for (const std::string& table : db.tables()) {
    found.columns[table] = db.columns(table);
    found.rows[table] = db.dump(table, found.columns[table]);
  }
  return found;
}

AuditEntry old_entry(int64_t seq, const std::string& action) {
  AuditEntry entry;
  entry.seq = seq;
  entry.ts_ms = kMonday + seq * 1000;
  entry.actor = "alice";
  entry.action = action;
  entry.lease_id = seq == 1 ? 1 : 2;
  entry.team = "team-cv";
  entry.detail = "as written before the numbering, entry " + std::to_string(seq);
  return entry;
}

constexpr int kOldAuditEntries = 3;

// Rows of every kind the layout has, in the columns it has: a released lease and a pending one with their
// approvals, audit entries (chained where the layout has the chain, with the head in meta), usage, heartbeats,
// memory observations, a quarantined row, a loan and a grant, the id sequences.
void insert_rows(const std::string& path) {
  Db db(path);
  const auto has = [&](const std::string& table, const std::string& column) {
    for (const auto& name : db.columns(table))
      if (name == column) return true;
    return false;
  };
  // column -> SQL literal; only the columns the table has are written
  const auto insert = [&](const std::string& table, const std::vector<std::pair<std::string, std::string>>& values) {
    if (db.columns(table).empty()) return;
    std::string names, literals;
    for (const auto& [column, literal] : values) {
      if (!has(table, column)) continue;
      names += (names.empty() ? "" : ", ") + column;
      literals += (literals.empty() ? "" : ", ") + literal;
    }
    db.execute("INSERT INTO " + table + "(" + names + ") VALUES (" + literals + ")");
  };
  insert("leases", {{"id", "1"},
                    {"state", "'released'"},
                    {"team", "'team-cv'"},
                    {"user", "'alice'"},
                    {"ended_ms", "1795996800000"},
                    {"body",
                     R"('{"id":1,"request":{"team":"team-cv","user":"alice","job":"j1","model":"yolov8l","imgsz":640,
                     "batch":0,"gpus":1,"memory_gib":0.0,"priority":"normal","preemptible":true,"shared":false,
                     "justification":"paper","idempotency_key":""},"state":"released","outcome":"cancelled","gpus":1,
                     "approval_id":1,"created_ms":1795996000000,"ended_ms":1795996800000,"reason":""}')"}});
  insert("leases", {{"id", "2"},
                    {"state", "'pending_approval'"},
                    {"team", "'team-cv'"},
                    {"user", "'bob'"},
                    {"ended_ms", "0"},
                    {"body",
                     R"('{"id":2,"request":{"team":"team-cv","user":"bob","model":"yolov8x","priority":"high",
                     "justification":"deadline"},"state":"pending_approval","outcome":"","gpus":2,"approval_id":2,
                     "created_ms":1795996000000}')"}});
  insert("approvals", {{"id", "1"},
                       {"state", "'cancelled'"},
                       {"team", "'team-cv'"},
                       {"body",
                        R"('{"id":1,"lease_id":1,"team":"team-cv","user":"alice","model":"yolov8l",
                        "justification":"paper","state":"cancelled","decided_by":"","note":"",
                        "created_ms":1795996000000,"decided_ms":1795996800000}')"}});
  insert("approvals", {{"id", "2"},
                       {"state", "'pending'"},
                       {"team", "'team-cv'"},
                       {"body",
                        R"('{"id":2,"lease_id":2,"team":"team-cv","user":"bob","model":"yolov8x",
                        "justification":"deadline","state":"pending","created_ms":1795996000000}')"}});
  const bool chained = has("audit", "chain");
  std::string link;
  for (int64_t seq = 1; seq <= kOldAuditEntries; ++seq) {
    const AuditEntry entry = old_entry(seq, seq == 1 ? "lease.granted" : "approval.requested");
    if (chained) link = audit_chain_link(link, entry);
    insert("audit", {{"seq", std::to_string(seq)},
                     {"ts_ms", std::to_string(entry.ts_ms)},
                     {"actor", "'" + entry.actor + "'"},
                     {"action", "'" + entry.action + "'"},
                     {"lease_id", std::to_string(entry.lease_id)},
                     {"team", "'" + entry.team + "'"},
                     {"detail", "'" + entry.detail + "'"},
                     {"chain", chained ? "'" + link + "'" : "NULL"}});
  }
  if (chained) insert("meta", {{"key", "'audit_head'"}, {"value", "'3 " + link + "'"}});
  insert("meta", {{"key", "'next_lease_id'"}, {"value", "'3'"}});
  insert("meta", {{"key", "'next_approval_id'"}, {"value", "'3'"}});
  insert("usage", {{"user", "'alice'"}, {"month", "'2026-11'"}, {"gpu_hours", "12.5"}});
  for (int beat = 0; beat < 2; ++beat) {
    insert("heartbeats", {{"lease_id", "1"},
                          {"ts_ms", std::to_string(1795996100000 + beat * 1000)},
                          {"step", std::to_string(100 + beat)},
                          {"epoch", "1"},
                          {"gpu_util", "0.75"},
                          {"memory_used_gib", "3.5"},
                          {"last_checkpoint_ms", "1795996050000"},
                          {"gpu_util_source", "'nvml'"},
                          {"device_memory_used_gib", "12.25"},
                          {"process_memory_used_gib", "3.25"}});
  }
  insert("memory_observations", {{"lease_id", "1"},
                                 {"ts_ms", "1795996100000"},
                                 {"model", "'yolov8l'"},
                                 {"imgsz", "640"},
                                 {"batch", "16"},
                                 {"amp", "1"},
                                 {"device", "'NVIDIA L4'"},
                                 {"peak_gib", "9.5"},
                                 {"libtorch", "'2.1.2'"}});
  insert("quarantine", {{"source", "'leases'"},
                        {"row_id", "9"},
                        {"body", "'{not json'"},
                        {"error", "'parse error'"},
                        {"moved_ms", "1795996200000"}});
  insert("loans", {{"id", "1"},
                   {"state", "'pending'"},
                   {"user", "'alice'"},
                   {"month", "'2026-11'"},
                   {"body",
                    R"('{"id":1,"user":"alice","team":"team-cv","month":"2026-11","amount_gpu_hours":20.0,
                    "justification":"paper","state":"pending"}')"}});
  insert("grants", {{"id", "1"},
                    {"user", "'bob'"},
                    {"month", "'2026-11'"},
                    {"body",
                     R"('{"id":1,"user":"bob","team":"team-cv","month":"2026-11","amount_gpu_hours":5.0,
                     "reason":"shared augmentation library","granted_by":"carol"}')"}});
}

std::map<std::string, Rows> fresh_layout() {
  const std::string path = temp_db("migrations_fresh_layout");
  { Store create(path); }
  return Db(path).layout();
}

// Each layout quotad shipped before the numbering: opened by the current Store, it reaches the newest version with
// the layout of a new database, every row keeps its values (new columns NULL), one audited step is recorded, the
// chain verifies, and a second open changes nothing.
TEST(QuotaStoreMigrations, EveryLayoutFromHistoryReachesTheNewestVersionWithNothingLost) {
  const std::map<std::string, Rows> newest = fresh_layout();
  for (const Layout& layout : kLayouts) {
    SCOPED_TRACE(std::string(layout.commit) + ": " + layout.what);
    const std::string path = temp_db(std::string("migrations_") + layout.commit);
    Db(path).execute(layout.sql);
    insert_rows(path);
    const Contents before = contents(path);
    ASSERT_EQ(Db(path).value("SELECT value FROM meta WHERE key = 'schema_version'"), "1");
    ASSERT_EQ(Db(path).value("PRAGMA user_version"), "0");
    const bool was_chained =
        Db(path).value("SELECT COUNT(*) FROM pragma_table_info('audit') WHERE name = 'chain'") == "1";

    { Store store(path); }

    Db db(path);
    EXPECT_EQ(db.value("PRAGMA user_version"), std::to_string(kSchemaVersion));
    EXPECT_EQ(db.layout(), newest);
    for (const auto& [table, columns] : before.columns) {
      Rows expected = before.rows.at(table);
      if (table == "meta") {  // the old marker goes: the version is in PRAGMA user_version now
        expected.erase(std::remove(expected.begin(), expected.end(), std::vector<std::string>{"schema_version", "1"}),
                       expected.end());
      }
      Rows found = db.dump(table, columns);
      if (table == "audit") {
        ASSERT_EQ(found.size(), expected.size() + 3);
        found.resize(expected.size());  // the steps' own entries, checked below
      } else if (table == "meta") {
        found.erase(std::remove_if(found.begin(), found.end(), [](const auto& row) { return row[0] == "audit_head"; }),
                    found.end());
        expected.erase(
            std::remove_if(expected.begin(), expected.end(), [](const auto& row) { return row[0] == "audit_head"; }),
            expected.end());
      }
      EXPECT_EQ(found, expected) << "table " << table;
      // columns the table gained read NULL in the old rows
      for (const std::string& column : db.columns(table)) {
        if (std::find(columns.begin(), columns.end(), column) != columns.end()) continue;
        const std::string nulls = table == "audit" ? " AND seq <= " + std::to_string(kOldAuditEntries) : "";
        EXPECT_EQ(db.value("SELECT COUNT(*) FROM " + table + " WHERE " + column + " IS NOT NULL" + nulls), "0")
            << table << "." << column;
      }
    }
    EXPECT_EQ(db.value("SELECT COUNT(*) FROM meta WHERE key = 'schema_version'"), "0");
    const Rows step = db.rows("SELECT seq, actor, action, lease_id, detail FROM audit WHERE seq > " +
                              std::to_string(kOldAuditEntries));
    // the bridge to the last unnumbered layout (8), then each numbered step after it
    ASSERT_EQ(step.size(), 3u);
    EXPECT_EQ(step[0][0], std::to_string(kOldAuditEntries + 1));
    EXPECT_EQ(step[0][2], "schema.migrate");
    EXPECT_EQ(step[0][4], std::string("schema version 0 -> 8: a database from before numbered schema versions: ") +
                              (std::string(layout.added) == "nothing was missing" ? "" : "added ") + layout.added);
    EXPECT_EQ(step[1][4].rfind("schema version 8 -> 9: the secret grant receipts are signed with", 0), 0u)
        << step[1][4];
    EXPECT_EQ(db.value("SELECT length(secret) FROM receipt_key"), std::to_string(2 * kReceiptKeyBytes));
    EXPECT_EQ(step[2][2], "schema.migrate");
    EXPECT_EQ(step[2][4],
              "schema version 9 -> 10: heartbeats older than the retention period folded into hourly "
              "summaries per lease");
    ASSERT_EQ(kSchemaVersion, 10);  // a later step adds its entry here

    const AuditChainCheck chain = verify_audit_chain(path);
    EXPECT_TRUE(chain.intact) << chain.problem;
    EXPECT_EQ(chain.entries, kOldAuditEntries + 3);
    EXPECT_EQ(chain.unchained, was_chained ? 0 : kOldAuditEntries);
    EXPECT_EQ(chain.head_seq, kOldAuditEntries + 3);

    // the store serves on it: the rows load, the next audit entry follows the step's
    {
      Store store(path);
      const Snapshot snapshot = store.load(1795996800000, 24 * kHour, 10);
      EXPECT_EQ(snapshot.leases.size(), 2u);
      EXPECT_EQ(snapshot.approvals.size(), 2u);
      EXPECT_EQ(snapshot.next_audit_seq, kOldAuditEntries + 4);
      EXPECT_EQ(snapshot.next_lease_id, before.columns.count("quarantine") ? 10 : 3);  // above the quarantined row 9
      EXPECT_EQ(snapshot.usage.at({"alice", "2026-11"}), 12.5);
      EXPECT_EQ(snapshot.loans.size(), before.columns.count("loans"));
    }
    // a second open applies nothing
    const Contents migrated = contents(path);
    { Store again(path); }
    const Contents reopened = contents(path);
    EXPECT_EQ(reopened.rows, migrated.rows);
    EXPECT_EQ(Db(path).value("PRAGMA user_version"), std::to_string(kSchemaVersion));
  }
}

TEST(QuotaStoreMigrations, ANewDatabaseIsCreatedAtTheNewestVersionWithAnEmptyAuditLog) {
  const std::string path = temp_db("migrations_new");
  { Store create(path); }
  Db db(path);
  EXPECT_EQ(db.value("PRAGMA user_version"), std::to_string(kSchemaVersion));
  EXPECT_EQ(db.value("SELECT COUNT(*) FROM audit"), "0");
  EXPECT_EQ(db.value("SELECT COUNT(*) FROM meta"), "0");
  const std::vector<std::string> tables = db.tables();
  EXPECT_EQ(tables,
            (std::vector<std::string>{"approvals", "audit", "grants", "heartbeat_hours", "heartbeats", "leases",
                                      "loans", "memory_observations", "meta", "quarantine", "receipt_key", "usage"}));
  EXPECT_EQ(db.columns("heartbeats").back(), "process_memory_used_gib");
  EXPECT_EQ(db.columns("audit").back(), "chain");
}

TEST(QuotaStoreMigrations, ADatabaseNewerThanThisQuotadIsRefusedNamingBothVersions) {
  const std::string path = temp_db("migrations_newer");
  { Store create(path); }
  const int newer = kSchemaVersion + 1;
  Db(path).execute("PRAGMA user_version = " + std::to_string(newer));
  const Contents before = contents(path);
  try {
    Store refused(path);
    ADD_FAILURE() << "opened a database of a newer schema";
  } catch (const StoreError& error) {
    const std::string message = error.what();
    EXPECT_EQ(message.find(path + ": the quota database has schema version " + std::to_string(newer) +
                           ", this quotad knows up to " + std::to_string(kSchemaVersion) + ": upgrade quotad"),
              0u)
        << message;
    EXPECT_NE(message.find("never downgrade"), std::string::npos) << message;
  }
  EXPECT_EQ(Db(path).value("PRAGMA user_version"), std::to_string(newer));
  EXPECT_EQ(contents(path).rows, before.rows);
}

// A numbered database at version 4 (the ledger and the memory observations) in which an object of step 6 is
// already there: step 5 applies, step 6 fails, and the whole open is rolled back, step 5 included.
TEST(QuotaStoreMigrations, AStepThatFailsLeavesTheDatabaseAtItsVersionUnchanged) {
  const std::string path = temp_db("migrations_failing_step");
  const Layout& merged = kLayouts[4];
  ASSERT_EQ(std::string(merged.commit), "3e4f9e3");
  Db(path).execute(std::string(merged.sql) +
                   "DELETE FROM meta WHERE key = 'schema_version'; PRAGMA user_version = 4;"
                   "ALTER TABLE memory_observations ADD COLUMN libtorch TEXT;");
  insert_rows(path);
  const Contents before = contents(path);
  try {
    Store refused(path);
    ADD_FAILURE() << "a failing step was not reported";
  } catch (const StoreError& error) {
    const std::string message = error.what();
    EXPECT_EQ(message.find(path + ": schema step 5 -> 6 (memory observations name the LibTorch version"), 0u)
        << message;
    EXPECT_NE(message.find("duplicate column name: libtorch"), std::string::npos) << message;
    EXPECT_NE(message.find("the database stays at schema version 4"), std::string::npos) << message;
  }
  EXPECT_EQ(Db(path).value("PRAGMA user_version"), "4");
  const Contents after = contents(path);
  EXPECT_EQ(after.columns, before.columns);  // step 5's heartbeat columns are not there
  EXPECT_EQ(after.rows, before.rows);
  // once the conflicting column is gone (a hand edit), the same file upgrades
  Db(path).execute("ALTER TABLE memory_observations DROP COLUMN libtorch;");
  { Store store(path); }
  Db db(path);
  EXPECT_EQ(db.value("PRAGMA user_version"), std::to_string(kSchemaVersion));
  const Rows steps = db.rows("SELECT detail FROM audit WHERE action = 'schema.migrate' ORDER BY seq");
  ASSERT_EQ(steps.size(), 6u);
  EXPECT_EQ(steps[0][0].rfind("schema version 4 -> 5: ", 0), 0u) << steps[0][0];
  EXPECT_EQ(steps[3][0].rfind("schema version 7 -> 8: ", 0), 0u) << steps[3][0];
  EXPECT_EQ(steps[4][0].rfind("schema version 8 -> 9: ", 0), 0u) << steps[4][0];
  EXPECT_EQ(steps[5][0].rfind("schema version 9 -> 10: ", 0), 0u) << steps[5][0];
  EXPECT_TRUE(verify_audit_chain(path).intact);
}

// The bridge of an unnumbered database fails at its very end (the audit entry cannot be written): the tables and
// columns it had added are gone again and the file still reads as unnumbered.
TEST(QuotaStoreMigrations, ABridgeThatFailsLeavesTheUnnumberedDatabaseUnchanged) {
  const std::string path = temp_db("migrations_failing_bridge");
  Db(path).execute(std::string(kLayouts[1].sql) +
                   "CREATE TRIGGER audit_frozen BEFORE INSERT ON audit BEGIN SELECT RAISE(ABORT, 'frozen'); END;");
  const Contents before = contents(path);
  try {
    Store refused(path);
    ADD_FAILURE() << "the failing bridge was not reported";
  } catch (const StoreError& error) {
    EXPECT_EQ(std::string(error.what()).find(path + ": "), 0u) << error.what();
    EXPECT_NE(std::string(error.what()).find("frozen"), std::string::npos) << error.what();
  }
  Db db(path);
  EXPECT_EQ(db.value("PRAGMA user_version"), "0");
  EXPECT_EQ(db.value("SELECT value FROM meta WHERE key = 'schema_version'"), "1");
  const Contents after = contents(path);
  EXPECT_EQ(after.columns, before.columns);  // no loans, grants, memory_observations, nor the heartbeat columns
  EXPECT_EQ(after.rows, before.rows);
}

// repair-db rebuilds a damaged file from an older backup: the backup's scratch copy takes the schema without an
// audit entry of its own, which would take the sequence number of an entry the damaged file still yields.
TEST(QuotaStoreMigrations, RepairFromABackupOfAnOlderVersionKeepsTheDamagedFilesAuditEntries) {
  const std::string path = temp_db("migrations_repair");
  for (const auto& entry : std::filesystem::directory_iterator(std::filesystem::path(path).parent_path())) {
    if (entry.path().string().rfind(path + ".", 0) == 0) std::filesystem::remove(entry.path());
  }
  const auto add_audit_rows = [&](int from, int to) {
    std::string rows = "BEGIN;";
    for (int i = from; i <= to; ++i) {
      rows += "INSERT INTO audit(seq, ts_ms, actor, action, lease_id, team, detail) VALUES (" + std::to_string(i) +
              ", 0, 'quotad', 'lease.granted', 0, 't', '" + std::string(200, 'd') + "');";
    }
    Db(path).execute(rows + "COMMIT;");
  };
  Db(path).execute(kLayouts[0].sql);  // unnumbered, as the backup keeps it
  add_audit_rows(1, 400);
  const std::string backup = backup_database(path, kMonday, 24);
  add_audit_rows(401, 600);
  { Store upgraded(path); }  // entries 601 to 603: the bridge, steps 9 and 10
  ASSERT_EQ(Db(path).value("SELECT action FROM audit WHERE seq = 601"), "schema.migrate");
  {
    std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(8 * 4096);  // a page of early entries, which the backup has
    const std::string garbage(4096, '\x5a');
    file.write(garbage.data(), static_cast<std::streamsize>(garbage.size()));
  }
  ASSERT_THROW(Store refused(path), StoreError);
  const RepairReport report = repair_database(path, kMonday + kHour);
  EXPECT_EQ(report.restored_from, backup);
  EXPECT_TRUE(report.audit_gaps.empty());
  Db db(path);
  EXPECT_EQ(db.value("PRAGMA user_version"), std::to_string(kSchemaVersion));
  EXPECT_EQ(db.value("SELECT COUNT(*) FROM audit WHERE seq <= 603"), "603");  // then the restore's audit.gap
  EXPECT_EQ(db.value("SELECT action FROM audit WHERE seq = 401"), "lease.granted");
  EXPECT_EQ(db.value("SELECT COUNT(*) FROM audit WHERE action = 'schema.migrate'"), "3");
  for (const auto& entry : std::filesystem::directory_iterator(std::filesystem::path(path).parent_path())) {
    if (entry.path().string().rfind(path + ".", 0) == 0) std::filesystem::remove(entry.path());
  }
}

}  // namespace
}  // namespace yolo8::quota
