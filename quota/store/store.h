#pragma once
// SQLite persistence of the engine (the StateStore of a file): WAL mode, one transaction per state change,
// append-only audit.
#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "quota/core/engine.h"
#include "quota/core/memory_learning.h"
#include "quota/core/usage.h"
#include "quota/store/state_store.h"

struct sqlite3;
struct sqlite3_stmt;

namespace yolo8::quota {

struct RepairReport;
RepairReport repair_database(const std::string& path, int64_t now_ms);
void prepare_database(const std::string& path, bool init, int64_t now_ms);

// A restore (repair-db from a backup or of a damaged file, or a new database created beside backups) opens a new
// id epoch: every id sequence (leases, approvals, loans, grants, audit entries) continues at least this far above
// every id the restored state knows, rounded up to a multiple of it. Ids handed out after the backup, and lost
// with the file, are therefore never handed out again (no quotad hands out a billion ids of one kind between two
// backups), and a trainer holding one is told its lease is unknown rather than meeting someone else's (then it may
// present its grant receipt: Engine::reattach). kIdEpochSpan: engine.h.
// The first id of the epoch a restore opens above `highest_known`.
int64_t next_id_epoch(int64_t highest_known);

class Store : public StateStore {
 public:
  // Opens (creating) the database. `full_sync` = synchronous=FULL (survives power loss); otherwise NORMAL,
  // which in WAL mode still survives a crash of the process.
  // `busy_timeout_ms`: how long a write waits for another connection's lock before it fails (StoreError).
  // Opening runs `PRAGMA quick_check` and refuses a damaged file, naming the first problem, and brings the schema to
  // kSchemaVersion (a StoreError naming both versions for a database newer than that).
  explicit Store(const std::string& path, bool full_sync = false, int busy_timeout_ms = 30000);
  ~Store();
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  // Unfinished leases, leases that ended within `keep_ended_ms`, approvals, usage, the last `audit_tail`
  // audit entries. Running leases get their latest reported telemetry back from the heartbeat table.
  // A row that does not parse, or a gap in the audit sequence, is a StoreError naming the table, the row id
  // and the column (quotad repair-db sets such rows aside).
  Snapshot load(int64_t now_ms, int64_t keep_ended_ms, size_t audit_tail) override;
  // Writes what the engine changed; inside an open transaction it joins it, otherwise it is one transaction.
  void write(const Engine& engine, const Changes& changes) override;
  void write_heartbeats(const std::vector<HeartbeatSample>& samples) override;

  // Cross-process exclusive section (local mode): BEGIN IMMEDIATE ... COMMIT / ROLLBACK.
  void begin_immediate() override;
  void commit() override;
  void rollback() override;

  // A value of the meta table, "" when absent; set_meta writes one (joining an open transaction). Local mode keeps
  // its processes' shared clock reference there.
  std::string meta(const std::string& key) override { return meta_value(key.c_str()); }
  void set_meta(const std::string& key, const std::string& value) override;

  std::vector<AuditEntry> audit(int64_t after_seq, size_t limit, const std::string& team = "") override;
  int64_t count_heartbeats() override;
  // The memory peaks heartbeats reported with model, imgsz, batch, AMP, device and LibTorch version: one per run
  // and setting, of the latest kMemoryObservationRunsKept runs per model, device, AMP and LibTorch version.
  std::vector<MemoryObservation> memory_observations() override;
  // Through a read connection of its own (StoreReader), as quotad always did.
  void replay_heartbeats(const Engine& engine, UtilTracker& tracker) override;
  int64_t fold_heartbeats(int64_t summarise_before_ms, int64_t delete_before_ms, double threshold,
                          int64_t waste_after_ms, int64_t max_rows) override;
  // Through a read connection of its own (StoreReader::fold_util).
  void util_history(int64_t from_ms, int64_t to_ms, UtilTracker& tracker) override;
  int64_t count_heartbeat_hours() override;
  // The row-level part of repair_database() on this open store.
  void repair(int64_t now_ms, RepairReport& report);
  const std::string& path() const override { return path_; }
  // The audit chain's head as last written or loaded by this store: "<seq> <link>", "" before the first entry.
  const std::string& audit_head() const override { return audit_head_; }
  std::string receipt_key() override;
  bool lease_recorded(int64_t lease_id) override;
  void fence(int64_t) override {}  // one writer per file: the writer lock (writer_lock.h) makes sure

 private:
  void exec(const char* sql);
  sqlite3_stmt* prepare(const char* sql);
  [[noreturn]] void fail(const std::string& what);
  void check_integrity();
  bool has_column(const std::string& table, const std::string& column);
  bool has_table(const char* table);
  std::string meta_value(const char* key);
  void append_audit(const std::vector<AuditEntry>& entries);
  // Inside the opening transaction: applies the schema steps the file lacks; the lines to log once committed.
  std::vector<std::string> migrate_schema(bool audit_steps);
  std::string bridge_legacy_layout();
  // Inside the opening transaction: the receipt key, created (OpenSSL's RAND_bytes) when the database has none.
  void ensure_receipt_key();
  int schema_version();
  void set_schema_version(int version);

