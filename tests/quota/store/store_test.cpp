#include "quota/store/store.h"

#include <sqlite3.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <tuple>

#include "tests/quota/quota_test_util.h"

namespace yolo8::quota {
namespace {

using testing::kHour;
using testing::kMinute;
using testing::kMonday;

using testing::temp_db;

// Runs `sql` on the database behind the Store's back, as an older quotad (or a hand edit) would have written it.
void execute(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  char* error = nullptr;
  const int code = sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &error);
  EXPECT_EQ(code, SQLITE_OK) << (error != nullptr ? error : "");
  sqlite3_free(error);
  sqlite3_close(db);
}

// The single text value `sql` selects.
std::string query_text(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  EXPECT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  sqlite3_stmt* statement = nullptr;
  EXPECT_EQ(sqlite3_prepare_v2(db, sql.c_str(), -1, &statement, nullptr), SQLITE_OK);
  std::string value;
  if (sqlite3_step(statement) == SQLITE_ROW) {
    value = reinterpret_cast<const char*>(sqlite3_column_text(statement, 0));
  }
  sqlite3_finalize(statement);
  sqlite3_close(db);
  return value;
}

// Rows exactly as the string-typed quotad wrote them: a pending lease and a cancelled approval.
constexpr const char* kOldRows = R"SQL(
INSERT INTO leases(id, state, team, user, ended_ms, body) VALUES (1, 'released', 'team-cv', 'alice', 1795996800000,
  '{"id":1,"request":{"team":"team-cv","user":"alice","job":"j1","model":"yolov8l","imgsz":640,"batch":0,"gpus":1,
  "memory_gib":0.0,"priority":"normal","preemptible":true,"shared":false,"justification":"paper","idempotency_key":""},
  "state":"released","outcome":"cancelled","gpus":1,"approval_id":1,"created_ms":1795996000000,
  "ended_ms":1795996800000,"reason":""}');
INSERT INTO leases(id, state, team, user, ended_ms, body) VALUES (2, 'pending_approval', 'team-cv', 'bob', 0,
  '{"id":2,"request":{"team":"team-cv","user":"bob","model":"yolov8x","priority":"high","justification":"deadline"},
  "state":"pending_approval","outcome":"","gpus":2,"approval_id":2,"created_ms":1795996000000}');
INSERT INTO approvals(id, state, team, body) VALUES (1, 'cancelled', 'team-cv',
  '{"id":1,"lease_id":1,"team":"team-cv","user":"alice","model":"yolov8l","justification":"paper",
  "state":"cancelled","decided_by":"","note":"","created_ms":1795996000000,"decided_ms":1795996800000}');
INSERT INTO approvals(id, state, team, body) VALUES (2, 'pending', 'team-cv',
  '{"id":2,"lease_id":2,"team":"team-cv","user":"bob","model":"yolov8x","justification":"deadline",
  "state":"pending","created_ms":1795996000000}');
)SQL";

TEST(QuotaStore, RowsInTheOldTextFormStillLoadAsTypedStates) {
  const std::string path = temp_db("old_rows");
  { Store create(path); }
  execute(path, kOldRows);
  Store store(path);
  const Snapshot snapshot = store.load(kMonday + kHour, 24 * kHour, 100);
  ASSERT_EQ(snapshot.leases.size(), 2u);
  EXPECT_EQ(snapshot.leases[0].state, LeaseState::kReleased);
  EXPECT_EQ(snapshot.leases[0].outcome, Outcome::kCancelled);
  EXPECT_EQ(snapshot.leases[1].state, LeaseState::kPendingApproval);
  EXPECT_EQ(snapshot.leases[1].outcome, Outcome::kNone);
  EXPECT_EQ(snapshot.leases[1].req.priority, Priority::kHigh);
  ASSERT_EQ(snapshot.approvals.size(), 2u);
  EXPECT_EQ(snapshot.approvals[0].state, ApprovalState::kCancelled);
  EXPECT_EQ(snapshot.approvals[1].state, ApprovalState::kPending);
}

TEST(QuotaStore, WritesStatesInTheSameTextFormAsBefore) {
  const std::string path = temp_db("text_form");
  Engine engine(testing::example_policy());
  LeaseRequest request;
  request.team = "team-cv";
  request.user = "alice";
  request.model = "yolov8x";  // the approval tier
  request.justification = "paper deadline";
  const AcquireResult asked = engine.acquire(request, kMonday);
  ASSERT_EQ(asked.kind, AcquireResult::Kind::kNeedsApproval);
  engine.release(asked.lease_id, Outcome::kNone, kMonday + 1000);
  Store store(path);
  store.write(engine, engine.take_changes());
  EXPECT_EQ(query_text(path, "SELECT state FROM leases WHERE id = 1"), "released");
  EXPECT_EQ(query_text(path, "SELECT json_extract(body, '$.outcome') FROM leases WHERE id = 1"), "cancelled");
  EXPECT_EQ(query_text(path, "SELECT state FROM approvals WHERE id = 1"), "cancelled");
  EXPECT_EQ(query_text(path, "SELECT json_extract(body, '$.state') FROM approvals WHERE id = 1"), "cancelled");
}

// Rows that parse but break invariants, edited into the database behind quotad's back (a second
// lease on lease 1's GPU, a lease of 500 GPUs). After a restart each is in the quarantine table with why, gone
// from the leases, audited; the first lease keeps its GPU; a second restart finds nothing more to do.
TEST(QuotaStore, RowsThatBreakInvariantsAreQuarantinedAtLoadWithAnAuditEntry) {
  const std::string path = temp_db("invariant_rows");
  {
    Engine engine(testing::example_policy());
    LeaseRequest request;
    request.team = "team-cv";
    request.user = "alice";
    for (int i = 0; i < 3; ++i) ASSERT_EQ(engine.acquire(request, kMonday).kind, AcquireResult::Kind::kGranted);
    Store store(path);
    store.write(engine, engine.take_changes());
  }
  execute(path,
          "UPDATE leases SET body = json_set(body, '$.devices', json_extract((SELECT body FROM leases WHERE id = 1), "
          "'$.devices')) WHERE id = 2; UPDATE leases SET body = json_set(body, '$.gpus', 500) WHERE id = 3;");
  const int64_t restart = kMonday + kMinute;
  auto restart_once = [&] {
    Store store(path);
    Snapshot snapshot = store.load(restart, 24 * kHour, 100);
    Engine engine(testing::example_policy());
    engine.restore(std::move(snapshot.leases), std::move(snapshot.approvals), std::move(snapshot.audit),
                   std::move(snapshot.usage), snapshot.next_audit_seq, restart);
    store.write(engine, engine.take_changes());
    EXPECT_TRUE(engine.check_invariants(restart).empty());
    return engine.leases().size();
  };
  EXPECT_EQ(restart_once(), 1u);
  EXPECT_EQ(query_text(path, "SELECT COALESCE(group_concat(id), '') FROM leases"), "1");
  EXPECT_EQ(query_text(path,
                       "SELECT COALESCE(group_concat(row_id), '') FROM (SELECT row_id FROM quarantine WHERE source = "
                       "'leases' ORDER BY row_id)"),
            "2,3");
  EXPECT_NE(query_text(path, "SELECT COALESCE(MAX(error), '') FROM quarantine WHERE row_id = 2")
                .find("already held by lease 1"),
            std::string::npos);
  EXPECT_NE(query_text(path, "SELECT COALESCE(MAX(error), '') FROM quarantine WHERE row_id = 3").find("gpus 500"),
            std::string::npos);
  EXPECT_EQ(query_text(path,
                       "SELECT COALESCE(group_concat(lease_id), '') FROM (SELECT lease_id FROM audit WHERE action = "
                       "'lease.quarantined' ORDER BY lease_id)"),
            "2,3");
  EXPECT_EQ(restart_once(), 1u);  // nothing left to quarantine, nothing quarantined twice
  EXPECT_EQ(query_text(path, "SELECT COUNT(*) FROM quarantine"), "2");
}

