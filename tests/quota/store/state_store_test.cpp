#include "quota/store/state_store.h"

#include <sqlite3.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <random>

#include "quota/core/calendar.h"
#include "quota/store/store.h"
#include "tests/quota/postgres_cluster.h"
#include "tests/quota/quota_test_util.h"

namespace yolo8::quota {
namespace {

using testing::kHour;
using testing::kMinute;
using testing::kMonday;
using testing::PostgresCluster;

// --db: which backend, and a URL never carries the password

std::string parse_error(const std::string& spec) {
  try {
    parse_db_target(spec);
  } catch (const StoreError& error) {
    return error.what();
  }
  ADD_FAILURE() << spec << " parsed";
  return "";
}

TEST(QuotaDbTarget, APathOrSqlitePathIsAFileAndAUrlIsPostgres) {
  EXPECT_EQ(parse_db_target("quotad.db").kind, DbTarget::Kind::kSqlite);
  EXPECT_EQ(parse_db_target("quotad.db").location, "quotad.db");
  EXPECT_EQ(parse_db_target("sqlite:/var/lib/quotad/quotad.db").kind, DbTarget::Kind::kSqlite);
  EXPECT_EQ(parse_db_target("sqlite:/var/lib/quotad/quotad.db").location, "/var/lib/quotad/quotad.db");
  for (const std::string url : {"postgresql://quotad@db.example:5432/quota?sslmode=verify-full",
                                "postgres://db.example/quota", "postgresql:///quota?host=/run/postgresql"}) {
    const DbTarget target = parse_db_target(url);
    EXPECT_EQ(target.kind, DbTarget::Kind::kPostgres) << url;
    EXPECT_EQ(target.location, url);
  }
  EXPECT_NE(parse_error("sqlite:").find("--db: names no SQLite file"), std::string::npos);
  EXPECT_NE(parse_error("postgresql://db.example/quota?no_such_option=1").find("--db: not a valid PostgreSQL URL"),
            std::string::npos);
}

TEST(QuotaDbTarget, AUrlWithAPasswordIsRefusedNamingTheOptionAndNotTheSecret) {
  for (const std::string url :
       {"postgresql://quotad:s3cret@db.example/quota", "postgres://db.example/quota?password=s3cret",
        "postgresql://quotad:s3cret@db1,db2/quota"}) {
    const std::string error = parse_error(url);
    EXPECT_NE(error.find("--db-password-file"), std::string::npos) << error;
    EXPECT_NE(error.find("PGPASSWORD"), std::string::npos) << error;
    EXPECT_EQ(error.find("s3cret"), std::string::npos) << error;
  }
}

TEST(QuotaDbTarget, AnUnreadableOrEmptyPasswordFileIsNamed) {
  StoreOptions options;
  options.password_file = testing::temp_db("no_password_file");
  try {
    open_store(parse_db_target("postgresql:///quota?host=/nonexistent"), options);
    ADD_FAILURE() << "opened";
  } catch (const StoreError& error) {
    EXPECT_NE(std::string(error.what()).find("--db-password-file: cannot read " + options.password_file),
              std::string::npos)
        << error.what();
  }
  std::ofstream(options.password_file) << "\n";
  try {
    open_store(parse_db_target("postgresql:///quota?host=/nonexistent"), options);
    ADD_FAILURE() << "opened";
  } catch (const StoreError& error) {
    EXPECT_NE(std::string(error.what()).find("holds no password"), std::string::npos) << error.what();
  }
  std::filesystem::remove(options.password_file);
}

// ---------------------------------------------------------------------------------------------------------
// The store's behaviour, the same on both backends.

enum class Backend { kSqlite, kPostgres };

void sqlite_execute(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  char* error = nullptr;
  const int code = sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &error);
  const std::string message = error != nullptr ? error : "";
  sqlite3_free(error);
  sqlite3_close(db);
  if (code != SQLITE_OK) throw std::runtime_error(sql + ": " + message);
}

std::string sqlite_query_text(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  EXPECT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  sqlite3_stmt* statement = nullptr;
  EXPECT_EQ(sqlite3_prepare_v2(db, sql.c_str(), -1, &statement, nullptr), SQLITE_OK) << sqlite3_errmsg(db);
  std::string value;
  if (sqlite3_step(statement) == SQLITE_ROW && sqlite3_column_text(statement, 0) != nullptr) {
    value = reinterpret_cast<const char*>(sqlite3_column_text(statement, 0));
  }
  sqlite3_finalize(statement);
  sqlite3_close(db);
  return value;
}

class QuotaStateStore : public ::testing::TestWithParam<Backend> {
 protected:
  // A new, empty database: its --db.
  static std::string fresh(const std::string& name) {
    if (GetParam() == Backend::kSqlite) return testing::temp_db(name);
    return PostgresCluster::get().fresh_database(name);
  }
  static std::unique_ptr<StateStore> open(const std::string& db, int busy_timeout_ms = 30000) {
    StoreOptions options;
    options.busy_timeout_ms = busy_timeout_ms;
    return open_store(parse_db_target(db), options);
  }
  // SQL behind the store's back (written to run on both); a failure throws.
  static void execute(const std::string& db, const std::string& sql) {
    if (GetParam() == Backend::kSqlite) {
      sqlite_execute(db, sql);
    } else {
      PostgresCluster::execute(db, sql);
    }
  }
  static std::string query_text(const std::string& db, const std::string& sql) {
    return GetParam() == Backend::kSqlite ? sqlite_query_text(db, sql) : PostgresCluster::query_text(db, sql);
  }
};

INSTANTIATE_TEST_SUITE_P(QuotaBackends, QuotaStateStore, ::testing::Values(Backend::kSqlite, Backend::kPostgres),
                         [](const ::testing::TestParamInfo<Backend>& param) {
                           return param.param == Backend::kSqlite ? "SQLite" : "PostgreSQL";
                         });

LeaseRequest request_of(const std::string& team, const std::string& user) {
  LeaseRequest request;
  request.team = team;
  request.user = user;
  return request;
}

TEST_P(QuotaStateStore, LeasesAndApprovalsRoundTripWithTheirStatesAsText) {
  const std::string db = fresh("text_form");
  Engine engine(testing::example_policy());
  LeaseRequest request = request_of("team-cv", "alice");
  request.model = "yolov8x";  // the approval tier
  request.justification = "paper deadline";
  const AcquireResult asked = engine.acquire(request, kMonday);
  ASSERT_EQ(asked.kind, AcquireResult::Kind::kNeedsApproval);
  engine.release(asked.lease_id, Outcome::kNone, kMonday + 1000);
  open(db)->write(engine, engine.take_changes());
  EXPECT_EQ(query_text(db, "SELECT state FROM leases WHERE id = 1"), "released");
  EXPECT_EQ(nlohmann::json::parse(query_text(db, "SELECT body FROM leases WHERE id = 1"))["outcome"], "cancelled");
  EXPECT_EQ(query_text(db, "SELECT state FROM approvals WHERE id = 1"), "cancelled");
  EXPECT_EQ(nlohmann::json::parse(query_text(db, "SELECT body FROM approvals WHERE id = 1"))["state"], "cancelled");
  const Snapshot snapshot = open(db)->load(kMonday + 2000, 24 * kHour, 10);
  ASSERT_EQ(snapshot.leases.size(), 1u);
  EXPECT_EQ(snapshot.leases[0].state, LeaseState::kReleased);
  EXPECT_EQ(snapshot.leases[0].outcome, Outcome::kCancelled);
  EXPECT_EQ(snapshot.leases[0].req.justification, "paper deadline");
  ASSERT_EQ(snapshot.approvals.size(), 1u);
  EXPECT_EQ(snapshot.approvals[0].state, ApprovalState::kCancelled);
  EXPECT_EQ(snapshot.audit.size(), static_cast<size_t>(snapshot.next_audit_seq - 1));
  EXPECT_EQ(snapshot.next_lease_id, 2);
  EXPECT_EQ(snapshot.next_approval_id, 2);
  // an ended lease is left out once it is older than keep_ended_ms
  EXPECT_TRUE(open(db)->load(kMonday + 48 * kHour, 24 * kHour, 0).leases.empty());
}

TEST_P(QuotaStateStore, AnEndedEmergencyLeaseLoadsUntilItsReviewIsClosed) {
  const std::string db = fresh("review_kept");
  Engine engine(testing::example_policy());
  LeaseRequest request = request_of("team-interns", "ivan");
  request.priority = Priority::kCritical;
  request.justification = "demo day";
  const int64_t id = engine.acquire(request, kMonday).lease_id;
  request.priority = Priority::kNormal;
  const int64_t normal = engine.acquire(request, kMonday).lease_id;
  engine.release(id, Outcome::kCompleted, kMonday + kHour);
  engine.release(normal, Outcome::kCompleted, kMonday + kHour);
  const auto store = open(db);
  store->write(engine, engine.take_changes());
  const Snapshot old = store->load(kMonday + 72 * kHour, 24 * kHour, 0);  // ended two days before
  ASSERT_EQ(old.leases.size(), 1u);
  EXPECT_EQ(old.leases[0].id, id);
  EXPECT_TRUE(old.leases[0].review_pending);
  engine.review_emergency(id, "admin", kMonday + 72 * kHour, "justified");
  store->write(engine, engine.take_changes());
  EXPECT_TRUE(store->load(kMonday + 72 * kHour, 24 * kHour, 0).leases.empty());
}

// Rows that parse but break invariants, edited into the database behind quotad's back (a second lease on lease
// 1's GPU, a lease of 500 GPUs): after a restart each is in the quarantine table with why, gone from the leases,
// audited; a second restart finds nothing more to do.
TEST_P(QuotaStateStore, RowsThatBreakInvariantsAreQuarantinedAtLoadWithAnAuditEntry) {
  const std::string db = fresh("invariant_rows");
  {
    Engine engine(testing::example_policy());
    for (int i = 0; i < 3; ++i) {
      ASSERT_EQ(engine.acquire(request_of("team-cv", "alice"), kMonday).kind, AcquireResult::Kind::kGranted);
    }
    open(db)->write(engine, engine.take_changes());
  }
  const auto body = [&](int id) {
    return nlohmann::json::parse(query_text(db, "SELECT body FROM leases WHERE id = " + std::to_string(id)));
  };
  nlohmann::json second = body(2), third = body(3);
  second["devices"] = body(1)["devices"];
  third["gpus"] = 500;
  execute(db, "UPDATE leases SET body = '" + second.dump() + "' WHERE id = 2");
  execute(db, "UPDATE leases SET body = '" + third.dump() + "' WHERE id = 3");
  const int64_t restart = kMonday + kMinute;
  auto restart_once = [&] {
    const auto store = open(db);
    Snapshot snapshot = store->load(restart, 24 * kHour, 100);
    Engine engine(testing::example_policy());
    engine.restore(std::move(snapshot.leases), std::move(snapshot.approvals), std::move(snapshot.audit),
                   std::move(snapshot.usage), snapshot.next_audit_seq, restart);
    store->write(engine, engine.take_changes());
    EXPECT_TRUE(engine.check_invariants(restart).empty());
    return engine.leases().size();
  };
  EXPECT_EQ(restart_once(), 1u);
  EXPECT_EQ(query_text(db, "SELECT COUNT(*) FROM leases WHERE id = 1"), "1");
  EXPECT_EQ(query_text(db, "SELECT COUNT(*) FROM leases"), "1");
  EXPECT_EQ(query_text(db, "SELECT COUNT(*) FROM quarantine WHERE source = 'leases' AND row_id IN (2, 3)"), "2");
  EXPECT_NE(query_text(db, "SELECT error FROM quarantine WHERE row_id = 2").find("already held by lease 1"),
            std::string::npos);
  EXPECT_NE(query_text(db, "SELECT error FROM quarantine WHERE row_id = 3").find("gpus 500"), std::string::npos);
  EXPECT_EQ(query_text(db, "SELECT COUNT(*) FROM audit WHERE action = 'lease.quarantined' AND lease_id IN (2, 3)"),
            "2");
  EXPECT_EQ(restart_once(), 1u);  // nothing left to quarantine, nothing quarantined twice
  EXPECT_EQ(query_text(db, "SELECT COUNT(*) FROM quarantine"), "2");
  EXPECT_EQ(open(db)->load(restart, 24 * kHour, 0).next_lease_id, 4) << "quarantined ids are never handed out again";
}

std::string load_error(StateStore& store) {
  try {
    store.load(kMonday + kHour, 24 * kHour, 0);
  } catch (const StoreError& error) {
    return error.what();
  }
  ADD_FAILURE() << "loaded";
  return "";
}

TEST_P(QuotaStateStore, AnUnknownStoredStateOrAnAuditGapIsAnErrorNamingTheTableAndRow) {
  const std::string db = fresh("unknown_state");
  const auto store = open(db);
  execute(db, R"SQL(INSERT INTO leases(id, state, team, "user", ended_ms, body) VALUES (9, 'paused', 'team-cv',
    'alice', 0, '{"id":9,"request":{"team":"team-cv","user":"alice"},"state":"paused"}'))SQL");
  const std::string lease_error = load_error(*store);
  EXPECT_NE(lease_error.find(db + ": table leases, row id 9, column body: state: 'paused' is not one of"),
            std::string::npos)
      << lease_error;
  execute(db, "DELETE FROM leases");
  execute(db,
          "INSERT INTO audit(seq, ts_ms, actor, action, lease_id, team, detail) VALUES "
          "(1, 0, 'a', 'x', 0, 't', ''), (2, 0, 'a', 'x', 0, 't', ''), (4, 0, 'a', 'x', 0, 't', '')");
  const std::string gap_error = load_error(*store);
  EXPECT_NE(gap_error.find(db + ": table audit: the sequence has a gap: entry 3 is missing"), std::string::npos)
      << gap_error;
}