  // Moves every id sequence to next_id_epoch() above everything this file and `highest_elsewhere` know, and
  // appends the chained `audit.gap` entry that declares the audit entries in between lost, saying `cause`.
  // Returns the epoch's first id.
  int64_t open_id_epoch(int64_t now_ms, int64_t highest_elsewhere, const std::string& cause);
  // "lease 4: ..." for every lease, loan or grant the audit log records but no table (nor quarantine) holds.
  std::vector<std::string> unrecorded_objects();

  // repair_database's scratch copy takes the schema without auditing the steps (see there)
  Store(const std::string& path, bool full_sync, int busy_timeout_ms, bool audit_schema_steps);
  friend RepairReport repair_database(const std::string& path, int64_t now_ms);
  friend void prepare_database(const std::string& path, bool init, int64_t now_ms);

  std::string path_;
  std::string audit_head_;
  sqlite3* db_ = nullptr;
  bool in_tx_ = false;
  bool integrity_failed_ = false;
};

struct RepairReport {
  std::string backup;                    // the untouched copy taken first
  std::string restored_from;             // the online backup the database was rebuilt from ("" when none was needed)
  std::vector<std::string> salvaged;     // "leases: 12 rows" read from a damaged file into the restored one
  std::vector<std::string> quarantined;  // "leases row 9: <why>" for every row set aside
  std::vector<int64_t> audit_gaps;       // audit sequence numbers recorded as lost
  int64_t id_epoch = 0;                  // the first id of the epoch a restore opened (0: none was needed)
  std::string lost_entries;              // "entries 43 to 1999999999": what the restore's audit.gap declares
  std::vector<std::string> unrecorded;   // objects the audit log records but the tables lack (see unrecorded_objects)
};

// Online backups: a consistent copy of the live database through SQLite's backup API (quotad keeps
// serving), written as `<path>.backup-<UTC time>` beside it (atomically: a temporary file renamed), of which the
// newest `keep` are kept. Returns the new file's path. Throws StoreError naming the file.
std::string backup_database(const std::string& path, int64_t now_ms, int keep = 24);
// The backups of `path` that pass quick_check, newest first.
std::vector<std::string> good_backups(const std::string& path);
// Milliseconds until the next backup of `path` is due when one is taken every `every_ms`: from the newest backup
// beside it (its time is in its name), so that the cadence survives restarts; 0 when there is none or it is overdue.
int64_t next_backup_in_ms(const std::string& path, int64_t every_ms, int64_t now_ms);
// When the newest backup beside `path` was taken (UTC ms, from its name); -1 when there is none.
int64_t newest_backup_ms(const std::string& path);

// Takes a backup every `every_minutes` on its own thread (a read connection: no lock on quotad's writes) until
// destroyed, the first when the newest existing backup is `every_minutes` old (at once if it is older or there is
// none: a quotad restarted more often than that still backs up); failures are printed to stderr and retried at the
// next time.
class PeriodicBackup {
 public:
  PeriodicBackup(std::string path, int every_minutes, int keep);
  ~PeriodicBackup();
  PeriodicBackup(const PeriodicBackup&) = delete;
  PeriodicBackup& operator=(const PeriodicBackup&) = delete;

 private:
  struct State;
  std::shared_ptr<State> state_;
};

// `quotad repair-db`: with quotad stopped, copies the database (and its WAL) to `<path>.bak-<now_ms>`, then
// - a missing file: restores the newest good backup beside it (none: a StoreError, nothing created);
// - a file that is empty or not a quotad database: restores the newest good backup; with none it refuses (a fresh
//   database would lose every lease, audit entry and ledger row without a word);
// - a file that fails `PRAGMA quick_check` (a damaged page): rebuilds it from the newest good backup (or, with
//   none, from nothing) plus every row the damaged file still yields, table by table, newer rows winning;
// then moves every lease or approval row that does not parse into the table `quarantine` (kept whole, with the
// reason) and records each missing audit sequence number as an explicit `audit.gap` entry. A database restored or
// rebuilt opens a new id epoch (kIdEpochSpan), its lost audit entries declared by one chained `audit.gap` entry.
// Finally it names every lease, loan and grant the audit log records but the tables lack (a lost page).
RepairReport repair_database(const std::string& path, int64_t now_ms);

// What `quotad serve` does before opening `path`: nothing when it exists or when no backup of it lies beside it
// (a first start creates it). A missing database with backups beside it is a StoreError naming the newest backup
// and the two ways on (`quotad repair-db` restores it; `--init` starts an empty one), unless `init`: then an
// empty database is created whose ids start in an epoch above every id the backups hold.
void prepare_database(const std::string& path, bool init, int64_t now_ms);

// The audit log's hash chain: each entry stores the SHA-256 of the previous entry's link and its own
// content (seq, time, actor, action, lease, team, detail), and meta keeps the head (its seq and link), all in the
// entry's transaction. Entries written before the chain existed (an older quotad) have no link and are counted.
std::string audit_chain_link(const std::string& previous_link, const AuditEntry& entry);

struct AuditChainCheck {
  bool intact = true;
  int64_t entries = 0;    // rows read
  int64_t unchained = 0;  // rows written before the chain existed
  int64_t head_seq = 0;   // the last chained entry, and its link (what the quotad_audit_chain_info metric shows)
  std::string head;
  int64_t broken_seq = 0;  // the first broken entry
  std::string problem;     // what is wrong with it
  // The ranges a restore declared lost (its chained `audit.gap` entries), as those entries' details say them.
  std::vector<std::string> recorded_gaps;
};
// Recomputes the chain from the entries in sequence order, whichever database they come from. A deleted entry (a
// gap, the first or the last: the recorded head names it), an edited one (its link no longer matches), or an entry
// inserted around the chain is named.
class AuditChainVerifier {
 public:
  // `chain`: the entry's stored link, nullptr when it has none. False once the chain is broken (stop reading).
  bool add(const AuditEntry& entry, const std::string* chain);
  // With the head meta records ("<seq> <link>", "" when none), after the last entry.
  AuditChainCheck finish(const std::string& recorded_head);