// The message of the StoreError loading `path` throws; empty (and a test failure) when it loads.
std::string load_error(const std::string& path) {
  Store store(path);
  try {
    store.load(kMonday + kHour, 24 * kHour, 0);
  } catch (const StoreError& error) {
    return error.what();
  }
  ADD_FAILURE() << "loaded";
  return "";
}

TEST(QuotaStore, AnUnknownStoredStateIsAnErrorNamingTableRowAndField) {
  const std::string lease_path = temp_db("unknown_lease_state");
  { Store create(lease_path); }
  execute(lease_path, R"SQL(INSERT INTO leases(id, state, team, user, ended_ms, body) VALUES (9, 'paused', 'team-cv',
    'alice', 0, '{"id":9,"request":{"team":"team-cv","user":"alice"},"state":"paused"}');)SQL");
  const std::string lease_error = load_error(lease_path);
  EXPECT_NE(lease_error.find(lease_path + ": table leases, row id 9, column body: state: 'paused' is not one of"),
            std::string::npos)
      << lease_error;

  const std::string approval_path = temp_db("unknown_approval_state");
  { Store create(approval_path); }
  execute(approval_path, R"SQL(INSERT INTO approvals(id, state, team, body) VALUES (4, 'withdrawn', 'team-cv',
    '{"id":4,"lease_id":1,"team":"team-cv","state":"withdrawn"}');)SQL");
  const std::string approval_error = load_error(approval_path);
  EXPECT_NE(
      approval_error.find(approval_path + ": table approvals, row id 4, column body: state: 'withdrawn' is not one of"),
      std::string::npos)
      << approval_error;
}

// A lease row whose JSON does not parse stops the load naming the table, the row id and the column;
// repair_database keeps a copy, sets the row aside whole and touches nothing else.
TEST(QuotaStore, ARowThatDoesNotParseIsNamedAndRepairSetsItAside) {
  const std::string path = temp_db("bad_json");
  { Store create(path); }
  execute(path, kOldRows);
  execute(path, R"SQL(INSERT INTO leases(id, state, team, user, ended_ms, body) VALUES (7, 'granted', 'team-cv',
    'alice', 0, '{"id":7,"request":{"team":"team-cv"},"state":"granted",');)SQL");
  const std::string error = load_error(path);
  EXPECT_NE(error.find(path + ": table leases, row id 7, column body: "), std::string::npos) << error;
  EXPECT_NE(error.find("parse error"), std::string::npos) << error;

  const RepairReport report = repair_database(path, kMonday);
  EXPECT_EQ(report.backup, path + ".bak-" + std::to_string(kMonday));
  ASSERT_EQ(report.quarantined.size(), 1u);
  EXPECT_EQ(report.quarantined[0].rfind("leases row 7: ", 0), 0u) << report.quarantined[0];
  EXPECT_TRUE(report.audit_gaps.empty());
  // the copy still has the bad row; the repaired file has it in quarantine, and everything else as before
  EXPECT_EQ(query_text(report.backup, "SELECT COUNT(*) FROM leases"), "3");
  EXPECT_EQ(query_text(path, "SELECT COUNT(*) FROM leases"), "2");
  EXPECT_EQ(query_text(path, "SELECT source || ':' || row_id FROM quarantine"), "leases:7");
  EXPECT_NE(query_text(path, "SELECT body FROM quarantine").find(R"("id":7)"), std::string::npos);
  Store store(path);
  const Snapshot snapshot = store.load(kMonday + kHour, 24 * kHour, 0);
  EXPECT_EQ(snapshot.leases.size(), 2u);
  EXPECT_EQ(snapshot.approvals.size(), 2u);
  EXPECT_EQ(snapshot.next_lease_id, 8) << "the quarantined id is never handed out again";
  std::filesystem::remove(report.backup);
}

// The open checks the state tables, not the heartbeat history (so that it takes the same time however long the
// history): a damaged history page lets the file open, and the replay that reads it fails naming the table rather
// than replaying a shorter history.
TEST(QuotaStore, ADamagedHistoryPageIsAnErrorWhereItIsRead) {
  const std::string path = temp_db("garbage_history_page");
  Engine engine(testing::example_policy());
  const int64_t id = engine.acquire(testing::lease_request("team-cv", "alice"), kMonday).lease_id;
  {
    Store store(path);
    store.write(engine, engine.take_changes());
    std::vector<HeartbeatSample> samples;
    Telemetry beat;
    beat.gpu_util = 0.5;
    for (int i = 0; i < 20000; ++i) samples.push_back({id, kMonday + i * 10000LL, beat});
    store.write_heartbeats(samples);
  }  // the last connection closes: the WAL is checkpointed into the file
  const int64_t page = std::stoll(
      query_text(path, "SELECT pageno FROM dbstat WHERE name = 'heartbeats' ORDER BY pageno LIMIT 1 OFFSET 20"));
  const int64_t page_size = std::stoll(query_text(path, "PRAGMA page_size"));
  {
    std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
    file.seekp((page - 1) * page_size);
    const std::string garbage(static_cast<size_t>(page_size), '\x5a');
    file.write(garbage.data(), static_cast<std::streamsize>(garbage.size()));
  }
  Store store(path);
  UtilTracker tracker(0.3, 60000);
  try {
    store.replay_heartbeats(engine, tracker);
    ADD_FAILURE() << "replayed a damaged history";
  } catch (const StoreError& error) {
    EXPECT_NE(std::string(error.what()).find(path + ": table heartbeats: "), std::string::npos) << error.what();
  }
}

