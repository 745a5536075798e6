// quotad replicas on one PostgreSQL database (EngineHost's leader and follower modes): one leads, the others answer
// 503 naming it; when the leader's session ends a follower takes over with every lease; a leader cut from the
// database is fenced (its writes fail, nothing of them lands) and steps down.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>

#include "quota/service/service.h"
#include "quota/store/postgres_store.h"
#include "tests/quota/postgres_cluster.h"
#include "tests/quota/quota_test_util.h"

namespace yolo8::quota {
namespace {

using nlohmann::json;
using testing::api_call;
using testing::PostgresCluster;

ServiceOptions replica(const std::string& url, const std::string& address) {
  ServiceOptions options;
  options.db_path = url;
  options.replica_address = address;
  options.store_busy_timeout_ms = 2000;
  return options;
}

int64_t acquire(QuotaService& service) {
  const ApiResponse response =
      service.handle(api_call("POST", "/v1/leases", "alice-token", R"({"model":"yolov8s","gpus":1})"));
  return response.status == 201 ? response.body["lease"]["id"].get<int64_t>() : -response.status;
}

// Ticks (as quotad's maintenance thread does every second) until `service` leads; false after 10 s. The lock of a
// session that just ended is free once PostgreSQL has ended its backend, a moment later.
bool ticks_until_it_leads(QuotaService& service) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (;;) {
    service.tick();
    if (service.handle(api_call("GET", "/readyz", "")).status == 200) return true;
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

int heartbeat(QuotaService& service, int64_t lease) {
  return service.handle(api_call("POST", "/v1/leases/" + std::to_string(lease) + "/heartbeat", "alice-token", "{}"))
      .status;
}

TEST(QuotaReplicas, OneLeadsTheOtherFollowsNamingItAndTakesOverWithTheLeases) {
  const std::string url = PostgresCluster::get().fresh_database("replicas_takeover");
  auto leader = std::make_unique<QuotaService>(testing::example_policy(), replica(url, "http://a:8470"));
  QuotaService follower(testing::example_policy(), replica(url, "http://b:8470"));

  EXPECT_EQ(leader->handle(api_call("GET", "/readyz", "")).status, 200);
  EXPECT_EQ(leader->handle(api_call("GET", "/readyz", "")).body["role"], "leader");
  const ApiResponse not_ready = follower.handle(api_call("GET", "/readyz", ""));
  EXPECT_EQ(not_ready.status, 503);
  EXPECT_EQ(not_ready.body["leader"], "http://a:8470");

  const int64_t lease = acquire(*leader);
  ASSERT_GT(lease, 0);
  const ApiResponse refused =
      follower.handle(api_call("POST", "/v1/leases", "alice-token", R"({"model":"yolov8s","gpus":1})"));
  EXPECT_EQ(refused.status, 503);
  EXPECT_EQ(refused.headers.count("Retry-After"), 1u);
  EXPECT_EQ(refused.body["leader"], "http://a:8470") << refused.body.dump();
  EXPECT_EQ(heartbeat(follower, lease), 503) << "a follower's board is not the state";

  leader.reset();  // its session ends: the lock is free once PostgreSQL has ended the backend
  const auto started = std::chrono::steady_clock::now();
  EXPECT_TRUE(ticks_until_it_leads(follower));
  const auto took = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - started);
  std::printf("takeover (the follower's tick after the leader's session ended): %lld ms\n",
              static_cast<long long>(took.count()));
  EXPECT_LT(took.count(), 15000);
  EXPECT_EQ(follower.handle(api_call("GET", "/readyz", "")).status, 200);
  EXPECT_EQ(heartbeat(follower, lease), 200) << "the lease survives the takeover";
  EXPECT_GT(acquire(follower), lease);
  const json audit = follower.handle(api_call("GET", "/v1/audit?limit=1000", "admin-token")).body;
  bool audited = false;
  for (const auto& entry : audit["audit"]) audited |= entry["action"] == "replica.lead";
  EXPECT_TRUE(audited) << audit.dump();
  EXPECT_TRUE(follower.check_invariants().empty());
}

TEST(QuotaReplicas, ALeaderCutFromTheDatabaseIsFencedAndStepsDown) {
  const std::string url = PostgresCluster::get().fresh_database("replicas_fencing");
  QuotaService old_leader(testing::example_policy(), replica(url, "http://a:8470"));
  QuotaService next(testing::example_policy(), replica(url, "http://b:8470"));
  ASSERT_GT(acquire(old_leader), 0);
  // the old leader's leadership session is terminated (a partition, an administrator); its store's connection lives
  PostgresCluster::execute(url,
                           "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' AND "
                           "granted AND objid = " +
                               std::to_string(kLeadershipLockKey & 0xffffffff) +
                               " AND database = (SELECT oid "
                               "FROM pg_database WHERE datname = current_database())");
  ASSERT_TRUE(ticks_until_it_leads(next));
  const std::string leases_before = PostgresCluster::query_text(url, "SELECT COUNT(*) FROM leases");
  // the old leader has not ticked yet: it still believes it leads, but its write is fenced
  EXPECT_EQ(acquire(old_leader), -503);
  EXPECT_EQ(PostgresCluster::query_text(url, "SELECT COUNT(*) FROM leases"), leases_before) << "nothing landed";
  const ApiResponse stepped_down = old_leader.handle(api_call("GET", "/readyz", ""));
  EXPECT_EQ(stepped_down.status, 503);
  EXPECT_EQ(stepped_down.body["leader"], "http://b:8470");
  EXPECT_GT(acquire(next), 0);
}

}  // namespace
}  // namespace yolo8::quota
