#include "quota/store/postgres_store.h"

#include <libpq-fe.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>

#include "quota/core/codec.h"
#include "quota/core/ledger.h"
#include "quota/core/receipt.h"
#include "quota/store/store.h"

namespace yolo8::quota {

namespace {

// One numbered step of the PostgreSQL schema: applied once, in order, never edited after it shipped (a change is a
// new step, here and in SQLite's kMigrations, with the same number). PostgreSQL came with schema version 8, so its
// first step creates that layout whole; "user" is quoted (a reserved word in PostgreSQL).
struct PgMigration {
  int version;
  const char* description;
  const char* sql;
};
constexpr PgMigration kPgMigrations[] = {
    {8,
     "the layout of schema version 8: meta, leases, approvals, the append-only audit log with its hash chain, "
     "usage, heartbeats, quarantine, loans, grants, memory observations",
     R"SQL(
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE leases (
  id BIGINT PRIMARY KEY, state TEXT NOT NULL, team TEXT NOT NULL, "user" TEXT NOT NULL,
  ended_ms BIGINT NOT NULL, body TEXT NOT NULL);
CREATE INDEX leases_state ON leases(state, ended_ms);
CREATE TABLE approvals (
  id BIGINT PRIMARY KEY, state TEXT NOT NULL, team TEXT NOT NULL, body TEXT NOT NULL);
CREATE TABLE audit (
  seq BIGINT PRIMARY KEY, ts_ms BIGINT NOT NULL, actor TEXT NOT NULL, action TEXT NOT NULL,
  lease_id BIGINT NOT NULL, team TEXT NOT NULL, detail TEXT NOT NULL, chain TEXT);
CREATE FUNCTION quotad_audit_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
  BEGIN RAISE EXCEPTION 'audit log is append-only'; END $$;
CREATE TRIGGER audit_no_change BEFORE UPDATE OR DELETE ON audit
  FOR EACH ROW EXECUTE FUNCTION quotad_audit_append_only();
CREATE TRIGGER audit_no_truncate BEFORE TRUNCATE ON audit
  FOR EACH STATEMENT EXECUTE FUNCTION quotad_audit_append_only();
CREATE TABLE usage (
  "user" TEXT NOT NULL, month TEXT NOT NULL, gpu_hours DOUBLE PRECISION NOT NULL, PRIMARY KEY ("user", month));
CREATE TABLE heartbeats (
  lease_id BIGINT NOT NULL, ts_ms BIGINT NOT NULL, step BIGINT, epoch BIGINT, gpu_util DOUBLE PRECISION,
  memory_used_gib DOUBLE PRECISION, last_checkpoint_ms BIGINT, gpu_util_source TEXT,
  device_memory_used_gib DOUBLE PRECISION, process_memory_used_gib DOUBLE PRECISION);
CREATE INDEX heartbeats_lease ON heartbeats(lease_id, ts_ms);
CREATE TABLE quarantine (
  source TEXT NOT NULL, row_id BIGINT NOT NULL, body TEXT, error TEXT NOT NULL, moved_ms BIGINT NOT NULL);
CREATE TABLE loans (
  id BIGINT PRIMARY KEY, state TEXT NOT NULL, "user" TEXT NOT NULL, month TEXT NOT NULL, body TEXT NOT NULL);
CREATE TABLE grants (
  id BIGINT PRIMARY KEY, "user" TEXT NOT NULL, month TEXT NOT NULL, body TEXT NOT NULL);
CREATE TABLE memory_observations (
  lease_id BIGINT NOT NULL, ts_ms BIGINT NOT NULL, model TEXT NOT NULL, imgsz INTEGER NOT NULL,
  batch INTEGER NOT NULL, amp INTEGER NOT NULL, device TEXT NOT NULL, peak_gib DOUBLE PRECISION NOT NULL,
  libtorch TEXT);
CREATE INDEX memory_observations_key ON memory_observations(model, device, lease_id);
)SQL"},
    {9, "the secret grant receipts are signed with (created at random when the step is applied)", R"SQL(
CREATE TABLE receipt_key (id INTEGER PRIMARY KEY CHECK (id = 1), secret TEXT NOT NULL);
)SQL"},
    {10, "heartbeats older than the retention period folded into hourly summaries per lease", R"SQL(
CREATE TABLE heartbeat_hours (
  lease_id BIGINT NOT NULL, hour_ms BIGINT NOT NULL, samples INTEGER NOT NULL,
  first_ts_ms BIGINT NOT NULL, first_util DOUBLE PRECISION NOT NULL, last_ts_ms BIGINT NOT NULL,
  last_util DOUBLE PRECISION NOT NULL, util_micro_ms BIGINT NOT NULL, covered_ms BIGINT NOT NULL,
  low_held_ms BIGINT NOT NULL, head_low_end_ms BIGINT NOT NULL, tail_low_since_ms BIGINT NOT NULL,
  wasted_ms BIGINT NOT NULL, longest_low_ms BIGINT NOT NULL, closed_runs BIGINT NOT NULL,
  threshold DOUBLE PRECISION NOT NULL, waste_after_ms BIGINT NOT NULL, PRIMARY KEY (lease_id, hour_ms));
CREATE INDEX heartbeat_hours_hour ON heartbeat_hours(hour_ms);
CREATE INDEX heartbeats_ts ON heartbeats(ts_ms);
)SQL"},
};
constexpr int kPgMigrationCount = static_cast<int>(sizeof kPgMigrations / sizeof kPgMigrations[0]);
static_assert(kPgMigrations[kPgMigrationCount - 1].version == kSchemaVersion, "kSchemaVersion is the last step's");

int64_t system_now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// libpq's messages end in a newline
std::string trimmed(std::string text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return text;
}

template <typename Record>
Record decode_row(const std::string& url, const char* table, int64_t id, const std::string& body,
                  Record (*from_json)(const nlohmann::json&)) {
  try {
    return from_json(nlohmann::json::parse(body));
  } catch (const std::exception& error) {
    throw StoreError(url + ": table " + table + ", row id " + std::to_string(id) + ", column body: " + error.what() +
                     " (move the row to the table quarantine by hand: see 'PostgreSQL' in quota/README.md)");
  }
}

// What SQLite's `json_extract(body, '$.review_pending') = 1` selects: an emergency lease whose review is open.
bool review_open(const std::string& body) {
  const nlohmann::json record = nlohmann::json::parse(body, nullptr, false);
  if (record.is_discarded() || !record.is_object()) return false;
  const auto it = record.find("review_pending");
  if (it == record.end()) return false;
  return (it->is_boolean() && it->get<bool>()) || (it->is_number() && *it == 1);
}

// A connection to `url`: the URL is expanded as the dbname; the password, when given, is added beside it (never
// logged).
PGconn* connect(const std::string& url, const std::string& password) {
  const char* keywords[] = {"dbname", "fallback_application_name", password.empty() ? nullptr : "password", nullptr};
  const char* values[] = {url.c_str(), "quotad", password.empty() ? nullptr : password.c_str(), nullptr};
  PGconn* conn = PQconnectdbParams(keywords, values, 1);
  if (conn == nullptr || PQstatus(conn) != CONNECTION_OK) {
    const std::string message = conn != nullptr ? trimmed(PQerrorMessage(conn)) : "out of memory";
    PQfinish(conn);
    throw StoreError(url + ": cannot connect to the quota database: " + message);
  }
  return conn;
}

}  // namespace

namespace {

// A query's answer: text values, NULL reading as 0 (as sqlite3_column_* read it).
class PgRows {
 public:
  explicit PgRows(PGresult* result) : result_(result, PQclear) {}
  int rows() const { return PQntuples(result_.get()); }
  bool null(int row, int column) const { return PQgetisnull(result_.get(), row, column) != 0; }
  std::string text(int row, int column) const { return PQgetvalue(result_.get(), row, column); }
  // NULL reads as 0, as sqlite3_column_int64 reads it
  int64_t integer(int row, int column) const {
    const char* value = PQgetvalue(result_.get(), row, column);
    int64_t out = 0;
    std::from_chars(value, value + std::char_traits<char>::length(value), out);
    return out;
  }
  double real(int row, int column) const {
    const char* value = PQgetvalue(result_.get(), row, column);
    double out = 0;
    std::from_chars(value, value + std::char_traits<char>::length(value), out);
    return out;
  }
  int64_t affected() const {
    const char* count = PQcmdTuples(result_.get());
    int64_t out = 0;
    std::from_chars(count, count + std::char_traits<char>::length(count), out);
    return out;
  }
  // The summary in the columns after lease_id and hour_ms (kPgHourColumns).
  UtilSummary summary(int row) const {
    const auto whole = [&](int column) { return integer(row, 2 + column); };
    UtilSummary out;
    out.samples = static_cast<int>(whole(0));
    out.first_ts_ms = whole(1);
    out.first_util = real(row, 2 + 2);
    out.last_ts_ms = whole(3);
    out.last_util = real(row, 2 + 4);
    out.util_micro_ms = whole(5);
    out.covered_ms = whole(6);
    out.low_held_ms = whole(7);
    out.head_low_end_ms = whole(8);
    out.tail_low_since_ms = whole(9);
    out.wasted_ms = whole(10);
    out.longest_low_ms = whole(11);
    out.closed_runs = whole(12);
    out.threshold = real(row, 2 + 13);
    out.waste_after_ms = whole(14);
    return out;
  }
  std::string command() const { return PQcmdStatus(result_.get()); }
  bool ok() const {
    const ExecStatusType status = PQresultStatus(result_.get());
    return status == PGRES_COMMAND_OK || status == PGRES_TUPLES_OK;
  }