TEST_P(QuotaStateStore, TheAuditLogIsAppendOnly) {
  const std::string db = fresh("append_only");
  Changes changes;
  AuditEntry entry;
  entry.seq = 1;
  entry.action = "lease.granted";
  changes.audit = {entry};
  open(db)->write(Engine(testing::example_policy()), changes);
  for (const char* sql : {"UPDATE audit SET detail = 'x'", "DELETE FROM audit"}) {
    try {
      execute(db, sql);
      ADD_FAILURE() << sql << " succeeded";
    } catch (const std::runtime_error& error) {
      EXPECT_NE(std::string(error.what()).find("audit log is append-only"), std::string::npos) << error.what();
    }
  }
  EXPECT_EQ(query_text(db, "SELECT COUNT(*) FROM audit"), "1");
}

AuditEntry entry(int64_t seq, const std::string& team, const std::string& detail) {
  AuditEntry e;
  e.seq = seq;
  e.ts_ms = kMonday + seq * 1000;
  e.actor = "alice";
  e.action = "lease.granted";
  e.lease_id = seq;
  e.team = team;
  e.detail = detail;
  return e;
}

// Each entry's link is the SHA-256 of the previous link and its content, as `quotad audit --verify` recomputes it;
// the head carries over between transactions and store handles.
TEST_P(QuotaStateStore, TheAuditChainLinksEveryEntryAndItsHeadCarriesOver) {
  const std::string db = fresh("audit_chain");
  const Engine engine(testing::example_policy());
  std::string link;
  for (int64_t seq = 1; seq <= 6; ++seq) {
    const auto store = open(db);  // a new handle each time: the head is read from the database
    Changes changes;
    changes.audit = {entry(seq, seq % 2 == 0 ? "team-cv" : "team-nlp", "entry " + std::to_string(seq))};
    store->write(engine, changes);
    link = audit_chain_link(link, changes.audit[0]);
    EXPECT_EQ(store->audit_head(), std::to_string(seq) + " " + link);
  }
  EXPECT_EQ(query_text(db, "SELECT chain FROM audit WHERE seq = 6"), link);
  EXPECT_EQ(query_text(db, "SELECT value FROM meta WHERE key = 'audit_head'"), "6 " + link);
  const auto store = open(db);
  EXPECT_EQ(store->audit_head(), "");
  const Snapshot snapshot = store->load(kMonday, kHour, 2);
  EXPECT_EQ(store->audit_head(), "6 " + link);
  EXPECT_EQ(snapshot.next_audit_seq, 7);
  ASSERT_EQ(snapshot.audit.size(), 2u);
  EXPECT_EQ(snapshot.audit[0].seq, 5);
  EXPECT_EQ(snapshot.audit[1].detail, "entry 6");
  const std::vector<AuditEntry> cv = store->audit(1, 10, "team-cv");
  ASSERT_EQ(cv.size(), 3u);
  EXPECT_EQ(cv[0].seq, 2);
  EXPECT_EQ(cv[2].seq, 6);
  EXPECT_EQ(cv[2].ts_ms, kMonday + 6000);
  EXPECT_EQ(cv[2].actor, "alice");
  EXPECT_EQ(cv[2].lease_id, 6);
  EXPECT_EQ(store->audit(0, 4).size(), 4u);
}

