#include "quota/store/postgres_leadership.h"

#include <libpq-fe.h>

#include <memory>
#include <vector>

#include "quota/store/postgres_store.h"
#include "quota/store/state_store.h"

namespace yolo8::quota {

namespace {

using ResultPtr = std::unique_ptr<PGresult, void (*)(PGresult*)>;

std::string first_line(const char* message) {
  std::string text = message == nullptr ? "" : message;
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return text;
}

// `sql` with `params`, its result when it succeeded, else null.
ResultPtr run(pg_conn* conn, const char* sql, const std::vector<std::string>& params = {}) {
  std::vector<const char*> values;
  for (const std::string& value : params) values.push_back(value.c_str());
  // without parameters: PQexec, which takes several statements
  ResultPtr result(params.empty() ? PQexec(conn, sql)
                                  : PQexecParams(conn, sql, static_cast<int>(values.size()), nullptr, values.data(),
                                                 nullptr, nullptr, 0),
                   PQclear);
  const ExecStatusType status = PQresultStatus(result.get());
  if (status != PGRES_COMMAND_OK && status != PGRES_TUPLES_OK) return ResultPtr(nullptr, PQclear);
  return result;
}

}  // namespace

PostgresLeadership::PostgresLeadership(std::string url, std::string password, std::string address)
    : url_(std::move(url)), password_(std::move(password)), address_(std::move(address)) {
  connect();
}

PostgresLeadership::~PostgresLeadership() {
  if (conn_ != nullptr) PQfinish(conn_);  // the session ends: the lock is free for a follower at once
}

void PostgresLeadership::connect() {
  if (conn_ != nullptr) PQfinish(conn_);
  // keepalives on both ends: a leader whose node died, or a database that vanished, is noticed within ~10 s
  const char* keywords[] = {"dbname",
                            "application_name",
                            "keepalives",
                            "keepalives_idle",
                            "keepalives_interval",
                            "keepalives_count",
                            "connect_timeout",
                            password_.empty() ? nullptr : "password",
                            nullptr};
  const char* values[] = {
      url_.c_str(), "quotad-leadership", "1", "3", "2", "3", "5", password_.empty() ? nullptr : password_.c_str(),
      nullptr};
  conn_ = PQconnectdbParams(keywords, values, 1);
  if (conn_ == nullptr || PQstatus(conn_) != CONNECTION_OK) {
    const std::string message = conn_ != nullptr ? first_line(PQerrorMessage(conn_)) : "out of memory";
    throw StoreError(url_ + ": cannot connect for the leadership: " + message);
  }
  // the server's side of the same: a session whose replica stopped answering ends, and with it the lock
  run(conn_,
      "SET client_min_messages = warning; SET tcp_keepalives_idle = 3; SET tcp_keepalives_interval = 2; "
      "SET tcp_keepalives_count = 3; SET tcp_user_timeout = 9000; SET statement_timeout = 5000");
  // the leadership's own table (not the engine's schema: a SQLite database has no replicas), created once under
  // the write lock, so replicas starting together do not race
  const ResultPtr created =
      run(conn_, ("BEGIN; SELECT pg_advisory_xact_lock(" + std::to_string(kWriteLockKey) +
                  "); CREATE TABLE IF NOT EXISTS quotad_leader (id INTEGER PRIMARY KEY CHECK (id = 1), "
                  "epoch BIGINT NOT NULL, address TEXT NOT NULL, since_ms BIGINT NOT NULL); COMMIT")
                     .c_str());
  if (!created) {
    const std::string message = first_line(PQerrorMessage(conn_));
    PQclear(PQexec(conn_, "ROLLBACK"));
    throw StoreError(url_ + ": cannot create the table quotad_leader: " + message);
  }
}

bool PostgresLeadership::try_lead(int64_t now_ms) {
  if (leading_ && leads()) return true;
  leading_ = false;
  if (PQstatus(conn_) != CONNECTION_OK) {
    try {
      connect();
    } catch (const StoreError&) {
      return false;
    }
  }
  const std::string lock_key = std::to_string(kLeadershipLockKey);
  const ResultPtr got = run(conn_, "SELECT pg_try_advisory_lock($1::bigint)", {lock_key});
  if (!got || std::string(PQgetvalue(got.get(), 0, 0)) != "t") return false;
  // the epoch moves under the store's write lock: a write of the replica that led before is committed before it,
  // or sees the new epoch and fails
  const ResultPtr begun = run(conn_, "BEGIN");
  const ResultPtr bumped =
      begun ? run(conn_,
                  "WITH write_lock AS (SELECT pg_advisory_xact_lock($1::bigint)) "
                  "INSERT INTO quotad_leader(id, epoch, address, since_ms) SELECT 1, 1, $2, $3 FROM write_lock "
                  "ON CONFLICT (id) DO UPDATE SET epoch = quotad_leader.epoch + 1, address = EXCLUDED.address, "
                  "since_ms = EXCLUDED.since_ms RETURNING epoch",
                  {std::to_string(kWriteLockKey), address_, std::to_string(now_ms)})
            : ResultPtr(nullptr, PQclear);
  const ResultPtr committed = bumped ? run(conn_, "COMMIT") : ResultPtr(nullptr, PQclear);
  if (!committed || std::string(PQcmdStatus(committed.get())) != "COMMIT") {
    PQclear(PQexec(conn_, "ROLLBACK"));
    run(conn_, "SELECT pg_advisory_unlock($1::bigint)", {lock_key});
    return false;
  }
  epoch_ = std::stoll(PQgetvalue(bumped.get(), 0, 0));
  leading_ = true;
  return true;
}

bool PostgresLeadership::leads() {
  if (!leading_) return false;
  // the lock lives and dies with this session: a session that answers still holds it
  leading_ = PQstatus(conn_) == CONNECTION_OK && run(conn_, "SELECT 1") != nullptr;
  return leading_;
}

void PostgresLeadership::resign() {
  if (!leading_) return;
  leading_ = false;
  run(conn_, "SELECT pg_advisory_unlock($1::bigint)", {std::to_string(kLeadershipLockKey)});
}

std::string PostgresLeadership::leader_address() {
  if (PQstatus(conn_) != CONNECTION_OK) {
    try {
      connect();
    } catch (const StoreError&) {
      return "";
    }
  }
  const ResultPtr row = run(conn_, "SELECT address FROM quotad_leader WHERE id = 1");
  return row && PQntuples(row.get()) == 1 ? PQgetvalue(row.get(), 0, 0) : "";
}

}  // namespace yolo8::quota