// A file with a page of garbage is refused at open (before the fix quotad served on it).
TEST(QuotaStore, ADamagedFileIsRefusedAtOpen) {
  const std::string path = temp_db("garbage_page");
  {
    Store create(path);
    std::string rows = "BEGIN;";
    for (int i = 1; i <= 400; ++i) {
      rows += "INSERT INTO audit(seq, ts_ms, actor, action, lease_id, team, detail) VALUES (" + std::to_string(i) +
              ", 0, 'quotad', 'x', 0, 't', '" + std::string(200, 'd') + "');";
    }
    execute(path, rows + "COMMIT;");
  }  // the last connection closes: the WAL is checkpointed into the file
  ASSERT_GT(std::filesystem::file_size(path), 16u * 4096u);
  {
    std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(8 * 4096);  // a page in the middle of the audit table
    const std::string garbage(4096, '\x5a');
    file.write(garbage.data(), static_cast<std::streamsize>(garbage.size()));
  }
  try {
    Store store(path);
    ADD_FAILURE() << "opened a damaged file";
  } catch (const StoreError& error) {
    const std::string message = error.what();
    EXPECT_NE(message.find("damaged"), std::string::npos) << message;
    EXPECT_NE(message.find("quick_check"), std::string::npos) << message;
  }
  // without a backup, repair-db keeps what the file still yields and records what it lost
  const RepairReport report = repair_database(path, kMonday);
  EXPECT_TRUE(report.restored_from.empty());
  ASSERT_FALSE(report.salvaged.empty());
  EXPECT_GT(std::stoi(query_text(path, "SELECT COUNT(*) FROM audit WHERE action = 'x'")), 300);
  // what the damaged page held is recorded as lost, so the sequence has no silent hole
  EXPECT_EQ(query_text(path, "SELECT COUNT(*) FROM audit WHERE seq < 2000000000"),
            query_text(path, "SELECT MAX(seq) FROM audit WHERE seq < 2000000000"));
  EXPECT_EQ(report.id_epoch, 2 * kIdEpochSpan);  // rebuilt: what the lost page held may have named ids
  EXPECT_NO_THROW(Store reopened(path));
  for (const auto& entry : std::filesystem::directory_iterator(std::filesystem::path(path).parent_path())) {
    if (entry.path().string().rfind(path + ".bak-", 0) == 0) std::filesystem::remove(entry.path());
  }
}

// A hole in the audit sequence stops the load naming the first missing entry; repair records it.
TEST(QuotaStore, AnAuditGapIsFoundAtStartAndRecordedByRepair) {
  const std::string path = temp_db("audit_gap");
  { Store create(path); }
  execute(path,
          "INSERT INTO audit(seq, ts_ms, actor, action, lease_id, team, detail) VALUES "
          "(1, 0, 'a', 'x', 0, 't', ''), (2, 0, 'a', 'x', 0, 't', ''), (4, 0, 'a', 'x', 0, 't', ''), "
          "(5, 0, 'a', 'x', 0, 't', '');");
  const std::string error = load_error(path);
  EXPECT_NE(error.find("table audit: the sequence has a gap: entry 3 is missing"), std::string::npos) << error;
  const RepairReport report = repair_database(path, kMonday);
  EXPECT_EQ(report.audit_gaps, std::vector<int64_t>{3});
  EXPECT_EQ(query_text(path, "SELECT action FROM audit WHERE seq = 3"), "audit.gap");
  Store store(path);
  EXPECT_EQ(store.load(kMonday, 24 * kHour, 0).next_audit_seq, 6);
  std::filesystem::remove(report.backup);
}

TEST(QuotaStore, LoansAndGrantsRoundTripAndABadLoanRowIsSetAsideWithoutReusingItsId) {
  const std::string db = temp_db("ledger_store");
  const int64_t now = kMonday + 9 * kHour;
  {
    Engine engine(testing::example_policy());
    Store store(db);
    engine.apply_loan("alice", 10, "first", now);
    engine.apply_loan("bob", 5, "second", now);
    engine.grant_credits("alice", 3, "tool", "carol", now);
    store.write(engine, engine.take_changes());
  }
  {
    Store store(db);
    const Snapshot snapshot = store.load(now, kHour, 10);
    ASSERT_EQ(snapshot.loans.size(), 2u);
    EXPECT_EQ(snapshot.loans[1].justification, "second");
    ASSERT_EQ(snapshot.grants.size(), 1u);
    EXPECT_EQ(snapshot.grants[0].granted_by, "carol");
    EXPECT_EQ(snapshot.next_loan_id, 3);
  }
  execute(db, "UPDATE loans SET body = '{\"id\": 2, \"state\": \"forgiven\"}' WHERE id = 2");
  {
    Store store(db);
    try {
      store.load(now, kHour, 10);
      ADD_FAILURE() << "a bad loan row loaded";
    } catch (const StoreError& error) {
      EXPECT_NE(std::string(error.what()).find("table loans, row id 2"), std::string::npos) << error.what();
    }
  }
  const RepairReport report = repair_database(db, now);
  ASSERT_EQ(report.quarantined.size(), 1u);
  EXPECT_EQ(report.quarantined[0].rfind("loans row 2", 0), 0u) << report.quarantined[0];
  Store store(db);
  Snapshot snapshot = store.load(now, kHour, 10);
  EXPECT_EQ(snapshot.loans.size(), 1u);
  EXPECT_EQ(snapshot.next_loan_id, 3);  // 2 stays taken by the quarantined row
  Engine engine(testing::example_policy());
  engine.restore_ledger(snapshot.loans, snapshot.grants, snapshot.next_loan_id, snapshot.next_grant_id);
  EXPECT_EQ(engine.apply_loan("bob", 5, "again", now).id, 3);
  for (const char* suffix : {"", "-wal"}) std::filesystem::remove(report.backup + suffix);
}

}  // namespace
}  // namespace yolo8::quota

namespace yolo8::quota {
namespace {

// The LibTorch version goes with each observation; a database written before the column existed gains it at
// open, its older rows reading as "no version".
TEST(QuotaStore, MemoryObservationsKeepTheLibtorchVersionAlsoOnAnOlderDatabase) {
  const std::string path = temp_db("memory_observations_libtorch");
  execute(path,
          "CREATE TABLE memory_observations (lease_id INTEGER NOT NULL, ts_ms INTEGER NOT NULL, model TEXT NOT "
          "NULL, imgsz INTEGER NOT NULL, batch INTEGER NOT NULL, amp INTEGER NOT NULL, device TEXT NOT NULL, "
          "peak_gib REAL NOT NULL);"
          "INSERT INTO memory_observations VALUES (1, 1000, 'yolov8n', 640, 8, 0, 'cpu', 2.0);");
  Store store(path);
  Telemetry beat;
  beat.memory_used_gib = 4.0;
  beat.model = "yolov8n";
  beat.imgsz = 640;
  beat.batch = 16;
  beat.amp = 0;
  beat.device_name = "cpu";
  beat.libtorch = "2.1.2";
  store.write_heartbeats({{2, 2000, beat}});
  const std::vector<MemoryObservation> seen = store.memory_observations();
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0].libtorch, "");
  EXPECT_EQ(seen[0].batch, 8);
  EXPECT_EQ(seen[1].libtorch, "2.1.2");
  EXPECT_EQ(seen[1].batch, 16);
}