 private:
  bool broken(int64_t seq, const std::string& problem);

  AuditChainCheck check_;
  std::string link_;
  bool chained_ = false;
  int64_t expected_ = 1;
};

// `quotad audit --verify`: reads `db_path` read-only and recomputes the chain (AuditChainVerifier). Throws
// StoreError when the file cannot be read.
AuditChainCheck verify_audit_chain(const std::string& db_path);
// The same for the database `--db` names, SQLite or PostgreSQL (read in one read-only transaction).
AuditChainCheck verify_audit_chain(const DbTarget& target, const StoreOptions& options);

// Read-only queries on a quota database, for what quotad reports from it (the monthly report, the quarter
// statement, the usage history): the schema stays behind this file, so a change to a table changes its readers
// here, in the same library. Opens the file read-only, so a running quotad keeps serving; a writer holding the
// lock is waited for up to 10 s. Every error is a StoreError naming the file (and the table and row id of a
// record that does not parse).
class StoreReader : public ReportReader {
 public:
  using UtilVisitor = std::function<void(int64_t lease_id, int64_t ts_ms, double gpu_util)>;

  explicit StoreReader(const std::string& path);
  ~StoreReader();
  StoreReader(const StoreReader&) = delete;
  StoreReader& operator=(const StoreReader&) = delete;

  // Leases not in a terminal state, and those that ended at or after `ended_since_ms`, by id.
  std::vector<Lease> leases_since(int64_t ended_since_ms) override;
  // The utilisation history with from_ms <= time < to_ms into `tracker`, lease by lease, oldest first: the hours
  // summed up (StateStore::fold_heartbeats; by their hour, so hour-aligned bounds read the same whatever was summed
  // up), then the raw samples above the mark. What the reports derive from samples goes through here.
  void fold_util(int64_t from_ms, int64_t to_ms, UtilTracker& tracker) override;
  // The same for one lease, all of its history.
  void fold_util_of(int64_t lease_id, UtilTracker& tracker);
  // The raw utilisation samples still kept (gpu_util >= 0) with from_ms <= ts_ms < to_ms, in lease id order and by
  // time within a lease; visited one by one (a month holds many). The hours folded are not among them.
  void util_samples(int64_t from_ms, int64_t to_ms, const UtilVisitor& visit);
  // The same for one lease, all of its raw samples.
  void util_samples_of(int64_t lease_id, const UtilVisitor& visit);
  // The usage ledger: GPU-hours per (user, month "YYYY-MM") of the months named (every month when empty).
  std::map<std::pair<std::string, std::string>, double> usage(const std::vector<std::string>& months = {}) override;
  // Every loan and every contribution grant, by id (none in a database from before the ledger).
  std::vector<Loan> loans() override;
  std::vector<CreditGrant> grants() override;
  // Audit entries after `after_seq` in sequence order; only those with `action` unless it is empty.
  std::vector<AuditEntry> audit(const std::string& action = "", int64_t after_seq = 0) override;
  const std::string& path() const override { return path_; }

 private:
  sqlite3_stmt* prepare(const char* sql);
  bool has_table(const char* table);
  int64_t summarised_mark();                                  // meta kHeartbeatsSummarisedKey, 0 when absent
  bool next_row(sqlite3_stmt* statement, const char* table);  // false when done; a read error is a StoreError
  template <typename Record>
  std::vector<Record> ledger_rows(const char* table, Record (*from_json)(const nlohmann::json&));

  std::string path_;
  sqlite3* db_ = nullptr;
};

// Refolds the stored heartbeat samples of the engine's running leases (quotad restarted), so the waste list
// survives a restart. Throws std::runtime_error if the database cannot be read.
void replay_heartbeats(const std::string& db_path, const Engine& engine, UtilTracker& tracker);

}  // namespace yolo8::quota