// `quotad audit --verify` recomputes the chain from either backend; with the append-only guard dropped, a deleted
// or edited entry is named.
TEST_P(QuotaStateStore, TheChainVerifiesAndADeletedOrEditedEntryIsNamed) {
  const auto chained = [&](const std::string& name) {
    const std::string db = fresh(name);
    Changes changes;
    for (int64_t seq = 1; seq <= 6; ++seq)
      changes.audit.push_back(entry(seq, "team-cv", "entry " + std::to_string(seq)));
    open(db)->write(Engine(testing::example_policy()), changes);
    execute(db, GetParam() == Backend::kSqlite ? "DROP TRIGGER audit_no_update; DROP TRIGGER audit_no_delete;"
                                               : "DROP TRIGGER audit_no_change ON audit");
    return db;
  };
  const auto verify = [](const std::string& db) { return verify_audit_chain(parse_db_target(db), StoreOptions()); };
  std::string db = chained("verify_intact");
  AuditChainCheck check = verify(db);
  EXPECT_TRUE(check.intact) << check.problem;
  EXPECT_EQ(check.entries, 6);
  EXPECT_EQ(check.head_seq, 6);
  EXPECT_EQ(check.head, query_text(db, "SELECT chain FROM audit WHERE seq = 6"));
  db = chained("verify_middle");
  execute(db, "DELETE FROM audit WHERE seq = 3");
  check = verify(db);
  EXPECT_FALSE(check.intact);
  EXPECT_EQ(check.broken_seq, 3);
  db = chained("verify_last");
  execute(db, "DELETE FROM audit WHERE seq = 6");
  check = verify(db);
  EXPECT_EQ(check.broken_seq, 6);
  EXPECT_NE(check.problem.find("the last entries were deleted"), std::string::npos) << check.problem;
  db = chained("verify_edit");
  execute(db, "UPDATE audit SET detail = 'nothing happened' WHERE seq = 4");
  check = verify(db);
  EXPECT_EQ(check.problem, "entry 4: its hash does not match: the entry, or the one before it, was changed");
}