// A restarted quotad still says where a running lease's utilisation came from (the metric's `source` label),
// also on a database whose heartbeats table predates the two columns.
TEST(QuotaStore, TheUtilisationSourceOfTheLastHeartbeatSurvivesARestart) {
  for (const bool old_schema : {false, true}) {
    const std::string path = temp_db(old_schema ? "source_old_schema" : "source");
    if (old_schema) {
      execute(path,
              "CREATE TABLE heartbeats (lease_id INTEGER NOT NULL, ts_ms INTEGER NOT NULL, step INTEGER, epoch "
              "INTEGER, gpu_util REAL, memory_used_gib REAL, last_checkpoint_ms INTEGER);"
              "INSERT INTO heartbeats VALUES (7, 1, 1, 0, 0.5, 1.0, 0);");
    }
    Engine engine(testing::example_policy());
    LeaseRequest request;
    request.team = "team-cv";
    request.user = "alice";
    const int64_t id = engine.acquire(request, kMonday).lease_id;
    Telemetry beat;
    beat.gpu_util = 0.75;
    beat.gpu_util_source = "nvml";
    beat.device_memory_used_gib = 12.5;
    {
      Store store(path);
      store.write(engine, engine.take_changes());
      store.write_heartbeats({{id, kMonday + 1000, beat}});
    }
    Store reopened(path);
    const Snapshot snapshot = reopened.load(kMonday + 2000, 24 * kHour, 0);
    ASSERT_EQ(snapshot.leases.size(), 1u) << (old_schema ? "old schema" : "new schema");
    EXPECT_EQ(snapshot.leases[0].telemetry.gpu_util_source, "nvml");
    EXPECT_DOUBLE_EQ(snapshot.leases[0].telemetry.device_memory_used_gib, 12.5);
    EXPECT_DOUBLE_EQ(snapshot.leases[0].telemetry.gpu_util, 0.75);
  }
}

// The process's own GPU memory (NVML per PID) of the last heartbeat comes back after a restart: on a fresh
// database, on one whose heartbeats table predates every newer column, and on one that has the device's column but
// not the process's (the column is added at open; older rows read as unknown).
TEST(QuotaStore, TheProcessGpuMemoryOfTheLastHeartbeatSurvivesARestart) {
  for (const char* schema : {"new", "oldest", "device_only"}) {
    const std::string path = temp_db(std::string("process_memory_") + schema);
    if (std::string(schema) == "oldest") {
      execute(path,
              "CREATE TABLE heartbeats (lease_id INTEGER NOT NULL, ts_ms INTEGER NOT NULL, step INTEGER, epoch "
              "INTEGER, gpu_util REAL, memory_used_gib REAL, last_checkpoint_ms INTEGER);");
    } else if (std::string(schema) == "device_only") {
      execute(path,
              "CREATE TABLE heartbeats (lease_id INTEGER NOT NULL, ts_ms INTEGER NOT NULL, step INTEGER, epoch "
              "INTEGER, gpu_util REAL, memory_used_gib REAL, last_checkpoint_ms INTEGER, gpu_util_source TEXT, "
              "device_memory_used_gib REAL);");
    }
    Engine engine(testing::example_policy());
    LeaseRequest request;
    request.team = "team-cv";
    request.user = "alice";
    request.model = "yolov8n";
    request.shared = true;
    request.memory_gib = 10;
    const int64_t id = engine.acquire(request, kMonday).lease_id;
    Telemetry beat;
    beat.device_memory_used_gib = 31.5;
    beat.process_memory_used_gib = 10.75;
    {
      Store store(path);
      store.write(engine, engine.take_changes());
      store.write_heartbeats({{id, kMonday + 1000, beat}});
    }
    Store reopened(path);
    const Snapshot snapshot = reopened.load(kMonday + 2000, 24 * kHour, 0);
    ASSERT_EQ(snapshot.leases.size(), 1u) << schema;
    EXPECT_DOUBLE_EQ(snapshot.leases[0].telemetry.process_memory_used_gib, 10.75) << schema;
    EXPECT_DOUBLE_EQ(snapshot.leases[0].telemetry.device_memory_used_gib, 31.5) << schema;
  }
  // a row written before the column existed reads as unknown
  const std::string path = temp_db("process_memory_old_row");
  execute(path,
          "CREATE TABLE heartbeats (lease_id INTEGER NOT NULL, ts_ms INTEGER NOT NULL, step INTEGER, epoch "
          "INTEGER, gpu_util REAL, memory_used_gib REAL, last_checkpoint_ms INTEGER, gpu_util_source TEXT, "
          "device_memory_used_gib REAL);"
          "INSERT INTO heartbeats VALUES (1, 1000, 5, 0, 0.5, 2.0, 0, 'nvml', 12.5);");
  Engine engine(testing::example_policy());
  LeaseRequest request;
  request.team = "team-cv";
  request.user = "alice";
  ASSERT_EQ(engine.acquire(request, kMonday).lease_id, 1);
  {
    Store store(path);
    store.write(engine, engine.take_changes());
  }
  Store reopened(path);
  const Snapshot snapshot = reopened.load(kMonday + 2000, 24 * kHour, 0);
  ASSERT_EQ(snapshot.leases.size(), 1u);
  EXPECT_DOUBLE_EQ(snapshot.leases[0].telemetry.device_memory_used_gib, 12.5);
  EXPECT_DOUBLE_EQ(snapshot.leases[0].telemetry.process_memory_used_gib, -1);
}

// ---------------------------------------------------------------------------------------------------------
// The audit log's hash chain: with the append-only triggers dropped, a deleted or edited entry is named.

AuditEntry entry(int64_t seq, const std::string& detail) {
  AuditEntry e;
  e.seq = seq;
  e.ts_ms = kMonday + seq * 1000;
  e.actor = "alice";
  e.action = "lease.granted";
  e.lease_id = seq;
  e.team = "team-cv";
  e.detail = detail;
  return e;
}

// Entries 1..n written through the Store, in two transactions (the head carries over).
std::string chained_db(const std::string& name, int64_t n) {
  const std::string path = temp_db(name);
  Store store(path);
  const Engine engine(testing::example_policy());
  Changes first, second;
  for (int64_t seq = 1; seq <= n; ++seq)
    (seq <= n / 2 ? first : second).audit.push_back(entry(seq, "entry " + std::to_string(seq)));
  store.write(engine, first);
  store.write(engine, second);
  return path;
}

constexpr const char* kDropTriggers = "DROP TRIGGER audit_no_update; DROP TRIGGER audit_no_delete;";

TEST(QuotaAuditChain, AnUntouchedLogVerifiesAndItsHeadIsTheLastEntry) {
  const std::string path = chained_db("chain_ok", 6);
  const AuditChainCheck check = verify_audit_chain(path);
  EXPECT_TRUE(check.intact) << check.problem;
  EXPECT_EQ(check.entries, 6);
  EXPECT_EQ(check.head_seq, 6);
  EXPECT_EQ(check.head, query_text(path, "SELECT chain FROM audit WHERE seq = 6"));
  EXPECT_EQ(query_text(path, "SELECT value FROM meta WHERE key = 'audit_head'"), "6 " + check.head);
  // each link is the previous one and the entry's content
  std::string link;
  for (int64_t seq = 1; seq <= 6; ++seq) link = audit_chain_link(link, entry(seq, "entry " + std::to_string(seq)));
  EXPECT_EQ(link, check.head);
}

TEST(QuotaAuditChain, DeletingTheLastEntryIsNamed) {
  const std::string path = chained_db("chain_last", 6);
  execute(path, std::string(kDropTriggers) + "DELETE FROM audit WHERE seq = 6;");
  const AuditChainCheck check = verify_audit_chain(path);
  EXPECT_FALSE(check.intact);
  EXPECT_EQ(check.broken_seq, 6);
  EXPECT_NE(check.problem.find("the last entries were deleted"), std::string::npos) << check.problem;
}