 private:
  std::unique_ptr<PGresult, void (*)(PGresult*)> result_;
};

// Lease by lease (both answers ordered by lease id): its summed-up hours, then its samples above the mark (all
// newer); `raw` holds lease_id, ts_ms, gpu_util.
void fold_hours_then_samples(const PgRows& hours, const PgRows& raw, UtilTracker& tracker) {
  int hour = 0, sample = 0;
  while (hour < hours.rows() || sample < raw.rows()) {
    const int64_t lease = hour == hours.rows()   ? raw.integer(sample, 0)
                          : sample == raw.rows() ? hours.integer(hour, 0)
                                                 : std::min(hours.integer(hour, 0), raw.integer(sample, 0));
    for (; hour < hours.rows() && hours.integer(hour, 0) == lease; ++hour) {
      tracker.observe_summary(lease, hours.summary(hour));
    }
    for (; sample < raw.rows() && raw.integer(sample, 0) == lease; ++sample) {
      tracker.observe(lease, raw.integer(sample, 1), raw.real(sample, 2));
    }
  }
}

}  // namespace

class PostgresStore::Result : public PgRows {
 public:
  using PgRows::PgRows;
};

// Parameters in libpq's text form ($1, $2, ... in the order added).
struct PostgresStore::Params {
  std::vector<std::string> values;
  std::vector<bool> nulls;
  Params& text(const std::string& value) {
    values.push_back(value);
    nulls.push_back(false);
    return *this;
  }
  Params& integer(int64_t value) { return text(std::to_string(value)); }
  Params& real(double value) {
    char buffer[64];
    const auto end = std::to_chars(buffer, buffer + sizeof buffer, value).ptr;  // the shortest exact form
    return text(std::string(buffer, end));
  }
  Params& null() {
    values.emplace_back();
    nulls.push_back(true);
    return *this;
  }
};

PostgresStore::PostgresStore(const std::string& url, const std::string& password, int busy_timeout_ms) : url_(url) {
  conn_ = connect(url, password);
  try {
    // notices (CREATE ... IF NOT EXISTS) would go to stderr; a write waits this long for the lock, then fails
    run("set up the session",
        ("SET client_min_messages = warning; SET lock_timeout = " + std::to_string(std::max(1, busy_timeout_ms)))
            .c_str());
    migrate_schema();
  } catch (...) {
    PQfinish(conn_);
    conn_ = nullptr;
    throw;
  }
}

PostgresStore::~PostgresStore() {
  if (conn_ != nullptr) PQfinish(conn_);
}

PostgresStore::Result PostgresStore::attempt(const std::string& what, const std::function<PGresult*()>& exec) {
  for (int tries = 1;; ++tries) {
    if (!in_tx_ && PQstatus(conn_) != CONNECTION_OK) PQreset(conn_);
    Result result(exec());
    if (result.ok()) return result;
    // outside a transaction nothing was written: a connection lost since the last call (the server restarted, an
    // idle timeout) is made again once; inside one the error stands
    if (!in_tx_ && tries == 1 && PQstatus(conn_) == CONNECTION_BAD) continue;
    throw StoreError(url_ + ": " + what + ": " + trimmed(PQerrorMessage(conn_)));
  }
}

PostgresStore::Result PostgresStore::run(const std::string& what, const char* sql, const Params& params) {
  std::vector<const char*> values;
  for (size_t i = 0; i < params.values.size(); ++i) {
    values.push_back(params.nulls[i] ? nullptr : params.values[i].c_str());
  }
  return attempt(what, [&] {
    return PQexecParams(conn_, sql, static_cast<int>(values.size()), nullptr, values.data(), nullptr, nullptr, 0);
  });
}

PostgresStore::Result PostgresStore::run(const std::string& what, const char* sql) {
  return attempt(what, [&] { return PQexec(conn_, sql); });  // several statements allowed (the schema steps)
}

void PostgresStore::begin() {
  // READ COMMITTED whatever the server's default: every statement after the lock sees what the writers before
  // committed (a REPEATABLE READ snapshot would be taken before the lock is granted)
  run("begin a transaction", "BEGIN ISOLATION LEVEL READ COMMITTED");
  in_tx_ = true;
  try {
    const std::string lock = "SELECT pg_advisory_xact_lock(" + std::to_string(kWriteLockKey) + ")";
    run("wait for the write lock (another quotad or trainer holds it)", lock.c_str());
    if (fence_epoch_ > 0) {
      const Result lead = run("read the leader's epoch", "SELECT epoch FROM quotad_leader WHERE id = 1");
      const int64_t epoch = lead.rows() == 1 ? lead.integer(0, 0) : 0;
      if (epoch != fence_epoch_) {
        throw StoreError(url_ + ": fenced: another replica leads (epoch " + std::to_string(epoch) +
                         "), this one led in epoch " + std::to_string(fence_epoch_) + ": nothing written");
      }
    }
  } catch (...) {
    rollback();
    throw;
  }
}

void PostgresStore::begin_immediate() { begin(); }

void PostgresStore::commit() {
  // still in the transaction while COMMIT runs: a lost connection is an error here, never made again (a COMMIT on a
  // fresh connection would answer COMMIT for nothing)
  try {
    const Result result = run("commit", "COMMIT");
    in_tx_ = false;
    // COMMIT of a transaction a statement failed in answers ROLLBACK, not an error
    if (result.command() != "COMMIT") throw StoreError(url_ + ": commit: the transaction was rolled back");
  } catch (...) {
    in_tx_ = false;
    throw;
  }
}

void PostgresStore::rollback() {
  if (!in_tx_) return;
  in_tx_ = false;
  PQclear(PQexec(conn_, "ROLLBACK"));
}

void PostgresStore::in_transaction(const std::function<void()>& body) {
  if (in_tx_) {
    body();
    return;
  }
  begin();
  try {
    body();
  } catch (...) {
    rollback();
    throw;
  }
  commit();
}

int PostgresStore::schema_version() {
  const Result result = run("read the schema version", "SELECT COALESCE(MAX(version), 0) FROM schema_version");
  return static_cast<int>(result.integer(0, 0));
}

void PostgresStore::migrate_schema() {
  std::vector<std::string> log;
  in_transaction([&] {
    run("create the table schema_version",
        "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER PRIMARY KEY, description TEXT NOT NULL, "
        "applied_ms BIGINT NOT NULL)");
    const int found = schema_version();
    if (found > kSchemaVersion) {
      throw StoreError(url_ + ": the quota database has schema version " + std::to_string(found) +
                       ", this quotad knows up to " + std::to_string(kSchemaVersion) +
                       ": upgrade quotad (never downgrade a database; restore a dump only with the quotad that wrote "
                       "it)");
    }
    const int64_t now_ms = system_now_ms();
    std::vector<AuditEntry> entries;
    int version = found;
    for (const PgMigration& step : kPgMigrations) {
      if (step.version <= found) continue;
      try {
        run("schema step", step.sql);
      } catch (const StoreError& error) {
        throw StoreError(std::string(error.what()) + " (schema step " + std::to_string(version) + " -> " +
                         std::to_string(step.version) + ": " + step.description +
                         "; nothing was changed, the database stays at schema version " + std::to_string(found) + ")");
      }
      run("record the schema version",
          "INSERT INTO schema_version(version, description, applied_ms) VALUES ($1, $2, $3)",
          Params().integer(step.version).text(step.description).integer(now_ms));
      const std::string what =
          "schema version " + std::to_string(version) + " -> " + std::to_string(step.version) + ": " + step.description;
      AuditEntry entry;
      entry.ts_ms = now_ms;
      entry.actor = "quotad";
      entry.action = "schema.migrate";
      entry.detail = what;
      entries.push_back(entry);
      log.push_back("quotad: " + url_ + ": " + what);
      version = step.version;
    }
    // the receipt key, from OpenSSL's RAND_bytes (a replica opening at the same time keeps the first one)
    run("create the receipt key", "INSERT INTO receipt_key(id, secret) VALUES (1, $1) ON CONFLICT (id) DO NOTHING",
        Params().text(new_receipt_key_hex()));
    // a new database has no history to account for: its log starts with its use
    if (found == 0 || entries.empty()) {
      log.clear();
      return;
    }
    int64_t seq = run("read the audit log", "SELECT COALESCE(MAX(seq), 0) FROM audit").integer(0, 0);
    for (AuditEntry& entry : entries) entry.seq = ++seq;
    append_audit(entries);
  });
  for (const std::string& line : log) std::fprintf(stderr, "%s\n", line.c_str());
}

std::string PostgresStore::receipt_key() {
  const Result result = run("read the receipt key", "SELECT secret FROM receipt_key WHERE id = 1");
  if (result.rows() == 0) throw StoreError(url_ + ": receipt_key: no key stored");
  try {
    return key_from_hex(result.text(0, 0));
  } catch (const std::invalid_argument& error) {
    throw StoreError(url_ + ": " + error.what());
  }
}

bool PostgresStore::lease_recorded(int64_t lease_id) {
  const Result result = run("look up lease " + std::to_string(lease_id),
                            "SELECT 1 FROM leases WHERE id = $1 UNION ALL SELECT 1 FROM quarantine WHERE source = "
                            "'leases' AND row_id = $1",
                            Params().integer(lease_id));
  return result.rows() > 0;
}

std::string PostgresStore::meta(const std::string& key) {
  const Result result = run("read meta " + key, "SELECT value FROM meta WHERE key = $1", Params().text(key));
  return result.rows() > 0 ? result.text(0, 0) : std::string();
}

void PostgresStore::set_meta(const std::string& key, const std::string& value) {
  in_transaction([&] {
    run("write meta " + key,
        "INSERT INTO meta(key, value) VALUES ($1, $2) ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value",
        Params().text(key).text(value));
  });
}

Snapshot PostgresStore::load(int64_t now_ms, int64_t keep_ended_ms, size_t audit_tail) {
  Snapshot snapshot;
  const bool own_tx = !in_tx_;
  if (own_tx) {
    // one consistent view of every table, without waiting for writers
    run("begin a read", "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY");
    in_tx_ = true;
  }
  try {
    audit_head_ = meta("audit_head");
    {
      // the texts of the terminal states (is_terminal), as to_string(LeaseState) writes them; an ended emergency
      // lease whose review is still open is kept however old (the pattern narrows, review_open decides: every
      // body names review_pending)
      const Result rows =
          run("read table leases",
              R"SQL(SELECT id, body, state NOT IN ('released','expired','rejected') OR ended_ms >= $1 FROM leases
                    WHERE state NOT IN ('released','expired','rejected') OR ended_ms >= $1
                    OR body ~ '"review_pending"\s*:\s*(true|1)' ORDER BY id)SQL",
              Params().integer(now_ms - keep_ended_ms));
      for (int row = 0; row < rows.rows(); ++row) {
        const std::string body = rows.text(row, 1);
        if (rows.text(row, 2) != "t" && !review_open(body)) continue;
        snapshot.leases.push_back(decode_row<Lease>(url_, "leases", rows.integer(row, 0), body, &lease_from_json));
      }
    }
    for (auto& lease : snapshot.leases) {
      if (lease.state != LeaseState::kGranted && lease.state != LeaseState::kRevoking) continue;
      const Result last = run("read table heartbeats",
                              "SELECT step, epoch, gpu_util, memory_used_gib, last_checkpoint_ms, ts_ms, "
                              "gpu_util_source, COALESCE(device_memory_used_gib, -1), "
                              "COALESCE(process_memory_used_gib, -1) FROM heartbeats WHERE lease_id = $1 "
                              "ORDER BY ts_ms DESC LIMIT 1",
                              Params().integer(lease.id));
      if (last.rows() > 0) {
        lease.telemetry.step = last.integer(0, 0);
        lease.telemetry.epoch = static_cast<int>(last.integer(0, 1));
        lease.telemetry.gpu_util = last.real(0, 2);
        lease.telemetry.memory_used_gib = last.real(0, 3);
        lease.telemetry.last_checkpoint_ms = last.integer(0, 4);
        if (!last.null(0, 6)) lease.telemetry.gpu_util_source = last.text(0, 6);
        lease.telemetry.device_memory_used_gib = last.real(0, 7);
        lease.telemetry.process_memory_used_gib = last.real(0, 8);
      }
      // the last heartbeat up to now: one stored after now was received before the wall clock was set back
      const Result seen =
          run("read table heartbeats", "SELECT MAX(ts_ms) FROM heartbeats WHERE lease_id = $1 AND ts_ms <= $2",
              Params().integer(lease.id).integer(now_ms));
      if (!seen.null(0, 0)) lease.last_seen_ms = std::max<int64_t>(lease.last_seen_ms, seen.integer(0, 0));
    }
    {
      const Result rows = run("read table approvals", "SELECT id, body FROM approvals ORDER BY id");
      for (int row = 0; row < rows.rows(); ++row) {
        snapshot.approvals.push_back(
            decode_row<Approval>(url_, "approvals", rows.integer(row, 0), rows.text(row, 1), &approval_from_json));
      }
    }
    {
      const Result rows = run("read table loans", "SELECT id, body FROM loans ORDER BY id");
      for (int row = 0; row < rows.rows(); ++row) {
        snapshot.loans.push_back(
            decode_row<Loan>(url_, "loans", rows.integer(row, 0), rows.text(row, 1), &loan_from_json));
      }
    }
    {
      const Result rows = run("read table grants", "SELECT id, body FROM grants ORDER BY id");
      for (int row = 0; row < rows.rows(); ++row) {
        snapshot.grants.push_back(
            decode_row<CreditGrant>(url_, "grants", rows.integer(row, 0), rows.text(row, 1), &grant_from_json));
      }
    }
    {
      const Result next =
          run("read the ledger's id sequences",
              "SELECT GREATEST(COALESCE((SELECT MAX(id) FROM loans), 0), COALESCE((SELECT MAX(row_id) FROM quarantine "
              "WHERE source = 'loans'), 0)) + 1, GREATEST(COALESCE((SELECT MAX(id) FROM grants), 0), "
              "COALESCE((SELECT MAX(row_id) FROM quarantine WHERE source = 'grants'), 0)) + 1");
      snapshot.next_loan_id = next.integer(0, 0);
      snapshot.next_grant_id = next.integer(0, 1);
    }
    {
      const Result rows = run("read table usage", "SELECT \"user\", month, gpu_hours FROM usage");
      for (int row = 0; row < rows.rows(); ++row) {
        snapshot.usage[{rows.text(row, 0), rows.text(row, 1)}] = rows.real(row, 2);
      }
    }
    {
      const Result count = run("read table audit", "SELECT COALESCE(MAX(seq), 0), COUNT(*) FROM audit");
      snapshot.next_audit_seq = count.integer(0, 0) + 1;
      if (count.integer(0, 1) != snapshot.next_audit_seq - 1) {
        // every acknowledged change has its entry: a hole means entries were lost, which must not go unnoticed
        const Result gap = run("read table audit",
                               "SELECT CASE WHEN NOT EXISTS (SELECT 1 FROM audit WHERE seq = 1) THEN 1 ELSE "
                               "(SELECT MIN(seq) + 1 FROM audit a WHERE NOT EXISTS (SELECT 1 FROM audit b WHERE "
                               "b.seq = a.seq + 1)) END");
        throw StoreError(url_ + ": table audit: the sequence has a gap: entry " + std::to_string(gap.integer(0, 0)) +
                         " is missing (" + std::to_string(count.integer(0, 1)) + " entries up to " +
                         std::to_string(snapshot.next_audit_seq - 1) + ")");
      }
    }
    {
      const Result next =
          run("read the id sequences",
              "SELECT GREATEST(COALESCE((SELECT CAST(value AS BIGINT) FROM meta WHERE key = 'next_lease_id'), 1), "
              "COALESCE((SELECT MAX(id) FROM leases), 0) + 1, COALESCE((SELECT MAX(lease_id) FROM audit), 0) + 1, "
              "COALESCE((SELECT MAX(lease_id) FROM heartbeats), 0) + 1, "
              "COALESCE((SELECT MAX(row_id) FROM quarantine WHERE source = 'leases'), 0) + 1), "
              "GREATEST(COALESCE((SELECT CAST(value AS BIGINT) FROM meta WHERE key = 'next_approval_id'), 1), "
              "COALESCE((SELECT MAX(id) FROM approvals), 0) + 1, "
              "COALESCE((SELECT MAX(row_id) FROM quarantine WHERE source = 'approvals'), 0) + 1)");
      snapshot.next_lease_id = next.integer(0, 0);
      snapshot.next_approval_id = next.integer(0, 1);
    }
    if (audit_tail > 0) {
      snapshot.audit = audit(snapshot.next_audit_seq - 1 - static_cast<int64_t>(audit_tail), audit_tail);
    }
  } catch (...) {
    if (own_tx) rollback();
    throw;
  }
  if (own_tx) commit();
  return snapshot;
}

