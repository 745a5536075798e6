// QuotaService on a PostgreSQL store: what a restart restores, and local mode's processes sharing one database.
#include <gtest/gtest.h>

#include <atomic>
#include <memory>

#include "quota/service/service.h"
#include "tests/quota/postgres_cluster.h"
#include "tests/quota/quota_test_util.h"

namespace yolo8::quota {
namespace {

using nlohmann::json;
using testing::api_call;
using testing::kHour;
using testing::kMonday;
using testing::PostgresCluster;

TEST(QuotaServicePostgres, ARestartRestoresLeasesTelemetryAndTheAuditLog) {
  auto now = std::make_shared<std::atomic<int64_t>>(kMonday + 9 * kHour);
  ServiceOptions o;
  o.db_path = PostgresCluster::get().fresh_database("service_restart");
  o.clock = [now] { return now->load(); };
  json before;
  std::string head;
  {
    QuotaService s(testing::example_policy(), o);
    for (int i = 0; i < 3; ++i) {
      ASSERT_EQ(s.handle(api_call("POST", "/v1/leases", "alice-token", R"({"model":"yolov8s"})")).status, 201);
    }
    ASSERT_EQ(s.handle(api_call("POST", "/v1/leases/1/release", "alice-token", R"({"outcome":"completed"})")).status,
              200);
    *now += 5000;
    s.handle(api_call("POST", "/v1/leases/2/heartbeat", "admin-token", R"({"step":100,"gpu_util":0.5})"));
    s.flush_heartbeats();
    before = s.handle(api_call("GET", "/v1/leases", "admin-token")).body;
    s.observe([&](const ServiceView& view) { head = view.counters.audit_chain_head; });
  }
  EXPECT_FALSE(head.empty());
  QuotaService again(testing::example_policy(), o);
  const json after = again.handle(api_call("GET", "/v1/leases", "admin-token")).body;
  ASSERT_EQ(after["leases"].size(), before["leases"].size());
  for (size_t i = 0; i < before["leases"].size(); ++i) {
    EXPECT_EQ(after["leases"][i]["id"], before["leases"][i]["id"]);
    EXPECT_EQ(after["leases"][i]["state"], before["leases"][i]["state"]);
    EXPECT_EQ(after["leases"][i]["devices"], before["leases"][i]["devices"]);
  }
  EXPECT_EQ(again.handle(api_call("GET", "/v1/leases/2", "admin-token")).body["telemetry"]["step"], 100);
  EXPECT_TRUE(again.check_invariants().empty());
  ASSERT_EQ(again.handle(api_call("POST", "/v1/leases/3/release", "alice-token", R"({"outcome":"completed"})")).status,
            200);
  const json audit = again.handle(api_call("GET", "/v1/audit?limit=1000", "admin-token")).body["audit"];
  ASSERT_GE(audit.size(), 5u);  // three grants, two releases
  for (size_t i = 0; i < audit.size(); ++i) EXPECT_EQ(audit[i]["seq"], static_cast<int64_t>(i) + 1);
  const AuditChainCheck check = verify_audit_chain(parse_db_target(o.db_path), StoreOptions());
  EXPECT_TRUE(check.intact) << check.problem;
  EXPECT_EQ(check.entries, static_cast<int64_t>(audit.size()));
}

// Two local-mode processes on one database: each call takes the write lock and reloads, so what one granted the
// other counts, and ids never collide.
TEST(QuotaServicePostgres, LocalModeProcessesShareOneDatabase) {
  ServiceOptions o;
  o.db_path = PostgresCluster::get().fresh_database("service_local");
  o.reload_per_call = true;
  QuotaService first(testing::example_policy(), o);
  QuotaService second(testing::example_policy(), o);
  const ApiResponse a = first.handle(api_call("POST", "/v1/leases", "alice-token", R"({"model":"yolov8s","gpus":8})"));
  ASSERT_EQ(a.status, 201) << a.serialized();
  const ApiResponse b = second.handle(api_call("POST", "/v1/leases", "erin-token", R"({"model":"yolov8s"})"));
  ASSERT_EQ(b.status, 201) << b.serialized();
  EXPECT_NE(a.body["lease_id"], b.body["lease_id"]);
  EXPECT_EQ(
      first.handle(api_call("GET", "/v1/leases/" + std::to_string(b.body["lease_id"].get<int64_t>()), "admin-token"))
          .body["state"],
      "granted");
}

}  // namespace
}  // namespace yolo8::quota