TEST(QuotaAuditChain, DeletingAMiddleOrTheFirstEntryIsNamed) {
  std::string path = chained_db("chain_middle", 6);
  execute(path, std::string(kDropTriggers) + "DELETE FROM audit WHERE seq = 3;");
  AuditChainCheck check = verify_audit_chain(path);
  EXPECT_FALSE(check.intact);
  EXPECT_EQ(check.broken_seq, 3);
  path = chained_db("chain_first", 6);
  execute(path, std::string(kDropTriggers) + "DELETE FROM audit WHERE seq = 1;");
  check = verify_audit_chain(path);
  EXPECT_EQ(check.broken_seq, 1);
  // renumbering the rest to hide the gap breaks every link after it
  path = chained_db("chain_renumbered", 6);
  execute(path, std::string(kDropTriggers) +
                    "DELETE FROM audit WHERE seq = 3; UPDATE audit SET seq = seq - 1 WHERE seq > 3;");
  check = verify_audit_chain(path);
  EXPECT_EQ(check.broken_seq, 3);
  EXPECT_NE(check.problem.find("does not match"), std::string::npos) << check.problem;
}

TEST(QuotaAuditChain, EditingAnEntryIsNamedEvenWithItsLinkRecomputed) {
  std::string path = chained_db("chain_edit", 6);
  execute(path, std::string(kDropTriggers) + "UPDATE audit SET detail = 'nothing happened' WHERE seq = 4;");
  AuditChainCheck check = verify_audit_chain(path);
  EXPECT_FALSE(check.intact);
  EXPECT_EQ(check.broken_seq, 4);
  EXPECT_EQ(check.problem, "entry 4: its hash does not match: the entry, or the one before it, was changed");
  // an editor who recomputes entry 4's link leaves entry 5's pointing at the old one
  path = chained_db("chain_edit_relinked", 6);
  const std::string link3 = query_text(path, "SELECT chain FROM audit WHERE seq = 3");
  const std::string forged = audit_chain_link(link3, entry(4, "nothing happened"));
  execute(path, std::string(kDropTriggers) + "UPDATE audit SET detail = 'nothing happened', chain = '" + forged +
                    "' WHERE seq = 4;");
  check = verify_audit_chain(path);
  EXPECT_EQ(check.broken_seq, 5);
  // and one who relinks to the end must also rewrite the head quotad keeps (and exports as a metric)
  path = chained_db("chain_edit_last", 6);
  const std::string link5 = query_text(path, "SELECT chain FROM audit WHERE seq = 5");
  execute(path, std::string(kDropTriggers) + "UPDATE audit SET detail = 'x', chain = '" +
                    audit_chain_link(link5, entry(6, "x")) + "' WHERE seq = 6;");
  check = verify_audit_chain(path);
  EXPECT_EQ(check.broken_seq, 6);
  EXPECT_NE(check.problem.find("recorded head"), std::string::npos) << check.problem;
}

TEST(QuotaAuditChain, EntriesOfAnOlderQuotadAreCountedAndTheChainStartsAfterThem) {
  const std::string path = temp_db("chain_older");
  { Store create(path); }
  // as a quotad before the chain wrote them: no link
  execute(path,
          "INSERT INTO audit(seq, ts_ms, actor, action, lease_id, team, detail) VALUES "
          "(1, 0, 'a', 'x', 0, 't', ''), (2, 0, 'a', 'x', 0, 't', '');");
  {
    Store store(path);
    Changes changes;
    changes.audit = {entry(3, "new"), entry(4, "newer")};
    store.write(Engine(testing::example_policy()), changes);
  }
  AuditChainCheck check = verify_audit_chain(path);
  EXPECT_TRUE(check.intact) << check.problem;
  EXPECT_EQ(check.unchained, 2);
  EXPECT_EQ(check.head_seq, 4);
  // a row slipped in after the chain began has no link
  execute(path,
          "INSERT INTO audit(seq, ts_ms, actor, action, lease_id, team, detail) VALUES (5, 0, 'a', 'x', 0, 't', '');");
  check = verify_audit_chain(path);
  EXPECT_EQ(check.broken_seq, 5);
  EXPECT_NE(check.problem.find("has no hash"), std::string::npos) << check.problem;
}

TEST(QuotaAuditChain, TheCommandNamesTheBrokenEntryAndFails) {
  const std::string path = chained_db("chain_cli", 4);
  const std::string quotad = std::string(yolo8::test::kBinaryDir) + "/quota/quotad";
  const std::string out = path + ".out";
  EXPECT_EQ(std::system((quotad + " audit --verify --db " + path + " > " + out).c_str()), 0);
  std::ifstream intact(out);
  std::string line;
  std::getline(intact, line);
  EXPECT_NE(line.find("4 entries, chain intact; head: entry 4 sha256 "), std::string::npos) << line;
  execute(path, std::string(kDropTriggers) + "DELETE FROM audit WHERE seq = 4;");
  EXPECT_NE(std::system((quotad + " audit --verify --db " + path + " > " + out).c_str()), 0);
  std::ifstream broken(out);
  std::getline(broken, line);
  EXPECT_NE(line.find("the chain is broken at entry 4: missing"), std::string::npos) << line;
}

// ---------------------------------------------------------------------------------------------------------
// Online backups and the repair that uses them.

void add_audit_rows(const std::string& path, int from, int to) {
  std::string rows = "BEGIN;";
  for (int i = from; i <= to; ++i) {
    rows += "INSERT INTO audit(seq, ts_ms, actor, action, lease_id, team, detail) VALUES (" + std::to_string(i) +
            ", 0, 'quotad', 'x', 0, 't', '" + std::string(200, 'd') + "');";
  }
  execute(path, rows + "COMMIT;");
}

void remove_copies(const std::string& path) {
  for (const auto& entry : std::filesystem::directory_iterator(std::filesystem::path(path).parent_path())) {
    const std::string name = entry.path().string();
    if (name.rfind(path + ".", 0) == 0) std::filesystem::remove(entry.path());
  }
}

TEST(QuotaBackup, AnOnlineBackupIsAConsistentCopyAndOnlyTheNewestAreKept) {
  const std::string path = temp_db("backup_keep");
  remove_copies(path);
  Store live(path);  // open, as quotad keeps it
  add_audit_rows(path, 1, 50);
  std::vector<std::string> made;
  for (int i = 0; i < 3; ++i) made.push_back(backup_database(path, kMonday + i * 60000, 2));
  EXPECT_EQ(made[0], path + ".backup-20261130T000000.000Z");  // kMonday
  EXPECT_FALSE(std::filesystem::exists(made[0]));             // pruned: two kept
  const std::vector<std::string> good = good_backups(path);
  ASSERT_EQ(good, (std::vector<std::string>{made[2], made[1]}));
  EXPECT_EQ(query_text(good[0], "SELECT COUNT(*) FROM audit"), "50");
  remove_copies(path);
}