// The id sequences stay above every id ever stored: the meta counters, lease rows, and the lease ids audit and
// heartbeat rows name.
TEST_P(QuotaStateStore, IdSequencesStayAboveEveryIdEverStored) {
  const std::string db = fresh("id_sequences");
  Engine engine(testing::example_policy());
  engine.reserve_ids(20, 7);
  const int64_t id = engine.acquire(request_of("team-cv", "alice"), kMonday).lease_id;
  EXPECT_EQ(id, 20);
  const auto store = open(db);
  store->write(engine, engine.take_changes());
  EXPECT_EQ(store->load(kMonday, kHour, 0).next_lease_id, 21);
  EXPECT_EQ(store->load(kMonday, kHour, 0).next_approval_id, 7);
  store->write_heartbeats({{40, kMonday, Telemetry()}});
  EXPECT_EQ(store->load(kMonday, kHour, 0).next_lease_id, 41);
  Changes changes;
  changes.audit = {entry(store->load(kMonday, kHour, 0).next_audit_seq, "team-cv", "")};
  changes.audit[0].lease_id = 50;
  store->write(engine, changes);
  EXPECT_EQ(store->load(kMonday, kHour, 0).next_lease_id, 51);
}

TEST_P(QuotaStateStore, LoansGrantsAndUsageRoundTrip) {
  const std::string db = fresh("ledger");
  const int64_t now = kMonday + 9 * kHour;
  {
    Engine engine(testing::example_policy());
    engine.apply_loan("alice", 10, "first", now);
    engine.apply_loan("bob", 5, "second", now);
    engine.grant_credits("alice", 3, "tool", "carol", now);
    open(db)->write(engine, engine.take_changes());
  }
  execute(db, R"SQL(INSERT INTO usage("user", month, gpu_hours) VALUES ('alice', '2026-11', 12.125))SQL");
  const Snapshot snapshot = open(db)->load(now, kHour, 10);
  ASSERT_EQ(snapshot.loans.size(), 2u);
  EXPECT_EQ(snapshot.loans[1].justification, "second");
  ASSERT_EQ(snapshot.grants.size(), 1u);
  EXPECT_EQ(snapshot.grants[0].granted_by, "carol");
  EXPECT_EQ(snapshot.next_loan_id, 3);
  EXPECT_EQ(snapshot.next_grant_id, 2);
  ASSERT_EQ(snapshot.usage.count({"alice", "2026-11"}), 1u);
  EXPECT_DOUBLE_EQ(snapshot.usage.at({"alice", "2026-11"}), 12.125);
}