void PostgresStore::write(const Engine& engine, const Changes& changes) {
  if (changes.empty()) return;
  in_transaction([&] {
    for (int64_t id : changes.leases) {
      const Lease* lease = engine.find(id);
      if (lease == nullptr) continue;
      run("write lease",
          "INSERT INTO leases(id, state, team, \"user\", ended_ms, body) VALUES ($1, $2, $3, $4, $5, $6) "
          "ON CONFLICT (id) DO UPDATE SET state = EXCLUDED.state, team = EXCLUDED.team, \"user\" = EXCLUDED.\"user\", "
          "ended_ms = EXCLUDED.ended_ms, body = EXCLUDED.body",
          Params()
              .integer(lease->id)
              .text(to_string(lease->state))
              .text(lease->req.team)
              .text(lease->req.user)
              .integer(std::max(lease->ended_ms, lease->free_at_ms))
              .text(to_json(*lease, engine.policy()).dump()));
    }
    for (int64_t id : changes.approvals) {
      const Approval* approval = engine.find_approval(id);
      if (approval == nullptr) continue;
      run("write approval",
          "INSERT INTO approvals(id, state, team, body) VALUES ($1, $2, $3, $4) ON CONFLICT (id) DO UPDATE SET "
          "state = EXCLUDED.state, team = EXCLUDED.team, body = EXCLUDED.body",
          Params()
              .integer(approval->id)
              .text(to_string(approval->state))
              .text(approval->team)
              .text(to_json(*approval).dump()));
    }
    append_audit(changes.audit);
    // rows the engine found breaking an invariant at load: kept whole in the quarantine table, out of leases
    for (const auto& [id, quarantined] : changes.quarantined) {
      run("quarantine lease row",
          "INSERT INTO quarantine(source, row_id, body, error, moved_ms) SELECT 'leases', id, body, $1, $2 FROM "
          "leases WHERE id = $3",
          Params().text(quarantined.why).integer(quarantined.at_ms).integer(id));
      run("remove quarantined lease row", "DELETE FROM leases WHERE id = $1", Params().integer(id));
    }
    if (!changes.leases.empty() || !changes.approvals.empty()) {
      // the id sequences, in the same transaction as the rows that use them
      for (const auto& [key, value] :
           {std::pair<const char*, int64_t>{"next_lease_id", engine.next_lease_id()},
            std::pair<const char*, int64_t>{"next_approval_id", engine.next_approval_id()}}) {
        run("write id sequence",
            "INSERT INTO meta(key, value) VALUES ($1, $2) ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value",
            Params().text(key).text(std::to_string(value)));
      }
    }
    for (int64_t id : changes.loans) {
      const Loan* loan = engine.find_loan(id);
      if (loan == nullptr) continue;
      run("write loan",
          "INSERT INTO loans(id, state, \"user\", month, body) VALUES ($1, $2, $3, $4, $5) ON CONFLICT (id) DO "
          "UPDATE SET state = EXCLUDED.state, \"user\" = EXCLUDED.\"user\", month = EXCLUDED.month, body = "
          "EXCLUDED.body",
          Params()
              .integer(loan->id)
              .text(to_string(loan->state))
              .text(loan->user)
              .text(loan->month)
              .text(to_json(*loan).dump()));
    }
    for (int64_t id : changes.grants) {
      const auto it = engine.grants().find(id);
      if (it == engine.grants().end()) continue;
      run("write grant",
          "INSERT INTO grants(id, \"user\", month, body) VALUES ($1, $2, $3, $4) ON CONFLICT (id) DO UPDATE SET "
          "\"user\" = EXCLUDED.\"user\", month = EXCLUDED.month, body = EXCLUDED.body",
          Params()
              .integer(it->second.id)
              .text(it->second.user)
              .text(it->second.month)
              .text(to_json(it->second).dump()));
    }
    for (const auto& key : changes.usage) {
      const auto it = engine.usage().find(key);
      if (it == engine.usage().end()) continue;
      run("write usage",
          "INSERT INTO usage(\"user\", month, gpu_hours) VALUES ($1, $2, $3) ON CONFLICT (\"user\", month) DO "
          "UPDATE SET gpu_hours = EXCLUDED.gpu_hours",
          Params().text(key.first).text(key.second).real(it->second));
    }
  });
}

