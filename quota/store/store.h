#pragma once
// SQLite persistence of the engine: WAL mode, one transaction per state change, append-only audit.
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "quota/core/engine.h"
#include "quota/core/memory_learning.h"
#include "quota/core/usage.h"

struct sqlite3;
struct sqlite3_stmt;

namespace yolo8::quota {

class StoreError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Memory observations kept per model, device, precision and LibTorch version: those of the latest runs (a run
// keeps one row per setting, its highest peak). Older runs are pruned as new ones report.
inline constexpr int kMemoryObservationRunsKept = 100;

struct HeartbeatSample {
  int64_t lease_id = 0;
  int64_t ts_ms = 0;
  Telemetry telemetry;
};

struct Snapshot {
  std::vector<Lease> leases;
  std::vector<Approval> approvals;
  std::vector<AuditEntry> audit;  // the latest entries only
  std::map<std::pair<std::string, std::string>, double> usage;
  int64_t next_audit_seq = 1;
  // The persistent id sequences: above every id ever stored (meta counters, all lease and approval rows,
  // and the lease ids that audit and heartbeat rows name), loaded or not.
  int64_t next_lease_id = 1;
  int64_t next_approval_id = 1;
  // issue 19: every loan application and credit grant (few; never deleted)
  std::vector<Loan> loans;
  std::vector<CreditGrant> grants;
  // above every loan and grant id stored, quarantined rows included (ids are never reused)
  int64_t next_loan_id = 1;
  int64_t next_grant_id = 1;
};

struct RepairReport;

class Store {
 public:
  // Opens (creating) the database. `full_sync` = synchronous=FULL (survives power loss); otherwise NORMAL,
  // which in WAL mode still survives a crash of the process.
  // `busy_timeout_ms`: how long a write waits for another connection's lock before it fails (StoreError).
  // Opening runs `PRAGMA quick_check` and refuses a damaged file, naming the first problem.
  explicit Store(const std::string& path, bool full_sync = false, int busy_timeout_ms = 30000);
  ~Store();
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  // Unfinished leases, leases that ended within `keep_ended_ms`, approvals, usage, the last `audit_tail`
  // audit entries. Running leases get their latest reported telemetry back from the heartbeat table.
  // A row that does not parse, or a gap in the audit sequence, is a StoreError naming the table, the row id
  // and the column (quotad repair-db sets such rows aside).
  Snapshot load(int64_t now_ms, int64_t keep_ended_ms, size_t audit_tail);
  // Writes what the engine changed; inside an open transaction it joins it, otherwise it is one transaction.
  void write(const Engine& engine, const Changes& changes);
  void write_heartbeats(const std::vector<HeartbeatSample>& samples);

  // Cross-process exclusive section (local mode): BEGIN IMMEDIATE ... COMMIT / ROLLBACK.
  void begin_immediate();
  void commit();
  void rollback();

  std::vector<AuditEntry> audit(int64_t after_seq, size_t limit, const std::string& team = "");
  int64_t count_heartbeats();
  // The memory peaks heartbeats reported with model, imgsz, batch, AMP, device and LibTorch version: one per run
  // and setting, of the latest kMemoryObservationRunsKept runs per model, device, AMP and LibTorch version.
  std::vector<MemoryObservation> memory_observations();
  // The row-level part of repair_database() on this open store.
  void repair(int64_t now_ms, RepairReport& report);
  const std::string& path() const { return path_; }

 private:
  void exec(const char* sql);
  sqlite3_stmt* prepare(const char* sql);
  [[noreturn]] void fail(const std::string& what);
  void check_integrity();
  bool has_column(const std::string& table, const std::string& column);
  void add_newer_columns();

  std::string path_;
  sqlite3* db_ = nullptr;
  bool in_tx_ = false;
  bool integrity_failed_ = false;
};

struct RepairReport {
  std::string backup;                    // the untouched copy taken first
  std::vector<std::string> quarantined;  // "leases row 9: <why>" for every row set aside
  std::vector<int64_t> audit_gaps;       // audit sequence numbers recorded as lost
};

// `quotad repair-db`: with quotad stopped, copies the database (and its WAL) to `<path>.bak-<now_ms>`, then
// moves every lease or approval row that does not parse into the table `quarantine` (kept whole, with the
// reason) and records each missing audit sequence number as an explicit `audit.gap` entry. Nothing else is
// touched. A file that fails `PRAGMA quick_check` is refused: recover it with the sqlite3 shell first
// (quota/README.md).
RepairReport repair_database(const std::string& path, int64_t now_ms);

// Read-only queries on a quota database, for what quotad reports from it (the monthly report, the quarter
// statement, the usage history): the schema stays behind this file, so a change to a table changes its readers
// here, in the same library. Opens the file read-only, so a running quotad keeps serving; a writer holding the
// lock is waited for up to 10 s. Every error is a StoreError naming the file (and the table and row id of a
// record that does not parse).
class StoreReader {
 public:
  using UtilVisitor = std::function<void(int64_t lease_id, int64_t ts_ms, double gpu_util)>;

  explicit StoreReader(const std::string& path);
  ~StoreReader();
  StoreReader(const StoreReader&) = delete;
  StoreReader& operator=(const StoreReader&) = delete;

  // Leases not in a terminal state, and those that ended at or after `ended_since_ms`, by id.
  std::vector<Lease> leases_since(int64_t ended_since_ms);
  // The utilisation samples of the heartbeats (gpu_util >= 0) with from_ms <= ts_ms < to_ms, in lease id order
  // and by time within a lease; visited one by one (a month holds many).
  void util_samples(int64_t from_ms, int64_t to_ms, const UtilVisitor& visit);
  // The same for one lease, all of its samples.
  void util_samples_of(int64_t lease_id, const UtilVisitor& visit);
  // The usage ledger: GPU-hours per (user, month "YYYY-MM") of the months named (every month when empty).
  std::map<std::pair<std::string, std::string>, double> usage(const std::vector<std::string>& months = {});
  // Every loan and every contribution grant, by id (none in a database no quotad of issue 19 has opened).
  std::vector<Loan> loans();
  std::vector<CreditGrant> grants();
  // Audit entries after `after_seq` in sequence order; only those with `action` unless it is empty.
  std::vector<AuditEntry> audit(const std::string& action = "", int64_t after_seq = 0);
  const std::string& path() const { return path_; }

 private:
  sqlite3_stmt* prepare(const char* sql);
  bool has_table(const char* table);

  std::string path_;
  sqlite3* db_ = nullptr;
};

// Refolds the stored heartbeat samples of the engine's running leases (quotad restarted), so the waste list
// survives a restart. Throws std::runtime_error if the database cannot be read.
void replay_heartbeats(const std::string& db_path, const Engine& engine, UtilTracker& tracker);

}  // namespace yolo8::quota
