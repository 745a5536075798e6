#pragma once
// What quotad keeps its state in, behind one interface: a SQLite file (Store, quota/store/store.h) or a PostgreSQL
// database (PostgresStore, quota/store/postgres_store.h), chosen by `--db` through parse_db_target and open_store.
#include <cstdint>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "quota/core/engine.h"
#include "quota/core/memory_learning.h"
#include "quota/core/usage.h"

namespace yolo8::quota {

class StoreError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The newest schema version this quotad knows, of either backend (SQLite: PRAGMA user_version; PostgreSQL: the
// table schema_version). Opening a database applies the numbered steps it lacks, in order, in one transaction, each
// logged and audited (`schema.migrate`); a database of a newer version is refused. See "Schema versions and
// upgrades" in quota/README.md.
inline constexpr int kSchemaVersion = 10;

// Memory observations kept per model, device, precision and LibTorch version: those of the latest runs (a run
// keeps one row per setting, its highest peak). Older runs are pruned as new ones report.
inline constexpr int kMemoryObservationRunsKept = 100;

// The meta key of the mark below which every raw heartbeat is summed up in heartbeat_hours (StateStore::
// fold_heartbeats); absent: none is.
inline constexpr const char* kHeartbeatsSummarisedKey = "heartbeats_summarised_ms";

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
  // every loan application and credit grant (few; never deleted)
  std::vector<Loan> loans;
  std::vector<CreditGrant> grants;
  // above every loan and grant id stored, quarantined rows included (ids are never reused)
  int64_t next_loan_id = 1;
  int64_t next_grant_id = 1;
};

// The engine's state in a database: what QuotaService calls, the same on every backend. Every error is a
// StoreError naming the database (the file, or the URL).
class StateStore {
 public:
  virtual ~StateStore() = default;

  // Unfinished leases, leases that ended within `keep_ended_ms`, emergency leases whose review is open, approvals,
  // the ledger, usage, the last `audit_tail` audit entries and the persistent id sequences. Running leases get their
  // latest reported telemetry back from the heartbeat table. A row that does not parse, or a gap in the audit
  // sequence, is a StoreError naming the table, the row id and the column.
  virtual Snapshot load(int64_t now_ms, int64_t keep_ended_ms, size_t audit_tail) = 0;
  // Writes what the engine changed; inside an open transaction it joins it, otherwise it is one transaction.
  virtual void write(const Engine& engine, const Changes& changes) = 0;
  virtual void write_heartbeats(const std::vector<HeartbeatSample>& samples) = 0;

  // An exclusive section across processes (local mode): one holder at a time, reads inside see every commit made
  // before it began. A write waits for the holder up to the busy timeout, then fails (StoreError).
  virtual void begin_immediate() = 0;
  virtual void commit() = 0;
  virtual void rollback() = 0;

  // A value of the meta table, "" when absent; set_meta writes one (joining an open transaction).
  virtual std::string meta(const std::string& key) = 0;
  virtual void set_meta(const std::string& key, const std::string& value) = 0;