void PostgresStore::append_audit(const std::vector<AuditEntry>& entries) {
  if (entries.empty()) return;
  // the head is read inside this transaction, under the write lock: other writers append to the same chain
  const std::string head = meta("audit_head");
  std::string link = head.empty() ? std::string() : head.substr(head.find(' ') + 1);
  for (const auto& entry : entries) {
    link = audit_chain_link(link, entry);
    run("append audit",
        "INSERT INTO audit(seq, ts_ms, actor, action, lease_id, team, detail, chain) VALUES ($1, $2, $3, $4, $5, $6, "
        "$7, $8)",
        Params()
            .integer(entry.seq)
            .integer(entry.ts_ms)
            .text(entry.actor)
            .text(entry.action)
            .integer(entry.lease_id)
            .text(entry.team)
            .text(entry.detail)
            .text(link));
  }
  const std::string new_head = std::to_string(entries.back().seq) + " " + link;
  run("write the audit chain head",
      "INSERT INTO meta(key, value) VALUES ('audit_head', $1) ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value",
      Params().text(new_head));
  audit_head_ = new_head;
}

void PostgresStore::write_heartbeats(const std::vector<HeartbeatSample>& samples) {
  if (samples.empty()) return;
  in_transaction([&] {
    for (const auto& sample : samples) {
      const Telemetry& t = sample.telemetry;
      Params params;
      params.integer(sample.lease_id)
          .integer(sample.ts_ms)
          .integer(t.step)
          .integer(t.epoch)
          .real(t.gpu_util)
          .real(t.memory_used_gib)
          .integer(t.last_checkpoint_ms);
      if (t.gpu_util_source.empty()) {
        params.null();
      } else {
        params.text(t.gpu_util_source);
      }
      params.real(t.device_memory_used_gib).real(t.process_memory_used_gib);
      run("write heartbeat",
          "INSERT INTO heartbeats(lease_id, ts_ms, step, epoch, gpu_util, memory_used_gib, last_checkpoint_ms, "
          "gpu_util_source, device_memory_used_gib, process_memory_used_gib) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, "
          "$9, $10)",
          params);
    }
    // as in SQLite: a run keeps one row per setting, its highest peak; a run's first row prunes its key (model,
    // device, AMP, LibTorch) to the latest kMemoryObservationRunsKept runs
    for (const auto& sample : samples) {
      const Telemetry& t = sample.telemetry;
      if (!t.is_memory_observation()) continue;
      const auto libtorch = [&](Params& params) -> Params& {
        return t.libtorch.empty() ? params.null() : params.text(t.libtorch);
      };
      Params raise;
      raise.integer(sample.lease_id)
          .integer(sample.ts_ms)
          .text(t.model)
          .integer(t.imgsz)
          .integer(t.batch)
          .integer(t.amp);
      libtorch(raise.text(t.device_name)).real(t.memory_used_gib);
      const Result raised =
          run("raise memory observation",
              "UPDATE memory_observations SET peak_gib = GREATEST(peak_gib, $9::DOUBLE PRECISION), ts_ms = "
              "GREATEST(ts_ms, $2::BIGINT) WHERE lease_id = $1 AND model = $3 AND imgsz = $4 AND batch = $5 AND amp = "
              "$6 AND device = $7 AND COALESCE(libtorch, '') = COALESCE($8::TEXT, '')",
              raise);
      if (raised.affected() > 0) continue;
      run("write memory observation",
          "INSERT INTO memory_observations(lease_id, ts_ms, model, imgsz, batch, amp, device, libtorch, peak_gib) "
          "VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
          raise);
      Params key;
      key.text(t.model).integer(t.amp).text(t.device_name);
      libtorch(key).integer(kMemoryObservationRunsKept);
      run("prune memory observations",
          "DELETE FROM memory_observations WHERE model = $1 AND amp = $2 AND device = $3 AND COALESCE(libtorch, '') = "
          "COALESCE($4::TEXT, '') AND lease_id NOT IN (SELECT lease_id FROM memory_observations WHERE model = $1 AND "
          "amp = $2 AND device = $3 AND COALESCE(libtorch, '') = COALESCE($4::TEXT, '') GROUP BY lease_id ORDER BY "
          "MAX(ts_ms) DESC, lease_id DESC LIMIT $5)",
          key);
    }
  });
}

