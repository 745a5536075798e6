#pragma once
// PostgreSQL persistence of the engine: the tables and meaning of the SQLite layout (quota/store/store.cpp), types
// mapped (BIGINT, DOUBLE PRECISION, TEXT), the schema in numbered steps recorded in the table schema_version, the
// same append-only audit log with the same hash chain. Every write is one transaction that first takes one
// transaction-scoped advisory lock: writers queue as SQLite's BEGIN IMMEDIATE makes them, and each sees what the
// one before it committed. Backups and repair are PostgreSQL's own (pg_dump, continuous archiving).
#include <nlohmann/json_fwd.hpp>

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "quota/store/state_store.h"
#include "quota/store/store.h"

struct pg_conn;
struct pg_result;

namespace yolo8::quota {

// The advisory locks of quotad's sessions: every write transaction takes the write lock first (writers queue behind
// it); the leading replica holds the leadership lock for as long as its session lives (postgres_leadership.h).
inline constexpr int64_t kWriteLockKey = 0x71756f746164;  // "quotad" in ASCII
inline constexpr int64_t kLeadershipLockKey = kWriteLockKey + 1;

class PostgresStore : public StateStore {
 public:
  // Connects to `url` (a libpq URL without a password; `password` when not empty, else libpq's PGPASSWORD /
  // PGPASSFILE) and brings the schema to kSchemaVersion: the missing steps in one transaction, each logged and,
  // on a database that already held quotad's tables, audited; a database of a newer version is refused naming both.
  // `busy_timeout_ms`: how long a write waits for another writer before it fails (StoreError).
  PostgresStore(const std::string& url, const std::string& password, int busy_timeout_ms = 30000);
  ~PostgresStore() override;
  PostgresStore(const PostgresStore&) = delete;
  PostgresStore& operator=(const PostgresStore&) = delete;

  Snapshot load(int64_t now_ms, int64_t keep_ended_ms, size_t audit_tail) override;
  void write(const Engine& engine, const Changes& changes) override;
  void write_heartbeats(const std::vector<HeartbeatSample>& samples) override;
  void begin_immediate() override;
  void commit() override;
  void rollback() override;
  std::string meta(const std::string& key) override;
  void set_meta(const std::string& key, const std::string& value) override;
  std::vector<AuditEntry> audit(int64_t after_seq, size_t limit, const std::string& team = "") override;
  int64_t count_heartbeats() override;
  std::vector<MemoryObservation> memory_observations() override;
  void replay_heartbeats(const Engine& engine, UtilTracker& tracker) override;
  int64_t fold_heartbeats(int64_t summarise_before_ms, int64_t delete_before_ms, double threshold,
                          int64_t waste_after_ms, int64_t max_rows) override;
  void util_history(int64_t from_ms, int64_t to_ms, UtilTracker& tracker) override;
  int64_t count_heartbeat_hours() override;
  const std::string& audit_head() const override { return audit_head_; }
  const std::string& path() const override { return url_; }

  // The schema version the database records (0 before the first step).
  int schema_version();
  // From now on every write transaction first checks that the lead is still in `epoch` (table quotad_leader) and
  // fails, writing nothing, once another replica has taken over (PostgresLeadership): a replica that lost the lead
  // never changes state, even before it notices.
  void fence(int64_t epoch) override { fence_epoch_ = epoch; }
  std::string receipt_key() override;
  bool lease_recorded(int64_t lease_id) override;

 private:
  class Result;
  struct Params;
  Result run(const std::string& what, const char* sql, const Params& params);
  Result run(const std::string& what, const char* sql);
  Result attempt(const std::string& what, const std::function<pg_result*()>& exec);
  // Every write goes through here: it joins an open transaction, or is one (begin, `body`, commit).
  void in_transaction(const std::function<void()>& body);
  void begin();
  void migrate_schema();
  void append_audit(const std::vector<AuditEntry>& entries);
  int64_t summarised_mark();  // meta kHeartbeatsSummarisedKey, 0 when absent

  std::string url_;
  std::string audit_head_;
  pg_conn* conn_ = nullptr;
  bool in_tx_ = false;
  int64_t fence_epoch_ = 0;  // 0: not fenced (a single replica)
};

// The reports' queries (ReportReader) on a PostgreSQL database: one connection of its own, every query in one
// read-only REPEATABLE READ transaction (one snapshot, taken at the first query), nothing created or migrated.
class PostgresReportReader : public ReportReader {
 public:
  PostgresReportReader(const std::string& url, const std::string& password);
  ~PostgresReportReader() override;
  PostgresReportReader(const PostgresReportReader&) = delete;
  PostgresReportReader& operator=(const PostgresReportReader&) = delete;

  std::vector<Lease> leases_since(int64_t ended_since_ms) override;
  void fold_util(int64_t from_ms, int64_t to_ms, UtilTracker& tracker) override;
  std::map<std::pair<std::string, std::string>, double> usage(const std::vector<std::string>& months = {}) override;
  std::vector<Loan> loans() override;
  std::vector<CreditGrant> grants() override;
  std::vector<AuditEntry> audit(const std::string& action = "", int64_t after_seq = 0) override;
  const std::string& path() const override { return url_; }

 private:
  class Rows;
  Rows query(const std::string& what, const char* sql, const std::vector<std::string>& params = {});
  template <typename Record>
  std::vector<Record> ledger_rows(const char* table, Record (*from_json)(const nlohmann::json&));

  std::string url_;
  pg_conn* conn_ = nullptr;
  bool has_hours_ = false;  // a database of schema version 9 or later
  int64_t mark_ = 0;        // meta kHeartbeatsSummarisedKey
};

// `quotad audit --verify` on a PostgreSQL database: its audit log and recorded head, read in one read-only
// transaction (nothing is created or migrated), through AuditChainVerifier.
AuditChainCheck verify_postgres_audit_chain(const std::string& url, const std::string& password);

}  // namespace yolo8::quota