// Heartbeats that carry a peak with model, imgsz, batch, AMP and device are kept as memory observations, one per
// run and setting (its highest peak); telemetry without them is not.
TEST_P(QuotaStateStore, HeartbeatPeaksWithTheirContextAreKeptAsMemoryObservations) {
  const auto store = open(fresh("memory_observations"));
  Telemetry beat;
  beat.memory_used_gib = 3.0;
  beat.model = "yolov8n";
  beat.imgsz = 640;
  beat.batch = 16;
  beat.amp = 1;
  beat.device_name = "NVIDIA L4";
  Telemetry higher = beat;
  higher.memory_used_gib = 3.5;
  Telemetry bare;
  bare.memory_used_gib = 9.0;  // no context: nothing to learn from
  Telemetry other = beat;
  other.batch = 32;
  other.memory_used_gib = 6.0;
  store->write_heartbeats({{1, 1000, beat}, {1, 2000, higher}, {1, 3000, bare}, {2, 1500, other}});
  const std::vector<MemoryObservation> seen = store->memory_observations();
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0].batch, 16);
  EXPECT_DOUBLE_EQ(seen[0].peak_gib, 3.5);
  EXPECT_TRUE(seen[0].amp);
  EXPECT_EQ(seen[0].device, "NVIDIA L4");
  EXPECT_EQ(seen[0].libtorch, "");
  EXPECT_EQ(seen[1].batch, 32);
  EXPECT_EQ(store->count_heartbeats(), 4);
}