std::vector<AuditEntry> PostgresStore::audit(int64_t after_seq, size_t limit, const std::string& team) {
  const Result rows = run("read table audit",
                          "SELECT seq, ts_ms, actor, action, lease_id, team, detail FROM audit WHERE seq > $1 AND "
                          "($2 = '' OR team = $2) ORDER BY seq LIMIT $3",
                          Params().integer(after_seq).text(team).integer(static_cast<int64_t>(limit)));
  std::vector<AuditEntry> out;
  for (int row = 0; row < rows.rows(); ++row) {
    AuditEntry entry;
    entry.seq = rows.integer(row, 0);
    entry.ts_ms = rows.integer(row, 1);
    entry.actor = rows.text(row, 2);
    entry.action = rows.text(row, 3);
    entry.lease_id = rows.integer(row, 4);
    entry.team = rows.text(row, 5);
    entry.detail = rows.text(row, 6);
    out.push_back(std::move(entry));
  }
  return out;
}

int64_t PostgresStore::count_heartbeats() {
  return run("read table heartbeats", "SELECT COUNT(*) FROM heartbeats").integer(0, 0);
}

std::vector<MemoryObservation> PostgresStore::memory_observations() {
  // one sample per run and setting: the run's highest peak at that (imgsz, batch, AMP); texts in byte order, as
  // SQLite sorts them
  const Result rows = run("read table memory_observations",
                          "SELECT model, device, amp, imgsz, batch, MAX(peak_gib), COALESCE(libtorch, '') FROM "
                          "memory_observations GROUP BY lease_id, model, device, amp, imgsz, batch, "
                          "COALESCE(libtorch, '') ORDER BY device COLLATE \"C\", model COLLATE \"C\", lease_id");
  std::vector<MemoryObservation> out;
  for (int row = 0; row < rows.rows(); ++row) {
    MemoryObservation observation;
    observation.model = rows.text(row, 0);
    observation.device = rows.text(row, 1);
    observation.amp = rows.integer(row, 2) == 1;
    observation.imgsz = static_cast<int>(rows.integer(row, 3));
    observation.batch = static_cast<int>(rows.integer(row, 4));
    observation.peak_gib = rows.real(row, 5);
    observation.libtorch = rows.text(row, 6);
    out.push_back(observation);
  }
  return out;
}