// A damaged page: the newest backup, plus every row the damaged file still yields (newer than the backup).
TEST(QuotaBackup, RepairRebuildsADamagedFileFromTheBackupAndWhatTheFileStillYields) {
  const std::string path = temp_db("backup_damaged");
  remove_copies(path);
  { Store create(path); }
  add_audit_rows(path, 1, 400);
  backup_database(path, kMonday, 24);
  add_audit_rows(path, 401, 600);
  {
    std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(8 * 4096);  // a page holding early entries, which the backup has
    const std::string garbage(4096, '\x5a');
    file.write(garbage.data(), static_cast<std::streamsize>(garbage.size()));
  }
  ASSERT_THROW(Store refused(path), StoreError);
  const RepairReport report = repair_database(path, kMonday + kHour);
  EXPECT_EQ(report.restored_from, path + ".backup-20261130T000000.000Z");
  ASSERT_FALSE(report.salvaged.empty());
  EXPECT_TRUE(report.audit_gaps.empty()) << "nothing lost: the backup held what the damaged page did";
  // rebuilt: the ids continue in a new epoch, the entries in between declared lost by one entry
  EXPECT_EQ(report.id_epoch, 2 * kIdEpochSpan);
  EXPECT_EQ(report.lost_entries, "entries 601 to 1999999999");
  EXPECT_EQ(query_text(path, "SELECT COUNT(*) FROM audit WHERE seq <= 600"), "600");
  EXPECT_EQ(query_text(path, "SELECT action FROM audit WHERE seq = 2000000000"), "audit.gap");
  Store repaired(path);
  EXPECT_EQ(repaired.load(kMonday, 24 * kHour, 0).next_audit_seq, 2 * kIdEpochSpan + 1);
  remove_copies(path);
}

// Debian's sqlite3 3.40 has no `.recover`: the README's old step left an empty file, which repair-db called
// "nothing to repair" and quotad then served as a fresh database.
TEST(QuotaBackup, AnEmptyFileIsRestoredFromABackupAndNeverRepairedIntoAFreshDatabase) {
  const std::string path = temp_db("backup_empty");
  remove_copies(path);
  { Store create(path); }
  add_audit_rows(path, 1, 20);
  std::ofstream(path, std::ios::trunc).close();
  for (const char* suffix : {"-wal", "-shm"}) std::filesystem::remove(path + suffix);
  try {
    repair_database(path, kMonday);
    ADD_FAILURE() << "repaired an empty file without a backup";
  } catch (const StoreError& error) {
    EXPECT_NE(std::string(error.what()).find("refusing to repair it into a fresh database"), std::string::npos)
        << error.what();
  }
  EXPECT_EQ(std::filesystem::file_size(path), 0u);  // left as it was
  // with a backup taken while it was whole
  const std::string whole = temp_db("backup_empty_source");
  remove_copies(whole);
  { Store create(whole); }
  add_audit_rows(whole, 1, 20);
  const std::string backup = backup_database(whole, kMonday, 24);
  std::filesystem::rename(backup, path + ".backup-20261130T000000.000Z");
  const RepairReport report = repair_database(path, kMonday + kHour);
  EXPECT_EQ(report.restored_from, path + ".backup-20261130T000000.000Z");
  EXPECT_EQ(query_text(path, "SELECT COUNT(*) FROM audit WHERE seq <= 20"), "20");
  EXPECT_EQ(report.id_epoch, 2 * kIdEpochSpan);
  remove_copies(path);
  remove_copies(whole);
}