// Observations stay bounded: a run keeps one row per setting however many heartbeats it sends (its highest
// peak), and only the latest kMemoryObservationRunsKept runs per model, device, precision and LibTorch version
// are kept; other keys are untouched.
TEST_P(QuotaStateStore, MemoryObservationsArePrunedToTheLatestRunsPerKey) {
  const std::string db = fresh("memory_observations_pruned");
  const auto store = open(db);
  Telemetry beat;
  beat.model = "yolov8n";
  beat.imgsz = 640;
  beat.batch = 16;
  beat.amp = 1;
  beat.device_name = "NVIDIA L4";
  beat.libtorch = "2.1.2";
  Telemetry other = beat;
  other.model = "yolov8s";
  other.memory_used_gib = 5.0;
  store->write_heartbeats({{1, 500, other}});
  const int runs = kMemoryObservationRunsKept + 3;
  for (int run = 1; run <= runs; ++run) {
    std::vector<HeartbeatSample> beats;
    for (int second = 0; second < 5; ++second) {  // five heartbeats, the peak growing
      beat.memory_used_gib = 1.0 + run * 0.01 + second * 0.001;
      beats.push_back({100 + run, 1000LL * run + second, beat});
    }
    store->write_heartbeats(beats);
  }
  EXPECT_EQ(query_text(db, "SELECT COUNT(*) FROM memory_observations WHERE model = 'yolov8n'"),
            std::to_string(kMemoryObservationRunsKept));
  EXPECT_EQ(query_text(db, "SELECT MIN(lease_id) FROM memory_observations WHERE model = 'yolov8n'"),
            std::to_string(100 + 4));  // the three oldest runs went
  EXPECT_EQ(query_text(db, "SELECT COUNT(*) FROM memory_observations WHERE model = 'yolov8s'"), "1");
  const std::vector<MemoryObservation> seen = store->memory_observations();
  ASSERT_EQ(seen.size(), static_cast<size_t>(kMemoryObservationRunsKept) + 1);
  EXPECT_NEAR(seen.front().peak_gib, 1.0 + 4 * 0.01 + 0.004, 1e-9);  // the run's highest peak
  EXPECT_EQ(seen.front().libtorch, "2.1.2");
  EXPECT_EQ(store->count_heartbeats(), 5 * runs + 1);  // the heartbeats themselves are not pruned here
}

// A restarted quotad gets back the last telemetry of a running lease (utilisation and its source, the device's and
// the process's GPU memory) and refolds its utilisation samples into the waste tracker.
TEST_P(QuotaStateStore, TheLastTelemetryAndTheUtilisationSamplesOfARunningLeaseSurviveARestart) {
  const std::string db = fresh("telemetry");
  Engine engine(testing::example_policy());
  const int64_t id = engine.acquire(request_of("team-cv", "alice"), kMonday).lease_id;
  Telemetry beat;
  beat.step = 120;
  beat.epoch = 3;
  beat.gpu_util = 0.75;
  beat.gpu_util_source = "nvml";
  beat.device_memory_used_gib = 12.5;
  beat.process_memory_used_gib = 10.75;
  beat.memory_used_gib = 9.25;
  beat.last_checkpoint_ms = kMonday + 500;
  Telemetry earlier = beat;
  earlier.gpu_util = 0.25;
  earlier.gpu_util_source.clear();
  {
    const auto store = open(db);
    store->write(engine, engine.take_changes());
    store->write_heartbeats({{id, kMonday + 1000, earlier}, {id, kMonday + 2000, beat}});
  }
  const auto store = open(db);
  const Snapshot snapshot = store->load(kMonday + 3000, 24 * kHour, 0);
  ASSERT_EQ(snapshot.leases.size(), 1u);
  const Telemetry& back = snapshot.leases[0].telemetry;
  EXPECT_EQ(back.step, 120);
  EXPECT_EQ(back.epoch, 3);
  EXPECT_DOUBLE_EQ(back.gpu_util, 0.75);
  EXPECT_EQ(back.gpu_util_source, "nvml");
  EXPECT_DOUBLE_EQ(back.device_memory_used_gib, 12.5);
  EXPECT_DOUBLE_EQ(back.process_memory_used_gib, 10.75);
  EXPECT_DOUBLE_EQ(back.memory_used_gib, 9.25);
  EXPECT_EQ(back.last_checkpoint_ms, kMonday + 500);
  EXPECT_GE(snapshot.leases[0].last_seen_ms, kMonday + 2000);
  UtilTracker tracker(0.5, 60000);
  store->replay_heartbeats(engine, tracker);
  ASSERT_NE(tracker.find(id), nullptr);
}