namespace {

// heartbeat_hours: the key, then an hour's UtilSummary (as in SQLite)
constexpr const char* kPgHourColumns =
    "lease_id, hour_ms, samples, first_ts_ms, first_util, last_ts_ms, last_util, util_micro_ms, covered_ms, "
    "low_held_ms, head_low_end_ms, tail_low_since_ms, wasted_ms, longest_low_ms, closed_runs, threshold, "
    "waste_after_ms";

}  // namespace

int64_t PostgresStore::summarised_mark() {
  const std::string recorded = meta(kHeartbeatsSummarisedKey);
  return recorded.empty() ? 0 : std::stoll(recorded);
}

void PostgresStore::replay_heartbeats(const Engine& engine, UtilTracker& tracker) {
  const int64_t mark = summarised_mark();
  for (const auto& [id, lease] : engine.leases()) {
    if (lease.state != LeaseState::kGranted && lease.state != LeaseState::kRevoking) continue;
    tracker.forget(id);
    const Result hours =
        run("read table heartbeat_hours",
            (std::string("SELECT ") + kPgHourColumns + " FROM heartbeat_hours WHERE lease_id = $1 ORDER BY hour_ms")
                .c_str(),
            Params().integer(id));
    for (int row = 0; row < hours.rows(); ++row) tracker.observe_summary(id, hours.summary(row));
    const Result rows =
        run("read table heartbeats",
            "SELECT ts_ms, gpu_util FROM heartbeats WHERE lease_id = $1 AND ts_ms >= $2 AND gpu_util >= 0 ORDER BY "
            "ts_ms",
            Params().integer(id).integer(mark));
    for (int row = 0; row < rows.rows(); ++row) tracker.observe(id, rows.integer(row, 0), rows.real(row, 1));
  }
}