TEST(QuotaBackup, TheCommandsTakeABackupAndRepairFromIt) {
  const std::string path = temp_db("backup_cli");
  remove_copies(path);
  { Store create(path); }
  add_audit_rows(path, 1, 10);
  const std::string quotad = std::string(yolo8::test::kBinaryDir) + "/quota/quotad";
  const std::string out = path + ".out";
  ASSERT_EQ(std::system((quotad + " backup --db " + path + " > " + out).c_str()), 0);
  std::string line;
  std::getline(std::ifstream(out) >> std::ws, line);
  EXPECT_EQ(line.rfind("quotad backup: " + path + ".backup-", 0), 0u) << line;
  std::ofstream(path, std::ios::trunc).close();
  for (const char* suffix : {"-wal", "-shm"}) std::filesystem::remove(path + suffix);
  ASSERT_EQ(std::system((quotad + " repair-db --db " + path + " > " + out).c_str()), 0);
  std::ifstream report(out);
  const std::string text((std::istreambuf_iterator<char>(report)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("restored from the backup " + path + ".backup-"), std::string::npos) << text;
  EXPECT_NE(text.find("ids continue at 2000000000"), std::string::npos) << text;
  EXPECT_EQ(query_text(path, "SELECT COUNT(*) FROM audit WHERE seq <= 10"), "10");
  remove_copies(path);
}

// The engine as quotad builds it from its database at start.
Engine loaded_engine(Store& store, int64_t now_ms) {
  Engine engine(testing::example_policy());
  Snapshot snapshot = store.load(now_ms, 24 * kHour, 10000);
  engine.restore(std::move(snapshot.leases), std::move(snapshot.approvals), std::move(snapshot.audit),
                 std::move(snapshot.usage), snapshot.next_audit_seq, now_ms);
  engine.reserve_ids(snapshot.next_lease_id, snapshot.next_approval_id);
  engine.restore_ledger(std::move(snapshot.loans), std::move(snapshot.grants), snapshot.next_loan_id,
                        snapshot.next_grant_id);
  store.write(engine, engine.take_changes());
  return engine;
}

// Ids of one engine session: a lease, a loan and a grant.
struct HandedOut {
  int64_t lease = 0;
  int64_t loan = 0;
  int64_t grant = 0;
};

HandedOut hand_out(Engine& engine, Store& store, int64_t now_ms, bool loan = true) {
  HandedOut ids;
  const AcquireResult granted = engine.acquire(testing::lease_request("team-robotics", "erin"), now_ms);
  EXPECT_EQ(granted.kind, AcquireResult::Kind::kGranted) << granted.reason;
  ids.lease = granted.lease_id;
  if (loan) ids.loan = engine.apply_loan("alice", 1, "restore", now_ms).id;  // two a month
  ids.grant = engine.grant_credits("alice", 1, "restore", "carol", now_ms).id;
  store.write(engine, engine.take_changes());
  return ids;
}

// A backup, then five more grants, then the file gone: repair-db restores the backup, and no id of any kind handed
// out after it comes again; one chained entry declares the audit entries lost, and verify names it.
TEST(QuotaRestore, ADeletedDatabaseComesBackFromItsBackupAndNoIdIsHandedOutTwice) {
  const std::string path = temp_db("restore_deleted");
  remove_copies(path);
  const int64_t now = kMonday + 13 * kHour;
  HandedOut last;
  std::string key;
  {
    Store store(path);
    Engine engine = loaded_engine(store, now);
    hand_out(engine, store, now);
    key = store.receipt_key();
    backup_database(path, now, 24);
    for (int i = 0; i < 5; ++i) last = hand_out(engine, store, now + kMinute, i == 0);
  }
  EXPECT_EQ(key.size(), kReceiptKeyBytes);
  ASSERT_EQ(last.lease, 6);
  for (const char* suffix : {"", "-wal", "-shm"}) std::filesystem::remove(path + suffix);

  try {
    prepare_database(path, false, now + kHour);
    ADD_FAILURE() << "an empty database would have been created beside the backup";
  } catch (const StoreError& error) {
    EXPECT_NE(std::string(error.what()).find("quotad repair-db --db " + path), std::string::npos) << error.what();
    EXPECT_NE(std::string(error.what()).find("--init"), std::string::npos) << error.what();
  }
  EXPECT_FALSE(std::filesystem::exists(path));

  const RepairReport report = repair_database(path, now + kHour);
  EXPECT_EQ(report.restored_from, path + ".backup-20261130T130000.000Z");
  EXPECT_EQ(report.backup, "");  // nothing to copy
  EXPECT_EQ(report.id_epoch, 2 * kIdEpochSpan);
  EXPECT_TRUE(report.unrecorded.empty()) << report.unrecorded.front();
  {
    Store store(path);
    Engine engine = loaded_engine(store, now + kHour);
    EXPECT_EQ(engine.find(last.lease), nullptr) << "a lease granted after the backup is unknown, not someone else's";
    // the receipts signed before the restore still verify: the key came back with the backup
    EXPECT_EQ(store.receipt_key(), key);
    EXPECT_FALSE(store.lease_recorded(last.lease));
    EXPECT_TRUE(store.lease_recorded(1));
    const HandedOut next = hand_out(engine, store, now + kHour);
    EXPECT_EQ(next.lease, 2 * kIdEpochSpan);
    EXPECT_EQ(next.loan, 2 * kIdEpochSpan);
    EXPECT_EQ(next.grant, 2 * kIdEpochSpan);
    EXPECT_GT(engine.audit().back().seq, 2 * kIdEpochSpan);
  }
  const AuditChainCheck check = verify_audit_chain(path);
  EXPECT_TRUE(check.intact) << check.problem;
  ASSERT_EQ(check.recorded_gaps.size(), 1u);
  EXPECT_EQ(check.recorded_gaps[0].rfind("entries ", 0), 0u) << check.recorded_gaps[0];
  EXPECT_NE(check.recorded_gaps[0].find("the database was missing; restored from " +
                                        std::filesystem::path(report.restored_from).filename().string() +
                                        " (taken 2026-11-30 13:00:00 UTC)"),
            std::string::npos)
      << check.recorded_gaps[0];
  // a second repair of the healthy file: the declared range is no hole, and no new epoch
  const RepairReport again = repair_database(path, now + 2 * kHour);
  EXPECT_TRUE(again.audit_gaps.empty());
  EXPECT_EQ(again.id_epoch, 0);
  Store store(path);
  EXPECT_EQ(store.load(now + 2 * kHour, kHour, 0).next_lease_id, 2 * kIdEpochSpan + 1);
  for (const char* suffix : {"", "-wal"}) std::filesystem::remove(again.backup + suffix);
  remove_copies(path);
}

TEST(QuotaRestore, AMissingDatabaseIsCreatedOnlyWithoutBackupsOrWithInitAndThenAboveTheirIds) {
  const std::string path = temp_db("restore_init");
  remove_copies(path);
  for (const char* suffix : {"", "-wal", "-shm"}) std::filesystem::remove(path + suffix);
  prepare_database(path, false, kMonday);  // a first start: serve creates it
  EXPECT_FALSE(std::filesystem::exists(path));
  {
    Store store(path);
    execute(path, "INSERT OR REPLACE INTO meta(key, value) VALUES ('next_lease_id', '1500000001')");
  }
  backup_database(path, kMonday, 24);
  for (const char* suffix : {"", "-wal", "-shm"}) std::filesystem::remove(path + suffix);
  EXPECT_THROW(prepare_database(path, false, kMonday + kHour), StoreError);
  prepare_database(path, true, kMonday + kHour);
  ASSERT_TRUE(std::filesystem::exists(path));
  {
    Store store(path);
    const Snapshot snapshot = store.load(kMonday + kHour, kHour, 10);
    EXPECT_EQ(snapshot.next_lease_id, 3 * kIdEpochSpan);  // at least a span above the backup's 1,500,000,000
    EXPECT_EQ(snapshot.next_approval_id, 3 * kIdEpochSpan);
  }
  EXPECT_TRUE(verify_audit_chain(path).intact);
  prepare_database(path, true, kMonday + 2 * kHour);  // an existing database is left as it is
  EXPECT_EQ(Store(path).load(kMonday + 2 * kHour, kHour, 10).next_lease_id, 3 * kIdEpochSpan);
  remove_copies(path);
}

TEST(QuotaRestore, NextIdEpochIsAtLeastASpanAboveAndRound) {
  EXPECT_EQ(next_id_epoch(0), kIdEpochSpan);
  EXPECT_EQ(next_id_epoch(1), 2 * kIdEpochSpan);
  EXPECT_EQ(next_id_epoch(kIdEpochSpan - 1), 2 * kIdEpochSpan);
  EXPECT_EQ(next_id_epoch(kIdEpochSpan), 2 * kIdEpochSpan);
  EXPECT_EQ(next_id_epoch(kIdEpochSpan + 1), 3 * kIdEpochSpan);
}

// A damaged page can lose a loan the audit log still records as approved: repair-db names it.
TEST(QuotaRestore, RepairNamesEveryLeaseLoanAndGrantTheAuditRecordsButTheTablesLost) {
  const std::string path = temp_db("restore_unrecorded");
  remove_copies(path);
  const int64_t now = kMonday + 13 * kHour;
  HandedOut ids;
  {
    Store store(path);
    Engine engine = loaded_engine(store, now);
    ids = hand_out(engine, store, now);
    engine.decide_loan(ids.loan, true, "carol", "ok", now);
    store.write(engine, engine.take_changes());
  }
  execute(path, "DELETE FROM loans; DELETE FROM grants WHERE id = " + std::to_string(ids.grant) +
                    "; DELETE FROM leases WHERE id = " + std::to_string(ids.lease));
  const RepairReport report = repair_database(path, now + kHour);
  ASSERT_EQ(report.unrecorded.size(), 3u);
  EXPECT_EQ(report.unrecorded[0].rfind("lease 1: the audit log records it (lease.", 0), 0u) << report.unrecorded[0];
  EXPECT_EQ(report.unrecorded[1].rfind("loan 1: the audit log records it (loan.requested, entry ", 0), 0u)
      << report.unrecorded[1];
  EXPECT_EQ(report.unrecorded[2].rfind("grant 1: the audit log records it (credit.granted, entry ", 0), 0u)
      << report.unrecorded[2];
  for (const char* suffix : {"", "-wal"}) std::filesystem::remove(report.backup + suffix);
  remove_copies(path);
}

}  // namespace
}  // namespace yolo8::quota

