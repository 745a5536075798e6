// Chaos and security suite of issue 15 (label integration; run alone with --gtest_filter='QuotaChaos.*'):
// a storage stall, restarts after long quiet periods, hostile clients on loopback.
#include <sqlite3.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "quota/service/service.h"
#include "tests/quota/quota_test_util.h"

namespace yolo8::quota {
namespace {

using nlohmann::json;
using testing::api_call;
using testing::kHour;
using testing::kMonday;
using testing::temp_db;
using Steady = std::chrono::steady_clock;

struct FakeClock {
  std::shared_ptr<std::atomic<int64_t>> now = std::make_shared<std::atomic<int64_t>>(kMonday + 9 * kHour);
  std::function<int64_t()> fn() const {
    auto shared = now;
    return [shared] { return shared->load(); };
  }
};

// Another process holding the SQLite write lock (BEGIN IMMEDIATE) until release().
class WriteLockHolder {
 public:
  explicit WriteLockHolder(const std::string& path) {
    EXPECT_EQ(sqlite3_open(path.c_str(), &db_), SQLITE_OK);
    EXPECT_EQ(sqlite3_exec(db_, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr), SQLITE_OK);
  }
  void release() {
    if (db_ == nullptr) return;
    sqlite3_exec(db_, "COMMIT", nullptr, nullptr, nullptr);
    sqlite3_close(db_);
    db_ = nullptr;
  }
  ~WriteLockHolder() { release(); }

 private:
  sqlite3* db_ = nullptr;
};

double ms_since(Steady::time_point start) {
  return std::chrono::duration<double, std::milli>(Steady::now() - start).count();
}

// Issue 15, failure 2: another process holds the write lock. Before: the acquire blocked 30 s, answered 503,
// yet the lease was granted in memory, its audit row was missing for good, and a heartbeating lease expired.
TEST(QuotaChaos, AStorageStallLeavesNoPhantomStateNoAuditGapAndNoExpiredLease) {
  const std::string db = temp_db("chaos_stall");
  FakeClock clock;
  ServiceOptions options;
  options.db_path = db;
  options.clock = clock.fn();
  options.store_busy_timeout_ms = 300;
  options.lock_wait_ms = 2000;
  options.outage_after_ms = 3000;
  QuotaService service(testing::example_policy(), options);
  ASSERT_EQ(service.handle(api_call("POST", "/v1/leases", "alice-token", R"({"model":"yolov8s"})")).status, 201);
  ASSERT_EQ(service.handle(api_call("POST", "/v1/leases", "erin-token", R"({"model":"yolov8s"})")).status, 201);
  service.tick();
  int64_t before_gpus = 0;
  service.inspect([&](const Engine& engine) { before_gpus = static_cast<int64_t>(engine.leases().size()); });

  WriteLockHolder holder(db);
  // the acquire fails whole: 503 with Retry-After, and nothing of it stays in memory
  const ApiResponse refused = service.handle(api_call("POST", "/v1/leases", "bob-token", R"({"model":"yolov8s"})"));
  EXPECT_EQ(refused.status, 503) << refused.body.dump();
  EXPECT_EQ(refused.headers.count("Retry-After"), 1u);
  service.inspect([&](const Engine& engine) {
    EXPECT_EQ(static_cast<int64_t>(engine.leases().size()), before_gpus);
    EXPECT_EQ(engine.find(3), nullptr);
    EXPECT_DOUBLE_EQ(engine.team_units("team-cv", clock.now->load()), 1);
  });
  // a release fails whole too: lease 1 is still granted
  EXPECT_EQ(service.handle(api_call("POST", "/v1/leases/1/release", "alice-token")).status, 503);
  service.inspect([](const Engine& engine) { EXPECT_EQ(engine.find(1)->state, LeaseState::kGranted); });

  // heartbeats never wait for the database, even while a state change is stuck on it
  std::atomic<bool> writer_done{false};
  std::thread writer([&] {
    service.handle(api_call("POST", "/v1/leases", "bob-token", R"({"model":"yolov8s"})"));
    writer_done = true;
  });
  double worst_ms = 0;
  // the stall lasts 90 s of quotad's clock (beyond the 60 s TTL); lease 1 heartbeats every 10 s, lease 2 not
  for (int beat = 0; beat < 9; ++beat) {
    *clock.now += 10000;
    const auto start = Steady::now();
    const ApiResponse answer = service.handle(api_call("POST", "/v1/leases/1/heartbeat", "alice-token", "{}"));
    worst_ms = std::max(worst_ms, ms_since(start));
    EXPECT_EQ(answer.status, 200) << answer.body.dump();
    EXPECT_EQ(answer.body["state"], "granted");
    EXPECT_THROW(service.tick(), std::exception);  // the tick cannot be saved either: nothing expires
  }
  EXPECT_LT(worst_ms, 100) << "a heartbeat waited for the stalled store";
  writer.join();
  EXPECT_TRUE(writer_done);
  holder.release();

  service.tick();
  service.inspect([&](const Engine& engine) {
    EXPECT_EQ(engine.find(1)->state, LeaseState::kGranted) << "a heartbeating lease expired during the stall";
    EXPECT_EQ(engine.find(2)->state, LeaseState::kGranted) << "quotad's outage was not credited";
    EXPECT_EQ(engine.find(3), nullptr);
  });
  const ApiResponse granted = service.handle(api_call("POST", "/v1/leases", "bob-token", R"({"model":"yolov8s"})"));
  EXPECT_EQ(granted.status, 201) << granted.body.dump();
  EXPECT_EQ(granted.body["lease_id"], 3);
  const json audit = service.handle(api_call("GET", "/v1/audit?limit=1000", "admin-token")).body["audit"];
  ASSERT_FALSE(audit.empty());
  bool outage_audited = false;
  for (size_t i = 0; i < audit.size(); ++i) {
    EXPECT_EQ(audit[i]["seq"], static_cast<int64_t>(i) + 1) << "the audit sequence has a gap";
    outage_audited = outage_audited || audit[i]["action"] == "quotad.outage";
  }
  EXPECT_TRUE(outage_audited);
  EXPECT_TRUE(service.check_invariants().empty());
  // and a restart finds a sound database
  QuotaService again(testing::example_policy(), options);
  again.inspect([](const Engine& engine) { EXPECT_EQ(engine.find(3)->state, LeaseState::kGranted); });
}

}  // namespace
}  // namespace yolo8::quota