// As Store::fold_heartbeats: a step ends between two times, so that what stays is exactly the newer.
int64_t PostgresStore::fold_heartbeats(int64_t summarise_before_ms, int64_t delete_before_ms, double threshold,
                                       int64_t waste_after_ms, int64_t max_rows) {
  max_rows = std::max<int64_t>(1, max_rows);
  int64_t folded = 0;
  in_transaction([&] {
    const std::string recorded = meta(kHeartbeatsSummarisedKey);
    const int64_t mark = recorded.empty() ? 0 : std::stoll(recorded);
    const int64_t before = hour_of(summarise_before_ms);
    std::vector<UtilSample> rows;
    const auto read = [&](const Result& result) {
      for (int row = 0; row < result.rows(); ++row) {
        rows.push_back({result.integer(row, 0), result.integer(row, 1), result.real(row, 2)});
      }
    };
    int64_t bound = std::max(mark, before);
    if (before > mark) {
      read(run("read table heartbeats",
               "SELECT lease_id, ts_ms, COALESCE(gpu_util, -1) FROM heartbeats WHERE ts_ms >= $1 AND ts_ms < $2 "
               "ORDER BY ts_ms LIMIT $3",
               Params().integer(mark).integer(before).integer(max_rows)));
      if (static_cast<int64_t>(rows.size()) >= max_rows) {
        bound = rows.back().ts_ms;
        while (!rows.empty() && rows.back().ts_ms == bound) rows.pop_back();
        if (rows.empty()) {
          read(run("read table heartbeats",
                   "SELECT lease_id, ts_ms, COALESCE(gpu_util, -1) FROM heartbeats WHERE ts_ms = $1",
                   Params().integer(bound)));
          ++bound;
        }
      }
    }
    const std::string select =
        std::string("SELECT ") + kPgHourColumns + " FROM heartbeat_hours WHERE lease_id = $1 AND hour_ms = $2";
    std::string upsert = std::string("INSERT INTO heartbeat_hours(") + kPgHourColumns +
                         ") VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17) "
                         "ON CONFLICT (lease_id, hour_ms) DO UPDATE SET ";
    const char* updated[] = {"samples",       "first_ts_ms",    "first_util",  "last_ts_ms",      "last_util",
                             "util_micro_ms", "covered_ms",     "low_held_ms", "head_low_end_ms", "tail_low_since_ms",
                             "wasted_ms",     "longest_low_ms", "closed_runs", "threshold",       "waste_after_ms"};
    for (const char* column : updated) {
      upsert += std::string(column == updated[0] ? "" : ", ") + column + " = EXCLUDED." + column;
    }
    for (auto& [key, summary] : summarise_by_hour(rows, threshold, waste_after_ms)) {
      if (summary.empty()) continue;  // only samples without a utilisation
      UtilSummary merged = summary;
      const Result stored =
          run("read table heartbeat_hours", select.c_str(), Params().integer(key.first).integer(key.second));
      if (stored.rows() > 0) {  // the hour's first part was summed up by the step before
        merged = stored.summary(0);
        merged.append(summary);
      }
      run("write table heartbeat_hours", upsert.c_str(),
          Params()
              .integer(key.first)
              .integer(key.second)
              .integer(merged.samples)
              .integer(merged.first_ts_ms)
              .real(merged.first_util)
              .integer(merged.last_ts_ms)
              .real(merged.last_util)
              .integer(merged.util_micro_ms)
              .integer(merged.covered_ms)
              .integer(merged.low_held_ms)
              .integer(merged.head_low_end_ms)
              .integer(merged.tail_low_since_ms)
              .integer(merged.wasted_ms)
              .integer(merged.longest_low_ms)
              .integer(merged.closed_runs)
              .real(merged.threshold)
              .integer(merged.waste_after_ms));
    }
    if (bound != mark) set_meta(kHeartbeatsSummarisedKey, std::to_string(bound));
    // past the retention period, and summed up
    const Result deleted = run("delete heartbeats past the retention period",
                               "DELETE FROM heartbeats WHERE ctid IN (SELECT ctid FROM heartbeats WHERE ts_ms < $1 "
                               "ORDER BY ts_ms LIMIT $2)",
                               Params().integer(std::min(bound, hour_of(delete_before_ms))).integer(max_rows));
    folded = static_cast<int64_t>(rows.size()) + deleted.affected();
  });
  return folded;
}

void PostgresStore::util_history(int64_t from_ms, int64_t to_ms, UtilTracker& tracker) {
  const Result hours = run("read table heartbeat_hours",
                           (std::string("SELECT ") + kPgHourColumns +
                            " FROM heartbeat_hours WHERE hour_ms >= $1 AND hour_ms < $2 ORDER BY lease_id, hour_ms")
                               .c_str(),
                           Params().integer(from_ms).integer(to_ms));
  const Result raw = run("read table heartbeats",
                         "SELECT lease_id, ts_ms, gpu_util FROM heartbeats WHERE ts_ms >= $1 AND ts_ms < $2 AND "
                         "gpu_util >= 0 ORDER BY lease_id, ts_ms",
                         Params().integer(std::max(from_ms, summarised_mark())).integer(to_ms));
  fold_hours_then_samples(hours, raw, tracker);
}

int64_t PostgresStore::count_heartbeat_hours() {
  return run("read table heartbeat_hours", "SELECT COUNT(*) FROM heartbeat_hours").integer(0, 0);
}

class PostgresReportReader::Rows : public PgRows {
 public:
  using PgRows::PgRows;
};

PostgresReportReader::PostgresReportReader(const std::string& url, const std::string& password) : url_(url) {
  conn_ = connect(url, password);
  try {
    query("begin a read-only transaction", "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY");
    has_hours_ = query("read the schema", "SELECT to_regclass('heartbeat_hours') IS NOT NULL").text(0, 0) == "t";
    const Rows mark = query("read table meta", "SELECT value FROM meta WHERE key = $1", {kHeartbeatsSummarisedKey});
    if (mark.rows() > 0) mark_ = mark.integer(0, 0);
  } catch (...) {
    PQfinish(conn_);
    conn_ = nullptr;
    throw;
  }
}

PostgresReportReader::~PostgresReportReader() {
  if (conn_ != nullptr) PQfinish(conn_);
}