namespace yolo8::quota {
namespace {

// What a Store wrote reads back through StoreReader, the reports' only way into the database: the leases of a
// window, the utilisation samples, the usage ledger, loans, grants and audit entries.
TEST(QuotaStoreReader, ReadsBackWhatTheStoreWrote) {
  const std::string path = temp_db("reader_round_trip");
  Engine engine(testing::example_policy());
  LeaseRequest request;
  request.team = "team-interns";
  request.user = "ivan";
  request.priority = Priority::kCritical;
  request.justification = "demo day";
  const int64_t early = engine.acquire(request, kMonday).lease_id;
  request.priority = Priority::kNormal;
  request.job = "late";
  const int64_t late = engine.acquire(request, kMonday).lease_id;
  request.job = "open";
  const int64_t open = engine.acquire(request, kMonday).lease_id;
  engine.release(early, Outcome::kCompleted, kMonday + kHour);
  engine.release(late, Outcome::kCompleted, kMonday + 3 * kHour);
  engine.review_emergency(early, "admin", kMonday + 4 * kHour, "justified");
  engine.apply_loan("alice", 10, "first", kMonday);
  engine.grant_credits("alice", 3, "tool", "carol", kMonday);
  Store store(path);
  store.write(engine, engine.take_changes());
  Telemetry busy, idle, unknown;
  busy.gpu_util = 0.9;
  idle.gpu_util = 0.1;
  unknown.gpu_util = -1;  // not reported: never a sample
  store.write_heartbeats({{late, kMonday + 2000, idle},
                          {open, kMonday + 1000, busy},
                          {late, kMonday + 1000, busy},
                          {open, kMonday + 1500, unknown},
                          {open, kMonday + 9000, busy}});
  const Snapshot snapshot = store.load(kMonday + 4 * kHour, 24 * kHour, 100);

  StoreReader reader(path);
  std::vector<int64_t> ids;
  for (const Lease& lease : reader.leases_since(kMonday + 2 * kHour)) ids.push_back(lease.id);
  EXPECT_EQ(ids, (std::vector<int64_t>{late, open}));  // `early` ended before the window
  EXPECT_EQ(reader.leases_since(0).size(), 3u);

  std::vector<std::tuple<int64_t, int64_t, double>> samples;
  reader.util_samples(kMonday, kMonday + 5000, [&](int64_t lease_id, int64_t ts_ms, double util) {
    samples.emplace_back(lease_id, ts_ms, util);
  });
  using Sample = std::tuple<int64_t, int64_t, double>;
  ASSERT_LT(late, open);
  EXPECT_EQ(samples, (std::vector<Sample>{Sample{late, kMonday + 1000, 0.9}, Sample{late, kMonday + 2000, 0.1},
                                          Sample{open, kMonday + 1000, 0.9}}));
  samples.clear();
  reader.util_samples_of(
      open, [&](int64_t lease_id, int64_t ts_ms, double util) { samples.emplace_back(lease_id, ts_ms, util); });
  EXPECT_EQ(samples, (std::vector<Sample>{Sample{open, kMonday + 1000, 0.9}, Sample{open, kMonday + 9000, 0.9}}));

  ASSERT_FALSE(snapshot.usage.empty());
  EXPECT_EQ(reader.usage(), snapshot.usage);
  const std::string month = snapshot.usage.begin()->first.second;
  EXPECT_EQ(reader.usage({month}), snapshot.usage);
  EXPECT_TRUE(reader.usage({"1999-01"}).empty());

  ASSERT_EQ(reader.loans().size(), 1u);
  EXPECT_EQ(reader.loans()[0].justification, "first");
  ASSERT_EQ(reader.grants().size(), 1u);
  EXPECT_EQ(reader.grants()[0].granted_by, "carol");

  const std::vector<AuditEntry> reviews = reader.audit("emergency.reviewed");
  ASSERT_EQ(reviews.size(), 1u);
  EXPECT_EQ(reviews[0].lease_id, early);
  EXPECT_EQ(reviews[0].actor, "admin");
  const std::vector<AuditEntry> all = reader.audit();
  ASSERT_GT(all.size(), 1u);
  EXPECT_EQ(all.front().seq, 1);
  EXPECT_EQ(reader.audit("", all.front().seq).size(), all.size() - 1);
}

// A database from before the ledger has no loans or grants tables: nothing was lent or granted.
TEST(QuotaStoreReader, ADatabaseOlderThanTheLedgerHasNoLoansOrGrants) {
  const std::string path = temp_db("reader_before_ledger");
  { Store create(path); }
  execute(path, "DROP TABLE loans; DROP TABLE grants;");
  StoreReader reader(path);
  EXPECT_TRUE(reader.loans().empty());
  EXPECT_TRUE(reader.grants().empty());
}

// Errors name the file, and for a record that does not parse the table and row.
TEST(QuotaStoreReader, ErrorsNameTheFileAndTheBadRow) {
  const std::string missing = temp_db("reader_missing");
  try {
    StoreReader reader(missing);
    ADD_FAILURE() << "opened a database that does not exist";
  } catch (const StoreError& error) {
    EXPECT_NE(std::string(error.what()).find(missing), std::string::npos) << error.what();
  }
  EXPECT_FALSE(std::filesystem::exists(missing));  // read-only: never created

  const std::string path = temp_db("reader_bad_row");
  { Store create(path); }
  execute(path, kOldRows);
  execute(path, "UPDATE leases SET body = '{\"id\": 2, \"state\": \"sleeping\"}' WHERE id = 2");
  try {
    StoreReader(path).leases_since(0);
    ADD_FAILURE() << "a bad lease row was read";
  } catch (const StoreError& error) {
    EXPECT_NE(std::string(error.what()).find(path + ": table leases, row id 2"), std::string::npos) << error.what();
  }
}

// The backup cadence is kept across restarts: the next backup is due `every` after the newest one beside the
// database (its time is in its name), at once when that is overdue or there is none.
TEST(QuotaBackup, TheNextBackupIsDueFromTheNewestOneBesideTheDatabase) {
  const std::string db = testing::temp_db("backup_cadence");
  const auto remove_backups = [&] {
    const std::filesystem::path file(db);
    for (const auto& entry : std::filesystem::directory_iterator(file.parent_path())) {
      if (entry.path().filename().string().rfind(file.filename().string() + ".backup-", 0) == 0) {
        std::filesystem::remove(entry.path());
      }
    }
  };
  remove_backups();
  const int64_t now = 1796400000000;  // 2026-12-04T...Z
  const int64_t hour = 3600 * 1000;
  EXPECT_EQ(next_backup_in_ms(db, hour, now), 0);  // none: at once
  EXPECT_EQ(newest_backup_ms(db), -1);
  const auto touch = [&](int64_t taken_ms) {
    const std::time_t seconds = static_cast<std::time_t>(taken_ms / 1000);
    std::tm tm{};
    gmtime_r(&seconds, &tm);
    char stamp[32];
    std::strftime(stamp, sizeof stamp, "%Y%m%dT%H%M%S", &tm);
    std::ofstream(db + ".backup-" + stamp + ".000Z") << "x";
  };
  touch(now - 3 * hour);
  EXPECT_EQ(next_backup_in_ms(db, hour, now), 0);  // overdue
  touch(now - 10 * 60 * 1000);
  EXPECT_EQ(next_backup_in_ms(db, hour, now), 50 * 60 * 1000);          // the newest decides
  EXPECT_EQ(newest_backup_ms(db), now / 1000 * 1000 - 10 * 60 * 1000);  // the name keeps whole seconds here
  remove_backups();
}

}  // namespace
}  // namespace yolo8::quota