  virtual std::vector<AuditEntry> audit(int64_t after_seq, size_t limit, const std::string& team = "") = 0;
  virtual int64_t count_heartbeats() = 0;
  // The memory peaks heartbeats reported with model, imgsz, batch, AMP, device and LibTorch version: one per run
  // and setting, of the latest kMemoryObservationRunsKept runs per model, device, AMP and LibTorch version.
  virtual std::vector<MemoryObservation> memory_observations() = 0;
  // Refolds the stored utilisation samples of the engine's running leases into `tracker` (quotad restarted), so
  // the waste list survives a restart.
  virtual void replay_heartbeats(const Engine& engine, UtilTracker& tracker) = 0;
  // Bounded history, one bounded step in a transaction of its own (or the one open): sums up the raw heartbeats
  // not yet summed up, up to the whole hour `summarise_before_ms`, oldest first, at most about `max_rows` of them,
  // into hourly summaries per lease (table heartbeat_hours, UtilSummary; low runs by `threshold` and
  // `waste_after_ms`), moving the mark (meta heartbeats_summarised_ms) below which every raw row is summed up; then
  // deletes up to `max_rows` raw rows older than both the mark and the whole hour `delete_before_ms` (the retention
  // period). Returns the rows summed up and deleted: 0 once nothing is due. The readers (replay_heartbeats,
  // util_history, the reports) take the summaries below the mark and the raw rows above it, so that what they
  // derive is exactly what the samples give, and a restart reads at most about an hour of raw rows per lease.
  // Exactly, with one exception: a summed-up hour's low runs (below the threshold) are those of the threshold and
  // duration it was summed up with, so after a policy change the waste figures, the longest low run and the idle
  // GPU-hours of the hours before it stay what that policy made them; the utilisation, the time covered and the
  // samples do not depend on the policy.
  // A row stored below the mark after it moved (a wall clock set back by more than that) is not read.
  virtual int64_t fold_heartbeats(int64_t summarise_before_ms, int64_t delete_before_ms, double threshold,
                                  int64_t waste_after_ms, int64_t max_rows) = 0;
  // The utilisation history with from_ms <= time < to_ms (summarised hours by their hour; hour-aligned bounds read
  // the same whatever was summed up) into `tracker`, lease by lease, oldest first.
  virtual void util_history(int64_t from_ms, int64_t to_ms, UtilTracker& tracker) = 0;
  virtual int64_t count_heartbeat_hours() = 0;
  // The audit chain's head as last written or loaded by this store: "<seq> <link>", "" before the first entry.
  virtual const std::string& audit_head() const = 0;
  // From now on every write first checks that the lead is still in `epoch` and fails, writing nothing, once another
  // replica has taken over. SQLite has no replicas (one writer per file, its lock makes sure): nothing to check.
  virtual void fence(int64_t epoch) = 0;
  // The secret grant receipts are signed with (receipt.h; raw bytes): created at random once per database when its
  // schema gains the table (version 9) and kept in it, so that backups carry it and a restored database verifies
  // the receipts signed before the restore.
  virtual std::string receipt_key() = 0;
  // Whether the database holds (or quarantined) a lease row with this id, loaded or not: a lease that ended long
  // ago is never re-attached from its receipt.
  virtual bool lease_recorded(int64_t lease_id) = 0;
  // The file or the URL (never with a password), as errors and logs name it.
  virtual const std::string& path() const = 0;
};

// Where `--db` points: a SQLite file or a PostgreSQL database.
struct DbTarget {
  enum class Kind { kSqlite, kPostgres };
  Kind kind = Kind::kSqlite;
  std::string location;  // the file, or the PostgreSQL URL as given (it holds no password)
};

// `--db`: "postgresql://..." or "postgres://..." (a libpq connection URL), "sqlite:PATH", or a plain PATH (SQLite).
// A URL that carries a password (user:secret@, ?password=) is refused: a command line is visible to every user of
// the machine; the password comes from --db-password-file or libpq's PGPASSWORD / PGPASSFILE. Throws StoreError
// naming the option.
DbTarget parse_db_target(const std::string& spec);

struct StoreOptions {
  bool full_sync = false;       // SQLite: synchronous=FULL (PostgreSQL: its own fsync settings apply)
  int busy_timeout_ms = 30000;  // how long a write waits for another writer's lock before it fails
  std::string password_file;    // PostgreSQL: a file holding the password (its first line); empty: libpq's own
};

// Opens (creating or upgrading the schema of) the database `target` names.
std::unique_ptr<StateStore> open_store(const DbTarget& target, const StoreOptions& options = {});

// Read-only queries for what quotad reports from its database (the monthly report, the quarter statement, the
// usage history), the same on both backends: a SQLite file opened read-only (StoreReader), or a PostgreSQL database
// read in one read-only snapshot (PostgresReportReader). Nothing is created or migrated, so a running quotad keeps
// serving. Every error is a StoreError naming the database (and the table and row id of a record that does not
// parse).
class ReportReader {
 public:
  virtual ~ReportReader() = default;
  // Leases not in a terminal state, and those that ended at or after `ended_since_ms`, by id.
  virtual std::vector<Lease> leases_since(int64_t ended_since_ms) = 0;
  // The utilisation history with from_ms <= time < to_ms into `tracker`, lease by lease, oldest first: the hours
  // summed up (StateStore::fold_heartbeats; by their hour, so hour-aligned bounds read the same whatever was summed
  // up), then the raw samples above the mark.
  virtual void fold_util(int64_t from_ms, int64_t to_ms, UtilTracker& tracker) = 0;
  // The usage ledger: GPU-hours per (user, month "YYYY-MM") of the months named (every month when empty).
  virtual std::map<std::pair<std::string, std::string>, double> usage(const std::vector<std::string>& months = {}) = 0;
  // Every loan and every contribution grant, by id.
  virtual std::vector<Loan> loans() = 0;
  virtual std::vector<CreditGrant> grants() = 0;
  // Audit entries after `after_seq` in sequence order; only those with `action` unless it is empty.
  virtual std::vector<AuditEntry> audit(const std::string& action = "", int64_t after_seq = 0) = 0;
  // The file or the URL (never with a password).
  virtual const std::string& path() const = 0;
};

// Opens the database `target` names for reading.
std::unique_ptr<ReportReader> open_report_reader(const DbTarget& target, const StoreOptions& options = {});

class PostgresLeadership;
// The leadership among the replicas sharing the database `target` names (postgres_leadership.h), this replica
// serving at `address`; none for SQLite, whose one writer the file lock makes sure of.
std::unique_ptr<PostgresLeadership> open_leadership(const DbTarget& target, const StoreOptions& options,
                                                    const std::string& address);

}  // namespace yolo8::quota