PostgresReportReader::Rows PostgresReportReader::query(const std::string& what, const char* sql,
                                                       const std::vector<std::string>& params) {
  std::vector<const char*> values;
  for (const std::string& value : params) values.push_back(value.c_str());
  Rows rows(PQexecParams(conn_, sql, static_cast<int>(values.size()), nullptr, values.data(), nullptr, nullptr, 0));
  if (!rows.ok()) throw StoreError(url_ + ": " + what + ": " + trimmed(PQerrorMessage(conn_)));
  return rows;
}

std::vector<Lease> PostgresReportReader::leases_since(int64_t ended_since_ms) {
  // the texts of the terminal states (is_terminal), as to_string(LeaseState) writes them
  const Rows rows = query("read table leases",
                          "SELECT id, body FROM leases WHERE state NOT IN ('released','expired','rejected') OR "
                          "ended_ms >= $1 ORDER BY id",
                          {std::to_string(ended_since_ms)});
  std::vector<Lease> out;
  for (int row = 0; row < rows.rows(); ++row) {
    out.push_back(decode_row<Lease>(url_, "leases", rows.integer(row, 0), rows.text(row, 1), &lease_from_json));
  }
  return out;
}

void PostgresReportReader::fold_util(int64_t from_ms, int64_t to_ms, UtilTracker& tracker) {
  const std::string from = std::to_string(from_ms), to = std::to_string(to_ms);
  const Rows hours =
      has_hours_ ? query("read table heartbeat_hours",
                         (std::string("SELECT ") + kPgHourColumns +
                          " FROM heartbeat_hours WHERE hour_ms >= $1 AND hour_ms < $2 ORDER BY lease_id, hour_ms")
                             .c_str(),
                         {from, to})
                 : query("read the schema", "SELECT 1 WHERE false");
  const Rows raw = query("read table heartbeats",
                         "SELECT lease_id, ts_ms, gpu_util FROM heartbeats WHERE ts_ms >= $1 AND ts_ms < $2 AND "
                         "gpu_util >= 0 ORDER BY lease_id, ts_ms",
                         {std::to_string(std::max(from_ms, mark_)), to});
  fold_hours_then_samples(hours, raw, tracker);
}

std::map<std::pair<std::string, std::string>, double> PostgresReportReader::usage(
    const std::vector<std::string>& months) {
  const Rows rows = query("read table usage", "SELECT \"user\", month, gpu_hours FROM usage");
  std::map<std::pair<std::string, std::string>, double> out;
  for (int row = 0; row < rows.rows(); ++row) {
    std::string month = rows.text(row, 1);
    if (!months.empty() && std::find(months.begin(), months.end(), month) == months.end()) continue;
    out[{rows.text(row, 0), std::move(month)}] = rows.real(row, 2);
  }
  return out;
}

template <typename Record>
std::vector<Record> PostgresReportReader::ledger_rows(const char* table, Record (*from_json)(const nlohmann::json&)) {
  const Rows rows = query(std::string("read table ") + table,
                          (std::string("SELECT id, body FROM ") + table + " ORDER BY id").c_str());
  std::vector<Record> out;
  for (int row = 0; row < rows.rows(); ++row) {
    out.push_back(decode_row<Record>(url_, table, rows.integer(row, 0), rows.text(row, 1), from_json));
  }
  return out;
}

std::vector<Loan> PostgresReportReader::loans() { return ledger_rows<Loan>("loans", &loan_from_json); }

std::vector<CreditGrant> PostgresReportReader::grants() { return ledger_rows<CreditGrant>("grants", &grant_from_json); }

std::vector<AuditEntry> PostgresReportReader::audit(const std::string& action, int64_t after_seq) {
  const Rows rows = query("read table audit",
                          "SELECT seq, ts_ms, actor, action, lease_id, team, detail FROM audit WHERE seq > $1 AND "
                          "($2 = '' OR action = $2) ORDER BY seq",
                          {std::to_string(after_seq), action});
  std::vector<AuditEntry> out;
  for (int row = 0; row < rows.rows(); ++row) {
    AuditEntry entry;
    entry.seq = rows.integer(row, 0);
    entry.ts_ms = rows.integer(row, 1);
    entry.actor = rows.text(row, 2);
    entry.action = rows.text(row, 3);
    entry.lease_id = rows.integer(row, 4);
    entry.team = rows.text(row, 5);
    entry.detail = rows.text(row, 6);
    out.push_back(std::move(entry));
  }
  return out;
}

AuditChainCheck verify_postgres_audit_chain(const std::string& url, const std::string& password) {
  const std::unique_ptr<PGconn, void (*)(PGconn*)> conn(connect(url, password), PQfinish);
  const auto run = [&](const char* sql, const std::vector<std::string>& params = {}) {
    std::vector<const char*> values;
    for (const std::string& value : params) values.push_back(value.c_str());
    std::unique_ptr<PGresult, void (*)(PGresult*)> result(
        PQexecParams(conn.get(), sql, static_cast<int>(values.size()), nullptr, values.data(), nullptr, nullptr, 0),
        PQclear);
    const ExecStatusType status = PQresultStatus(result.get());
    if (status != PGRES_COMMAND_OK && status != PGRES_TUPLES_OK) {
      throw StoreError(url + ": " + trimmed(PQerrorMessage(conn.get())));
    }
    return result;
  };
  run("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY");
  AuditChainVerifier verifier;
  // a page at a time: the log can be long
  for (int64_t after = 0;;) {
    const auto rows =
        run("SELECT seq, ts_ms, actor, action, lease_id, team, detail, chain FROM audit WHERE seq > $1 ORDER BY seq "
            "LIMIT 10000",
            {std::to_string(after)});
    const int count = PQntuples(rows.get());
    if (count == 0) break;
    for (int row = 0; row < count; ++row) {
      const auto value = [&](int column) { return std::string(PQgetvalue(rows.get(), row, column)); };
      AuditEntry entry;
      entry.seq = std::stoll(value(0));
      entry.ts_ms = std::stoll(value(1));
      entry.actor = value(2);
      entry.action = value(3);
      entry.lease_id = std::stoll(value(4));
      entry.team = value(5);
      entry.detail = value(6);
      const bool linked = PQgetisnull(rows.get(), row, 7) == 0;
      const std::string chain = linked ? value(7) : std::string();
      if (!verifier.add(entry, linked ? &chain : nullptr)) return verifier.finish("");
      after = entry.seq;
    }
  }
  const auto head = run("SELECT value FROM meta WHERE key = 'audit_head'");
  return verifier.finish(PQntuples(head.get()) > 0 ? PQgetvalue(head.get(), 0, 0) : "");
}

}  // namespace yolo8::quota