// Bounded history: folding the old heartbeats into hourly summaries changes nothing derived from them.

void expect_same_util(const UtilTracker& folded, const UtilTracker& raw, const std::string& where) {
  ASSERT_EQ(folded.leases().size(), raw.leases().size()) << where;
  for (const auto& [id, want] : raw.leases()) {
    const LeaseUtil* got = folded.find(id);
    ASSERT_NE(got, nullptr) << where << " lease " << id;
    const std::string what = where + " lease " + std::to_string(id);
    EXPECT_EQ(got->first_ts_ms, want.first_ts_ms) << what;
    EXPECT_EQ(got->last_ts_ms, want.last_ts_ms) << what;
    EXPECT_EQ(got->last_util, want.last_util) << what;
    EXPECT_EQ(got->low_since_ms, want.low_since_ms) << what;
    EXPECT_EQ(got->util_micro_ms, want.util_micro_ms) << what;
    EXPECT_EQ(got->covered_ms, want.covered_ms) << what;
    EXPECT_EQ(got->low_held_ms, want.low_held_ms) << what;
    EXPECT_EQ(got->wasted_ms, want.wasted_ms) << what;
    EXPECT_EQ(got->longest_low_ms, want.longest_low_ms) << what;
    EXPECT_EQ(got->samples, want.samples) << what;
  }
}

TEST_P(QuotaStateStore, FoldingOldHeartbeatsKeepsEveryFigureAndOnlyTheRetainedRawRows) {
  const std::string db = fresh("fold");
  const double threshold = 0.3;
  const int64_t waste_after_ms = 20 * kMinute;
  const int64_t t0 = month_span("2026-01")->start_ms + 2 * 24 * kHour + 5 * kHour + 17 * kMinute;
  const int64_t now = t0 + 75 * 24 * kHour + 7 * kMinute;
  Engine engine(testing::example_policy());
  std::vector<int64_t> ids;
  for (const char* user : {"alice", "bob", "alice"}) {
    ids.push_back(engine.acquire(request_of("team-cv", user), t0 + static_cast<int64_t>(ids.size()) * kHour).lease_id);
  }
  ASSERT_TRUE(engine.release(ids[1], Outcome::kCompleted, t0 + 40 * 24 * kHour));
  // months of samples, a few minutes apart, in low and busy runs, some without a utilisation
  std::mt19937_64 random(3);
  std::vector<HeartbeatSample> samples;
  for (size_t i = 0; i < ids.size(); ++i) {
    const int64_t end = i == 1 ? t0 + 40 * 24 * kHour : now;
    bool low = false;
    for (int64_t ts = t0 + static_cast<int64_t>(i) * kHour; ts < end;
         ts += kMinute + static_cast<int64_t>(random() % (14 * kMinute))) {
      if (random() % 8 == 0) low = !low;
      Telemetry beat;
      beat.gpu_util = random() % 30 == 0 ? -1 : (low ? 0.05 : 0.5) + static_cast<double>(random() % 1000) / 9999.0;
      samples.push_back({ids[i], ts, beat});
    }
  }
  auto store = open(db);
  store->write(engine, engine.take_changes());
  store->write_heartbeats(samples);
  // what the reports read (whole months, an hour-aligned window) and what a restart replays
  const auto figures = [&](StateStore& from) {
    std::vector<UtilTracker> out;
    for (const char* month : {"2026-01", "2026-02", "2026-03"}) {
      out.emplace_back(threshold, waste_after_ms);
      from.util_history(month_span(month)->start_ms, month_span(month)->end_ms, out.back());
    }
    out.emplace_back(threshold, waste_after_ms);
    from.util_history(hour_of(t0 + 20 * 24 * kHour), now, out.back());
    out.emplace_back(threshold, waste_after_ms);
    from.replay_heartbeats(engine, out.back());
    return out;
  };
  const std::vector<UtilTracker> before = figures(*store);
  ASSERT_EQ(before.back().leases().size(), 2u);  // the running leases
  ASSERT_GT(before[0].find(ids[0])->wasted_ms, 0);

  // summed up to the last whole hour but one, nothing deleted; in small steps: hours summed up in parts, appended
  // to what the step before stored
  const int64_t summarise_before = now - 10 * kMinute;
  int steps = 0;
  while (store->fold_heartbeats(summarise_before, 0, threshold, waste_after_ms, 700) > 0) ++steps;
  EXPECT_GT(steps, 5);
  EXPECT_EQ(store->meta(kHeartbeatsSummarisedKey), std::to_string(hour_of(summarise_before)));
  EXPECT_EQ(store->count_heartbeats(), static_cast<int64_t>(samples.size()));
  EXPECT_GT(store->count_heartbeat_hours(), 2 * 70 * 24);
  const std::vector<UtilTracker> summed_up = figures(*store);
  ASSERT_EQ(summed_up.size(), before.size());
  for (size_t i = 0; i < before.size(); ++i) {
    expect_same_util(summed_up[i], before[i], "summed up, figure " + std::to_string(i));
  }
  // then the raw rows past the retention period go
  const int64_t retention = 14 * 24 * kHour;
  steps = 0;
  while (store->fold_heartbeats(summarise_before, now - retention, threshold, waste_after_ms, 700) > 0) ++steps;
  EXPECT_GT(steps, 5);
  const std::vector<UtilTracker> after = figures(*store);
  for (size_t i = 0; i < before.size(); ++i) expect_same_util(after[i], before[i], "figure " + std::to_string(i));

  // retention: nothing older than the retention period's hour is raw; every newer row is
  const int64_t cutoff = hour_of(now - retention);
  int64_t newer = 0;
  for (const HeartbeatSample& sample : samples) newer += sample.ts_ms >= cutoff ? 1 : 0;
  EXPECT_EQ(store->count_heartbeats(), newer);
  EXPECT_EQ(query_text(db, "SELECT COUNT(*) FROM heartbeats WHERE ts_ms < " + std::to_string(cutoff)), "0");
  // the same again: nothing left to fold, nothing changes; a restart replays the same
  EXPECT_EQ(store->fold_heartbeats(summarise_before, now - retention, threshold, waste_after_ms, 700), 0);
  store.reset();
  const std::vector<UtilTracker> reopened = figures(*open(db));
  for (size_t i = 0; i < before.size(); ++i) expect_same_util(reopened[i], before[i], "reopened " + std::to_string(i));
}

TEST_P(QuotaStateStore, MetaValuesRoundTripAndJoinAnOpenTransaction) {
  const std::string db = fresh("meta");
  const auto store = open(db);
  EXPECT_EQ(store->meta("local_clock_reference"), "");
  store->set_meta("local_clock_reference", "boot:abc 12");
  store->set_meta("local_clock_reference", "boot:abc 13");
  EXPECT_EQ(open(db)->meta("local_clock_reference"), "boot:abc 13");
  store->begin_immediate();
  store->set_meta("local_clock_reference", "boot:def 1");
  store->rollback();
  EXPECT_EQ(open(db)->meta("local_clock_reference"), "boot:abc 13");
}

// Local mode's exclusive section: what a rolled-back section wrote is gone, a committed one's is all there, and
// another writer waits for the holder up to its busy timeout, then fails; once the holder commits it goes ahead.
TEST_P(QuotaStateStore, AWriterWaitsForTheExclusiveSectionAndSeesWhatItCommitted) {
  const std::string db = fresh("exclusive");
  const auto holder = open(db);
  const auto other = open(db, 300);
  Engine engine(testing::example_policy());
  engine.acquire(request_of("team-cv", "alice"), kMonday);
  const Changes first = engine.take_changes();
  holder->begin_immediate();
  holder->write(engine, first);
  holder->rollback();
  EXPECT_TRUE(other->load(kMonday, kHour, 0).leases.empty());
  holder->begin_immediate();
  holder->write(engine, first);
  holder->set_meta("k", "v");
  EXPECT_THROW(other->set_meta("k", "w"), StoreError);
  EXPECT_TRUE(other->load(kMonday, kHour, 0).leases.empty()) << "a reader does not see an open section";
  holder->commit();
  other->set_meta("k", "w");
  EXPECT_EQ(holder->meta("k"), "w");
  other->begin_immediate();
  const Snapshot seen = other->load(kMonday, kHour, 10);
  other->commit();
  ASSERT_EQ(seen.leases.size(), 1u);
  EXPECT_EQ(seen.next_audit_seq, static_cast<int64_t>(first.audit.size()) + 1);
}

}  // namespace
}  // namespace yolo8::quota
