#include "quota/service/service.h"

#include <sqlite3.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <tuple>

#include "quota/server/metrics.h"
#include "quota/store/store.h"
#include "tests/quota/quota_test_util.h"

namespace yolo8::quota {
namespace {

using nlohmann::json;
using testing::kHour;
using testing::kMinute;
using testing::kMonday;

using testing::temp_db;

using testing::api_call;

struct Clock {
  std::shared_ptr<std::atomic<int64_t>> t = std::make_shared<std::atomic<int64_t>>(kMonday + 9 * kHour);
  std::function<int64_t()> fn() const {
    auto p = t;
    return [p] { return p->load(); };
  }
};

TEST(QuotaService, RestartRestoresEveryLeaseApprovalAndAudit) {
  const std::string db = temp_db("restart");
  Clock clock;
  ServiceOptions o;
  o.db_path = db;
  o.clock = clock.fn();
  json before;
  int64_t audit_count = 0;
  {
    QuotaService s(testing::example_policy(), o);
    for (int i = 0; i < 14; ++i) {
      ASSERT_EQ(s.handle(api_call("POST", "/v1/leases", "alice-token", R"({"model":"yolov8s"})")).status, 201);
    }
    ASSERT_EQ(s.handle(api_call("POST", "/v1/leases", "bob-token", R"({"model":"yolov8s"})")).status, 202);
    ASSERT_EQ(
        s.handle(api_call("POST", "/v1/leases", "erin-token", R"({"model":"yolov8x","justification":"x"})")).status,
        403);
    ASSERT_EQ(s.handle(api_call("POST", "/v1/leases/1/release", "alice-token", R"({"outcome":"completed"})")).status,
              200);
    *clock.t += 20 * kMinute;
    for (int id = 2; id <= 15; ++id) {
      s.handle(api_call("POST", "/v1/leases/" + std::to_string(id) + "/heartbeat", "admin-token",
                        R"({"step":100,"last_checkpoint_ms":)" + std::to_string(clock.t->load()) + "}"));
    }
    s.flush_heartbeats();
    // robotics reclaims its guarantee: one cv burst lease is revoked
    ASSERT_EQ(s.handle(api_call("POST", "/v1/leases", "erin-token", "{}")).status, 201);
    before = s.handle(api_call("GET", "/v1/leases", "admin-token")).body;
    audit_count =
        static_cast<int64_t>(s.handle(api_call("GET", "/v1/audit?limit=1000", "admin-token")).body["audit"].size());
  }
  QuotaService again(testing::example_policy(), o);
  const json after = again.handle(api_call("GET", "/v1/leases", "admin-token")).body;
  ASSERT_EQ(before["leases"].size(), after["leases"].size());
  for (size_t i = 0; i < before["leases"].size(); ++i) {
    const json& b = before["leases"][i];
    const json& a = after["leases"][i];
    EXPECT_EQ(a["id"], b["id"]);
    EXPECT_EQ(a["state"], b["state"]);
    EXPECT_EQ(a["devices"], b["devices"]);
    EXPECT_EQ(a["over_base"], b["over_base"]);
  }
  EXPECT_TRUE(again.check_invariants().empty());
  // heartbeat telemetry came back from the batch table
  const json l2 = again.handle(api_call("GET", "/v1/leases/2", "admin-token")).body;
  EXPECT_EQ(l2["telemetry"]["step"], 100);
  // the pending approval survived and the audit numbering continues
  const json approvals = again.handle(api_call("GET", "/v1/approvals", "admin-token")).body;
  ASSERT_EQ(approvals["approvals"].size(), 1u);
  EXPECT_EQ(approvals["approvals"][0]["state"], "pending");
  ASSERT_EQ(again.handle(api_call("POST", "/v1/approvals/1/approve", "dave-token")).status, 200);
  const json audit = again.handle(api_call("GET", "/v1/audit?limit=1000", "admin-token")).body["audit"];
  EXPECT_GT(static_cast<int64_t>(audit.size()), audit_count);
  for (size_t i = 0; i < audit.size(); ++i) EXPECT_EQ(audit[i]["seq"], static_cast<int64_t>(i) + 1);
}

// Quotad restarted with node-b gone from the inventory (here: named node-z, without UUIDs to match).
// Its leases end at start, audited and stored before anything is served: a second restart loads them ended,
// and the cluster is granted again without counting a GPU twice. A member's critical request for all 20 GPUs is
// refused with the policy key; nothing is revoked.
TEST(QuotaService, ARestartWithoutANodeEndsItsLeasesAuditedAndStored) {
  const std::string db = temp_db("node_gone");
  Clock clock;
  ServiceOptions o;
  o.db_path = db;
  o.clock = clock.fn();
  std::vector<int64_t> on_b;
  {
    QuotaService s(testing::example_policy(), o);
    for (int i = 0; i < 14; ++i) {
      const ApiResponse r = s.handle(api_call("POST", "/v1/leases", "alice-token", R"({"model":"yolov8s"})"));
      ASSERT_EQ(r.status, 201);
      if (r.body["lease"]["devices"][0].get<std::string>().rfind("node-b:", 0) == 0) on_b.push_back(r.body["lease_id"]);
    }
  }
  ASSERT_FALSE(on_b.empty());
  Policy renamed = testing::example_policy();
  for (auto& gpu : renamed.gpus) {
    if (gpu.node == "node-b") gpu.node = "node-z";
  }
  for (auto& node : renamed.nodes) {
    if (node.name == "node-b") node.name = "node-z";
  }
  *clock.t += kMinute;
  for (int restart = 0; restart < 2; ++restart) {
    QuotaService s(renamed, o);
    for (int64_t id : on_b) {
      const json lease = s.handle(api_call("GET", "/v1/leases/" + std::to_string(id), "admin-token")).body;
      EXPECT_EQ(lease["state"], "expired") << "restart " << restart << ", lease " << id;
    }
    EXPECT_TRUE(s.check_invariants().empty());
  }
  QuotaService s(renamed, o);
  const json audit = s.handle(api_call("GET", "/v1/audit?limit=1000", "admin-token")).body["audit"];
  int ended = 0;
  for (const json& entry : audit) {
    if (entry["action"] == "lease.expired" &&
        entry["detail"].get<std::string>().find("node node-b") != std::string::npos) {
      ++ended;
    }
  }
  EXPECT_EQ(ended, static_cast<int>(on_b.size()));  // once each, stored, not again at the second restart
  const ApiResponse critical = s.handle(
      api_call("POST", "/v1/leases", "dave-token",
               R"({"model":"yolov8s","gpus":20,"priority":"critical","justification":"production regression"})"));
  EXPECT_EQ(critical.status, 403) << critical.body.dump();
  EXPECT_NE(critical.body.dump().find("emergency.max_gpus_per_request"), std::string::npos) << critical.body.dump();
  const json leases = s.handle(api_call("GET", "/v1/leases", "admin-token")).body["leases"];
  for (const json& lease : leases) EXPECT_NE(lease["state"], "revoking") << lease.dump();
}

// After a restart where the newest leases ended long ago (so none is loaded into memory), the next
// lease and approval ids still continue the sequence instead of overwriting old rows.
TEST(QuotaService, IdsAreNeverReusedAfterOldLeasesLeaveMemory) {
  const std::string db = temp_db("ids");
  Clock clock;
  ServiceOptions o;
  o.db_path = db;
  o.clock = clock.fn();
  int64_t highest_lease = 0;
  {
    QuotaService s(testing::example_policy(), o);
    for (int i = 0; i < 3; ++i) {
      const json r = s.handle(api_call("POST", "/v1/leases", "alice-token", R"({"model":"yolov8s"})")).body;
      highest_lease = std::max<int64_t>(highest_lease, r["lease_id"].get<int64_t>());
    }
    const json pending =
        s.handle(api_call("POST", "/v1/leases", "bob-token", R"({"model":"yolov8x","justification":"x"})")).body;
    ASSERT_EQ(pending["approval_id"], 1);
    highest_lease = std::max<int64_t>(highest_lease, pending["lease_id"].get<int64_t>());
    ASSERT_EQ(s.handle(api_call("POST", "/v1/approvals/1/reject", "carol-token")).status, 200);
    for (int64_t id = 1; id <= 3; ++id) {
      ASSERT_EQ(s.handle(api_call("POST", "/v1/leases/" + std::to_string(id) + "/release", "alice-token")).status, 200);
    }
  }
  *clock.t += 3 * 24 * kHour;  // every lease ended more than keep_ended_ms (a day) ago
  QuotaService again(testing::example_policy(), o);
  again.inspect([](const Engine& engine) { EXPECT_TRUE(engine.leases().empty()); });
  const json next = again.handle(api_call("POST", "/v1/leases", "alice-token", R"({"model":"yolov8s"})")).body;
  EXPECT_GT(next["lease_id"].get<int64_t>(), highest_lease) << next.dump();
  const json next_approval =
      again.handle(api_call("POST", "/v1/leases", "bob-token", R"({"model":"yolov8x","justification":"y"})")).body;
  EXPECT_EQ(next_approval["approval_id"], 2) << next_approval.dump();
  EXPECT_GT(next_approval["lease_id"].get<int64_t>(), next["lease_id"].get<int64_t>());
  // the old rows are intact: lease 1 still reads as alice's released lease
  const json old = again.handle(api_call("GET", "/v1/audit?limit=1000", "admin-token")).body["audit"];
  for (size_t i = 0; i < old.size(); ++i) EXPECT_EQ(old[i]["seq"], static_cast<int64_t>(i) + 1);
}

TEST(QuotaService, RestartWithAReorderedInventoryKeepsLeasesOnTheirGpus) {
  const std::string db = temp_db("reorder");
  auto policy = [](bool swapped) {
    const std::string a = "    - {name: big, gpus: 2, memory_gib: 80}\n";
    const std::string b = "    - {name: small, gpus: 2, memory_gib: 24}\n";
    return load_policy_from_string(
        "inventory:\n  nodes:\n" + (swapped ? b + a : a + b) +
            "users:\n  alice: {token_sha256: "
            "9c220f200955d76c0a38d308225e0ef10c5f971acaf2f8d1d8f732affa5bd1dc}\n"
            "teams:\n  t: {base: 4, members: [alice]}\ncredits: {monthly_gpu_hours: 0}\nemergency_pool: 0\n",
        "reorder.yaml");
  };
  ServiceOptions o;
  o.db_path = db;
  json first;
  {
    QuotaService s(policy(false), o);
    ASSERT_EQ(s.handle(api_call("POST", "/v1/leases", "alice-token", R"({"gpus":2,"memory_gib":40})")).status, 201);
    first = s.handle(api_call("GET", "/v1/leases/1", "alice-token")).body;
    ASSERT_EQ(first["devices"], json({"big:0", "big:1"}));
  }
  QuotaService s(policy(true), o);
  EXPECT_EQ(s.handle(api_call("GET", "/v1/leases/1", "alice-token")).body["devices"], first["devices"]);
  // the two big GPUs stay taken: a second 40 GiB request waits
  EXPECT_EQ(s.handle(api_call("POST", "/v1/leases", "alice-token", R"({"gpus":1,"memory_gib":40})")).status, 202);
  EXPECT_TRUE(s.check_invariants().empty());
}

TEST(QuotaService, AuditTableIsAppendOnly) {
  const std::string db = temp_db("audit");
  {
    ServiceOptions o;
    o.db_path = db;
    QuotaService s(testing::example_policy(), o);
    ASSERT_EQ(s.handle(api_call("POST", "/v1/leases", "alice-token", "{}")).status, 201);
  }
  sqlite3* raw = nullptr;
  ASSERT_EQ(sqlite3_open(db.c_str(), &raw), SQLITE_OK);
  EXPECT_NE(sqlite3_exec(raw, "UPDATE audit SET detail = 'x'", nullptr, nullptr, nullptr), SQLITE_OK);
  EXPECT_NE(sqlite3_exec(raw, "DELETE FROM audit", nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_stmt* st = nullptr;
  sqlite3_prepare_v2(raw, "PRAGMA journal_mode", -1, &st, nullptr);
  ASSERT_EQ(sqlite3_step(st), SQLITE_ROW);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(sqlite3_column_text(st, 0))), "wal");
  sqlite3_finalize(st);
  sqlite3_close(raw);
}

TEST(QuotaService, AuthenticationRolesAndErrorsCarryReasons) {
  QuotaService s(testing::example_policy(), ServiceOptions{});
  struct Case {
    ApiRequest req;
    int status;
  };
  ASSERT_EQ(
      s.handle(api_call("POST", "/v1/leases", "alice-token", R"({"model":"yolov8l","justification":"j"})")).status,
      403);
  ASSERT_EQ(s.handle(api_call("POST", "/v1/leases", "alice-token", "{}")).status, 201);  // lease 2
  const std::vector<Case> cases = {
      {api_call("GET", "/v1/teams", ""), 401},
      {api_call("GET", "/v1/teams", "nope"), 401},
      {api_call("POST", "/v1/leases", "alice-token", "{not json"), 400},
      {api_call("POST", "/v1/leases", "alice-token", "[1,2,3]"), 400},
      {api_call("POST", "/v1/leases", "alice-token", R"({"gpus":"two"})"), 400},
      {api_call("POST", "/v1/leases", "alice-token", R"({"gpus":1.5})"), 400},
      {api_call("POST", "/v1/leases", "alice-token", R"({"gpus":1e300})"), 400},
      {api_call("POST", "/v1/leases", "alice-token", R"({"priority":"urgent"})"), 400},
      {api_call("POST", "/v1/leases", "alice-token", R"({"imgsz":-640})"), 400},
      {api_call("POST", "/v1/leases", "alice-token", std::string(30000, '[') + std::string(30000, ']')), 400},
      {api_call("POST", "/v1/leases", "alice-token", R"({"team":"team-robotics"})"), 403},
      {api_call("POST", "/v1/leases", "alice-token", R"({"user":"bob"})"), 403},
      {api_call("POST", "/v1/leases", "alice-token", R"({"model":"yolov8x","batch":4096})"), 400},
      {api_call("POST", "/v1/leases", "alice-token", R"({"model":"yolov8x","batch":1000,"justification":"j"})"), 422},
      {api_call("POST", "/v1/approvals/1/approve", "alice-token"), 403},  // a member
      {api_call("POST", "/v1/approvals/1/approve", "dave-token"), 403},   // lead of another team
      {api_call("POST", "/v1/approvals/99/approve", "carol-token"), 404},
      {api_call("GET", "/v1/approvals", "bob-token"), 403},
      {api_call("GET", "/v1/audit", "bob-token"), 403},
      {api_call("GET", "/v1/leases/999", "alice-token"), 404},
      {api_call("GET", "/v1/leases/abc", "alice-token"), 404},
      {api_call("GET", "/v1/leases/2", "erin-token"), 403},
      {api_call("POST", "/v1/leases/2/heartbeat", "erin-token", "{}"), 403},
      {api_call("POST", "/v1/leases/2/heartbeat", "alice-token", R"({"gpu_util":"high"})"), 400},
      {api_call("POST", "/v1/leases/2/release", "alice-token", R"({"outcome":"exploded"})"), 400},
      {api_call("POST", "/v1/leases/2/release", "bob-token", "{}"), 403},  // same team, not the owner, not a lead
      {api_call("GET", "/v1/nothing", "alice-token"), 404},
      {api_call("POST", "/v1/approvals/1/approve", "carol-token"), 200},
      {api_call("POST", "/v1/approvals/1/approve", "carol-token"), 409},
      {api_call("POST", "/v1/leases/2/release", "carol-token", R"({"outcome":"cancelled"})"), 200},  // lead of the team
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const ApiResponse r = s.handle(cases[i].req);
    EXPECT_EQ(r.status, cases[i].status) << "case " << i << ": " << cases[i].req.method << " " << cases[i].req.path
                                         << " " << cases[i].req.body.substr(0, 60) << " -> " << r.body.dump();
    if (r.status >= 400) {
      EXPECT_TRUE(r.body.contains("reason") && !r.body["reason"].get<std::string>().empty()) << "case " << i;
    }
  }
  EXPECT_EQ(s.handle(api_call("GET", "/healthz", "")).status, 200);
  EXPECT_TRUE(s.check_invariants().empty());
}

TEST(QuotaService, IdempotencyKeyHeaderReplaysTheLease) {
  QuotaService s(testing::example_policy(), ServiceOptions{});
  ApiRequest r = api_call("POST", "/v1/leases", "alice-token", R"({"gpus":1})");
  r.idempotency_key = "retry-1";
  const ApiResponse a = s.handle(r);
  const ApiResponse b = s.handle(r);
  ASSERT_EQ(a.status, 201);
  EXPECT_EQ(b.status, 201);
  EXPECT_EQ(a.body["lease_id"], b.body["lease_id"]);
  EXPECT_EQ(b.body["replayed"], true);
  r.idempotency_key = std::string(200, 'k');
  EXPECT_EQ(s.handle(r).status, 400);
}

// GET /v1/queue lists the queue in order with each request's reason and fair-share standing.
TEST(QuotaService, QueueRouteListsTheOrderWithReasons) {
  QuotaService s(testing::example_policy(), ServiceOptions{});
  for (int i = 0; i < 6; ++i) ASSERT_EQ(s.handle(api_call("POST", "/v1/leases", "erin-token", "{}")).status, 201);
  ASSERT_EQ(s.handle(api_call("POST", "/v1/leases", "erin-token", R"({"job":"second"})")).status, 202);
  ASSERT_EQ(s.handle(api_call("POST", "/v1/leases", "dave-token", R"({"job":"urgent","priority":"high"})")).status,
            202);
  const ApiResponse r = s.handle(api_call("GET", "/v1/queue", "alice-token"));  // any member may read it
  ASSERT_EQ(r.status, 200) << r.body.dump();
  const nlohmann::json& queue = r.body.at("queue");
  ASSERT_EQ(queue.size(), 2u);
  EXPECT_EQ(queue[0].at("job"), "urgent");  // priority first
  EXPECT_EQ(queue[0].at("position"), 1);
  EXPECT_EQ(queue[1].at("job"), "second");
  EXPECT_NE(queue[1].at("reason").get<std::string>().find("team-robotics uses 6.0 of the 6.0"), std::string::npos);
  EXPECT_NE(queue[1].at("reason").get<std::string>().find("fair share"), std::string::npos);  // the example has it
  EXPECT_TRUE(queue[1].at("fair_share").contains("factor"));
  EXPECT_FALSE(queue[1].contains("justification"));
  EXPECT_EQ(s.handle(api_call("GET", "/v1/queue", "")).status, 401);
  const ApiResponse post = s.handle(api_call("POST", "/v1/queue", "alice-token", "{}"));
  EXPECT_EQ(post.status, 405);
  EXPECT_EQ(post.headers.at("Allow"), "GET");
}

TEST(QuotaService, MetricsExposeTeamsAndStates) {
  QuotaService s(testing::example_policy(), ServiceOptions{});
  s.handle(api_call("POST", "/v1/leases", "alice-token", R"({"gpus":2})"));
  const std::string m = MetricsExporter(s).text();
  EXPECT_NE(m.find("quotad_team_gpus_in_use{team=\"team-cv\"} 2"), std::string::npos) << m;
  EXPECT_NE(m.find("quotad_leases{state=\"granted\"} 1"), std::string::npos) << m;
  EXPECT_NE(m.find("quotad_gpus 20"), std::string::npos);
  EXPECT_NE(m.find("quotad_member_credit_gpu_seconds{month="), std::string::npos) << m;
  EXPECT_NE(m.find("quotad_member_gpu_seconds{month="), std::string::npos) << m;
}

// Through the API, a node or GPU UUID the inventory contradicts is a 400 naming it; a matched lease
// shows its GPUs' UUIDs, and keeps them across a restart.
TEST(QuotaService, PinnedRequestsAreMatchedOrRefusedWithTheReason) {
  const std::string db = temp_db("pinned");
  Clock clock;
  ServiceOptions o;
  o.db_path = db;
  o.clock = clock.fn();
  const std::string seen = "GPU-c0000000-0000-4000-8000-000000000002";  // node-c:2 in configs/quota-policy.yaml
  {
    QuotaService s(testing::example_policy(), o);
    ApiResponse r = s.handle(api_call("POST", "/v1/leases", "alice-token", R"({"node":"gpu-node-7"})"));
    EXPECT_EQ(r.status, 400);
    EXPECT_NE(r.body["reason"].get<std::string>().find("node: 'gpu-node-7'"), std::string::npos) << r.body.dump();
    EXPECT_NE(r.body["reason"].get<std::string>().find("(node-a, node-b, node-c)"), std::string::npos) << r.body.dump();
    r = s.handle(api_call("POST", "/v1/leases", "alice-token",
                          R"({"node":"node-c","visible_devices":["GPU-c0000000-0000-4000-8000-000000000009"]})"));
    EXPECT_EQ(r.status, 400);
    EXPECT_NE(r.body["reason"].get<std::string>().find(
                  "visible_devices: GPU-c0000000-0000-4000-8000-000000000009 (a GPU the trainer sees) is not a GPU"),
              std::string::npos)
        << r.body.dump();
    r = s.handle(api_call("POST", "/v1/leases", "alice-token", json{{"visible_devices", {seen}}}.dump()));
    ASSERT_EQ(r.status, 201) << r.body.dump();
    EXPECT_EQ(r.body["lease"]["devices"], json({"node-c:2"}));
    EXPECT_EQ(r.body["lease"]["device_uuids"], json({seen}));
    r = s.handle(api_call("POST", "/v1/leases", "bob-token", R"({"node":"node-b","gpus":2})"));
    ASSERT_EQ(r.status, 201) << r.body.dump();
    EXPECT_EQ(r.body["lease"]["devices"][0].get<std::string>().substr(0, 6), "node-b");
    EXPECT_FALSE(r.body["lease"].contains("device_uuids")) << "node-b lists no UUIDs";
    EXPECT_TRUE(s.check_invariants().empty());
  }
  QuotaService again(testing::example_policy(), o);
  const ApiResponse r = again.handle(api_call("GET", "/v1/leases/1", "alice-token"));
  ASSERT_EQ(r.status, 200);
  EXPECT_EQ(r.body["devices"], json({"node-c:2"}));
  EXPECT_EQ(r.body["request"]["visible_devices"], json({seen}));
  const auto errors = again.check_invariants();
  EXPECT_TRUE(errors.empty()) << errors.front();
}

// One route table. A method the path does not answer gets 405 with the table's methods in Allow.
TEST(QuotaRoutes, AnUnansweredMethodGets405WithAllowFromTheTable) {
  QuotaService s(testing::example_policy(), ServiceOptions{});
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"/v1/leases", "GET, POST"}, {"/v1/leases/1", "GET"},    {"/v1/leases/1/heartbeat", "POST"},
      {"/v1/approvals", "GET"},    {"/v1/loans", "GET, POST"}, {"/v1/credits", "GET, POST"},
      {"/v1/balance", "GET"},      {"/healthz", "GET"},        {"/metrics", "GET"}};
  for (const auto& [path, allowed] : cases) {
    const ApiResponse answer = s.handle(api_call("DELETE", path, "alice-token"));
    EXPECT_EQ(answer.status, 405) << path;
    EXPECT_EQ(answer.headers.count("Allow") ? answer.headers.at("Allow") : "", allowed) << path;
    EXPECT_EQ(QuotaService::match_route("DELETE", path).allowed, allowed) << path;
  }
  EXPECT_EQ(s.handle(api_call("GET", "/v1/nothing", "alice-token")).status, 404);
  EXPECT_EQ(s.handle(api_call("GET", "/v1/leases/1/heartbeat/x", "alice-token")).status, 404);
  // the pages belong to the HTTP front: the embedded service has none
  EXPECT_EQ(s.handle(api_call("GET", "/metrics", "")).status, 404);
  EXPECT_EQ(s.handle(api_call("GET", "/healthz", "")).status, 200);
}

// The heartbeat lane came from a request-line prefix, so POST /v1/leases/?x=/heartbeat reached the
// heartbeat workers and acquired a lease there. The lane is the table's now, decided on the path alone.
TEST(QuotaRoutes, OnlyTheHeartbeatAndTheProbesTakeTheFastLane) {
  EXPECT_EQ(QuotaService::match_route("POST", "/v1/leases/").lane(), RouteLane::kApi);
  EXPECT_EQ(QuotaService::routes()[static_cast<size_t>(QuotaService::match_route("POST", "/v1/leases/").index)].pattern,
            "/v1/leases");
  EXPECT_EQ(QuotaService::match_route("POST", "/v1/leases/7/heartbeat").lane(), RouteLane::kFast);
  EXPECT_EQ(QuotaService::match_route("GET", "/healthz").lane(), RouteLane::kFast);
  EXPECT_EQ(QuotaService::match_route("GET", "/readyz").lane(), RouteLane::kFast);
  EXPECT_EQ(QuotaService::match_route("GET", "/v1/leases/7/heartbeat").lane(), RouteLane::kApi);  // 405
  EXPECT_EQ(QuotaService::match_route("POST", "/v1/leases/7/release").lane(), RouteLane::kApi);
  EXPECT_EQ(QuotaService::match_route("POST", "/v1/heartbeat").lane(), RouteLane::kApi);  // 404
  int fast = 0;
  for (const RouteSpec& route : QuotaService::routes()) fast += route.lane == RouteLane::kFast;
  EXPECT_EQ(fast, 3);
  // and the service routes that request by its path: an acquire, under the normal rules
  QuotaService s(testing::example_policy(), ServiceOptions{});
  ApiRequest tricky = api_call("POST", "/v1/leases/?x=/heartbeat", "alice-token", "{}");
  const ApiResponse answer = s.handle(tricky);
  EXPECT_EQ(answer.status, 201) << answer.serialized();
  EXPECT_EQ(s.handle(api_call("POST", "/v1/leases/?x=/heartbeat", "nope", "{}")).status, 401);
}

// The heartbeat's authorization was a copy of can_act's rule on the server's path (answered from the
// board); one rule now, and both paths answer alike: the holder, a lead of its team and an admin may beat,
// a teammate and another team's member may not.
TEST(QuotaRoutes, HeartbeatAuthorizationIsOneRuleOnTheBoardAndUnderTheLock) {
  ServiceOptions local;
  local.db_path = temp_db("heartbeat_rule");
  local.reload_per_call = true;  // local mode: the heartbeat goes through the engine lock
  QuotaService board(testing::example_policy(), ServiceOptions{});
  QuotaService locked(testing::example_policy(), local);
  for (QuotaService* s : {&board, &locked}) {
    const char* path_name = s == &board ? "board" : "locked";
    ApiRequest acquire = api_call("POST", "/v1/leases", "", "{}");
    acquire.trusted_user = "alice";
    const ApiResponse granted = s->handle(acquire);
    ASSERT_EQ(granted.status, 201) << path_name << " " << granted.serialized();
    const std::string beat_path =
        "/v1/leases/" + std::to_string(granted.body["lease_id"].get<int64_t>()) + "/heartbeat";
    const std::vector<std::pair<std::string, int>> callers = {
        {"alice", 200}, {"carol", 200}, {"admin", 200}, {"bob", 403}, {"erin", 403}};
    for (const auto& [user, status] : callers) {
      ApiRequest beat = api_call("POST", beat_path, "", "{}");
      beat.trusted_user = user;
      EXPECT_EQ(s->handle(beat).status, status) << user << " on the " << path_name << " path";
    }
  }
}

// For free with the table: a 404 or 405 names neither the caller's path nor its method, so a long
// path gets a short answer.
TEST(QuotaRoutes, RefusalsDoNotEchoThePath) {
  QuotaService s(testing::example_policy(), ServiceOptions{});
  const std::string filler(8000, 'x');
  for (const auto& [method, path, status] :
       std::vector<std::tuple<std::string, std::string, int>>{{"GET", "/v1/" + filler, 404},
                                                              {"GET", "/v1/leases/" + filler, 404},
                                                              {"DELETE", "/v1/leases/" + filler, 405},
                                                              {"POST", "/v1/approvals/" + filler + "/approve", 404}}) {
    const ApiResponse answer = s.handle(api_call(method, path, "alice-token", "{}"));
    EXPECT_EQ(answer.status, status) << method << " " << path.size();
    EXPECT_LT(answer.serialized().size(), 200u) << answer.serialized().substr(0, 100);
    EXPECT_EQ(answer.serialized().find("xxxx"), std::string::npos);
  }
}

// The route list in quota/README.md is the table, line for line.
TEST(QuotaRoutes, ReadmeListsTheRouteTable) {
  std::ifstream readme(std::string(yolo8::test::kSourceDir) + "/quota/README.md");
  ASSERT_TRUE(readme) << "quota/README.md";
  std::string line;
  while (std::getline(readme, line) && line.rfind("<!-- route table", 0) != 0) {
  }
  ASSERT_TRUE(std::getline(readme, line));
  ASSERT_EQ(line, "```text") << "the route list must follow its marker";
  std::vector<std::string> listed;
  while (std::getline(readme, line) && line != "```") {
    std::istringstream fields(line);
    std::string method, pattern, access, lane;
    fields >> method >> pattern >> access >> lane;
    listed.push_back(method + " " + pattern + " " + access + " " + lane);
  }
  std::vector<std::string> table;
  for (const RouteSpec& route : QuotaService::routes()) {
    table.push_back(route.method + " " + route.pattern + " " + to_string(route.access) + " " + to_string(route.lane));
  }
  EXPECT_EQ(listed, table);
}

// The wall clock steps by `step_ms` while the monotonic clock runs on; the server ticks every second
// (outage detection as the server sets it). ttl 6 s.
struct SteppedClocks {
  Clock wall;
  Clock monotonic;
  void advance(int64_t ms) {
    *wall.t += ms;
    *monotonic.t += ms;
  }
};

Policy six_second_ttl_policy() {
  Policy policy = testing::example_policy();
  policy.ttl_s = 6;
  policy.heartbeat_interval_s = 2;
  return policy;
}

ServiceOptions stepped_options(const SteppedClocks& clocks) {
  ServiceOptions o;
  o.clock = clocks.wall.fn();
  o.monotonic_clock = clocks.monotonic.fn();
  o.outage_after_ms = 3000;
  return o;
}

int count_audit(QuotaService& s, const std::string& action) {
  int count = 0;
  const json audit = s.handle(api_call("GET", "/v1/audit?limit=1000", "admin-token")).body["audit"];
  for (const json& entry : audit) {
    count += entry["action"] == action ? 1 : 0;
  }
  return count;
}

TEST(QuotaService, AfterTheClockStepsBackALeaseWithoutHeartbeatsExpiresOnTime) {
  SteppedClocks clocks;
  QuotaService s(six_second_ttl_policy(), stepped_options(clocks));
  ASSERT_EQ(s.handle(api_call("POST", "/v1/leases", "alice-token", R"({"model":"yolov8s"})")).status, 201);
  for (int i = 0; i < 3; ++i) {
    clocks.advance(1000);
    ASSERT_EQ(s.handle(api_call("POST", "/v1/leases/1/heartbeat", "alice-token", "{}")).status, 200);
    s.tick();
  }
  *clocks.wall.t -= 2 * kHour;  // NTP steps the wall clock back; the job dies with it
  for (int i = 0; i < 6; ++i) {
    clocks.advance(1000);
    s.tick();
    ASSERT_EQ(s.handle(api_call("GET", "/v1/leases/1", "alice-token")).body["state"], "granted") << i + 1 << " s";
  }
  clocks.advance(1000);
  s.tick();  // 7 s without a heartbeat, ttl 6 s
  const json lease = s.handle(api_call("GET", "/v1/leases/1", "alice-token")).body;
  EXPECT_EQ(lease["state"], "expired");
  EXPECT_EQ(count_audit(s, "clock.step"), 1);
  EXPECT_EQ(count_audit(s, "quotad.outage"), 0);
  EXPECT_TRUE(s.check_invariants().empty());
}

TEST(QuotaService, AfterTheClockStepsForwardAnEightGpuLeaseIsBilledItsRealSeconds) {
  SteppedClocks clocks;
  QuotaService s(six_second_ttl_policy(), stepped_options(clocks));
  ASSERT_EQ(s.handle(api_call("POST", "/v1/leases", "alice-token", R"({"model":"yolov8s","gpus":8})")).status, 201);
  auto beat_and_tick = [&] {
    clocks.advance(1000);
    ASSERT_EQ(s.handle(api_call("POST", "/v1/leases/1/heartbeat", "alice-token", "{}")).status, 200);
    s.tick();
  };
  for (int i = 0; i < 3; ++i) beat_and_tick();
  *clocks.wall.t += 2 * kHour;
  for (int i = 0; i < 3; ++i) beat_and_tick();
  ASSERT_EQ(s.handle(api_call("POST", "/v1/leases/1/release", "alice-token", R"({"outcome":"completed"})")).status,
            200);
  const json lease = s.handle(api_call("GET", "/v1/leases/1", "alice-token")).body;
  EXPECT_EQ(lease["state"], "released");
  // 6 s on 8 GPUs, not 2 h on 8 GPUs (16 GPU-hours)
  EXPECT_NEAR(lease["gpu_hours"].get<double>(), 6.0 * 8 / 3600, 1e-9);
  EXPECT_EQ(count_audit(s, "clock.step"), 1);
  EXPECT_EQ(count_audit(s, "quotad.outage"), 0);
}

// The utilisation tracker follows a step too. A lease at 5 % utilisation heartbeats every second for
// 3 s, the wall clock steps by ±2 h, 3 more: its samples cover 5 s and it has been low for 5 s (before the fix a
// step forward counted 2 h of low time, and a step back dropped every later sample as out of order).
TEST(QuotaService, AClockStepMovesTheUtilisationTrackersTimesToo) {
  for (const int64_t step : {2 * kHour, -2 * kHour}) {
    SteppedClocks clocks;
    QuotaService s(six_second_ttl_policy(), stepped_options(clocks));
    ASSERT_EQ(s.handle(api_call("POST", "/v1/leases", "alice-token", R"({"model":"yolov8s"})")).status, 201);
    auto beat_and_tick = [&] {
      clocks.advance(1000);
      ASSERT_EQ(s.handle(api_call("POST", "/v1/leases/1/heartbeat", "alice-token", R"({"gpu_util":0.05})")).status,
                200);
      s.tick();
    };
    for (int i = 0; i < 3; ++i) beat_and_tick();
    *clocks.wall.t += step;
    for (int i = 0; i < 3; ++i) beat_and_tick();
    s.observe([&](const ServiceView& view) {
      const LeaseUtil* util = view.tracker.find(1);
      ASSERT_NE(util, nullptr);
      EXPECT_EQ(util->samples, 6) << "step " << step;
      EXPECT_EQ(util->covered_ms, 5000) << "step " << step;
      EXPECT_EQ(util->low_ms(view.now_ms), 5000) << "step " << step;
      EXPECT_EQ(util->last_ts_ms, view.now_ms) << "step " << step;
    });
    EXPECT_EQ(count_audit(s, "clock.step"), 1);
  }
}

// Local mode (each call reloads the shared database) follows a step too, once for all its processes:
// the wall clock's offset against the monotonic clock is kept in the database. Before, a step forward expired
// every lease at the next call (2 h without a heartbeat), and after a step back a dead job's lease stayed 2 h.
TEST(QuotaService, LocalModeFollowsAClockStepOnceAcrossItsProcesses) {
  for (const int64_t step : {2 * kHour, -2 * kHour}) {
    SteppedClocks clocks;
    ServiceOptions o = stepped_options(clocks);
    o.db_path = temp_db(step > 0 ? "local_step_forward" : "local_step_back");
    o.reload_per_call = true;
    QuotaService first(six_second_ttl_policy(), o);
    QuotaService second(six_second_ttl_policy(), o);  // another trainer's process on the same workstation
    ASSERT_EQ(first.handle(api_call("POST", "/v1/leases", "alice-token", R"({"model":"yolov8s","gpus":8})")).status,
              201);
    ASSERT_EQ(second.handle(api_call("POST", "/v1/leases", "erin-token", R"({"model":"yolov8s"})")).status, 201);
    auto beat = [&](QuotaService& s, int64_t id, const std::string& token) {
      return s.handle(api_call("POST", "/v1/leases/" + std::to_string(id) + "/heartbeat", token, "{}"))
          .body["state"]
          .get<std::string>();
    };
    for (int i = 0; i < 3; ++i) {
      clocks.advance(1000);
      ASSERT_EQ(beat(first, 1, "alice-token"), "granted");
      ASSERT_EQ(beat(second, 2, "erin-token"), "granted");
    }
    *clocks.wall.t += step;  // lease 2's job dies with the step
    for (int i = 1; i <= 6; ++i) {
      clocks.advance(1000);
      ASSERT_EQ(beat(i % 2 == 0 ? first : second, 1, "alice-token"), "granted") << "step " << step << ", " << i;
      EXPECT_EQ(second.handle(api_call("GET", "/v1/leases/2", "erin-token")).body["state"], "granted")
          << "step " << step << ", silent for " << i << " s";
    }
    clocks.advance(1000);
    EXPECT_EQ(beat(second, 1, "alice-token"), "granted");
    EXPECT_EQ(first.handle(api_call("GET", "/v1/leases/2", "erin-token")).body["state"], "expired")
        << "step " << step << ", silent for 7 s, ttl 6 s";
    const json released =
        first.handle(api_call("POST", "/v1/leases/1/release", "alice-token", R"({"outcome":"completed"})")).body;
    EXPECT_EQ(released["state"], "released");
    EXPECT_NEAR(released["gpu_hours"].get<double>(), 10.0 * 8 / 3600, 1e-9) << "step " << step;  // 10 real s
    EXPECT_EQ(count_audit(first, "clock.step"), 1) << "step " << step;
  }
}

// A real outage (the monotonic clock moved too) is still credited, and slow drift is no step.
TEST(QuotaService, AnOutageIsStillCreditedAndDriftIsNoStep) {
  SteppedClocks clocks;
  QuotaService s(six_second_ttl_policy(), stepped_options(clocks));
  ASSERT_EQ(s.handle(api_call("POST", "/v1/leases", "alice-token", R"({"model":"yolov8s"})")).status, 201);
  clocks.advance(1000);
  s.tick();
  for (int i = 0; i < 40; ++i) {  // 1 s a tick of drift, 40 s in all: above the step threshold, never in one go
    *clocks.wall.t += 1000;
    ASSERT_EQ(s.handle(api_call("POST", "/v1/leases/1/heartbeat", "alice-token", "{}")).status, 200);
    s.tick();
  }
  clocks.advance(20000);  // quotad stalled for 20 s
  s.tick();
  EXPECT_EQ(s.handle(api_call("GET", "/v1/leases/1", "alice-token")).body["state"], "granted");
  EXPECT_EQ(count_audit(s, "clock.step"), 0);
  EXPECT_EQ(count_audit(s, "quotad.outage"), 1);
}

// The monotonic clock starts afresh with each process: a wall clock set back while quotad was down shows only
// in the store, as a live lease last seen after the new now.
TEST(QuotaService, AClockSetBackWhileQuotadWasDownDoesNotKeepADeadJobsGpus) {
  const std::string db = temp_db("clock_back");
  SteppedClocks clocks;
  ServiceOptions o = stepped_options(clocks);
  o.db_path = db;
  {
    QuotaService s(six_second_ttl_policy(), o);
    ASSERT_EQ(s.handle(api_call("POST", "/v1/leases", "alice-token", R"({"model":"yolov8s"})")).status, 201);
    clocks.advance(1000);
    ASSERT_EQ(s.handle(api_call("POST", "/v1/leases/1/heartbeat", "alice-token", "{}")).status, 200);
    s.flush_heartbeats();
    s.tick();
  }
  *clocks.wall.t -= 2 * kHour;  // and the job died while quotad was down
  *clocks.monotonic.t = 0;      // a new process
  QuotaService again(six_second_ttl_policy(), o);
  for (int i = 0; i < 6; ++i) {
    clocks.advance(1000);
    again.tick();
  }
  EXPECT_EQ(again.handle(api_call("GET", "/v1/leases/1", "alice-token")).body["state"], "granted");
  clocks.advance(1000);
  again.tick();
  EXPECT_EQ(again.handle(api_call("GET", "/v1/leases/1", "alice-token")).body["state"], "expired");
  EXPECT_EQ(count_audit(again, "clock.step"), 1);
}

// The same, past the moment an expired lease's GPU went back to the pool and to another lease: that lease keeps it
// alone, and the load finds nothing unsound (before, the load checked the state before following the step, and the
// step left the expired lease holding the GPU again, beside the lease that had it).
TEST(QuotaService, AClockSetBackWhileQuotadWasDownDoesNotGiveAnExpiredLeaseItsReturnedGpuAgain) {
  const std::string db = temp_db("clock_back_returned");
  SteppedClocks clocks;
  ServiceOptions o = stepped_options(clocks);
  o.db_path = db;
  const std::string on_gpu0 = R"({"model":"yolov8s","node":"node-c","node_gpus":[0]})";
  {
    QuotaService s(six_second_ttl_policy(), o);
    ASSERT_EQ(s.handle(api_call("POST", "/v1/leases", "erin-token", on_gpu0)).status, 201);
    // erin's job dies: expired after 6 s without a heartbeat, its GPU back after the 30 s expiry grace
    for (int i = 0; i < 40; ++i) {
      clocks.advance(1000);
      s.tick();
    }
    ASSERT_EQ(s.handle(api_call("GET", "/v1/leases/1", "erin-token")).body["state"], "expired");
    ASSERT_EQ(s.handle(api_call("POST", "/v1/leases", "alice-token", on_gpu0)).status, 201);
    clocks.advance(1000);
    ASSERT_EQ(s.handle(api_call("POST", "/v1/leases/2/heartbeat", "alice-token", "{}")).status, 200);
    s.flush_heartbeats();
    s.tick();
  }
  *clocks.wall.t -= 40000;  // before erin's GPU went back
  *clocks.monotonic.t = 0;  // a new process
  QuotaService again(six_second_ttl_policy(), o);
  const std::vector<std::string> errors = again.check_invariants();
  EXPECT_TRUE(errors.empty()) << errors.front();
  EXPECT_EQ(count_audit(again, "state.unsound"), 0);
  EXPECT_EQ(count_audit(again, "clock.step"), 1);
  EXPECT_EQ(again.handle(api_call("GET", "/v1/leases/2", "alice-token")).body["state"], "granted");
}

// After a long stall (longer than the ttl) the first heartbeat is answered from the board before any tick: the
// outage is credited before that report reaches the engine, so the lease is neither expired nor billed short.
TEST(QuotaService, AnOutageIsCreditedBeforeTheFirstHeartbeatAfterIt) {
  SteppedClocks clocks;
  QuotaService s(six_second_ttl_policy(), stepped_options(clocks));
  ASSERT_EQ(s.handle(api_call("POST", "/v1/leases", "alice-token", R"({"model":"yolov8s"})")).status, 201);
  clocks.advance(1000);
  ASSERT_EQ(s.handle(api_call("POST", "/v1/leases/1/heartbeat", "alice-token", "{}")).status, 200);
  s.tick();
  clocks.advance(20000);  // quotad stalled for 20 s, over three ttls; the trainer kept training
  const ApiResponse beat = s.handle(api_call("POST", "/v1/leases/1/heartbeat", "alice-token", "{}"));
  ASSERT_EQ(beat.status, 200);
  EXPECT_EQ(beat.body["state"], "granted");
  s.tick();
  EXPECT_EQ(s.handle(api_call("GET", "/v1/leases/1", "alice-token")).body["state"], "granted");
  const json released = s.handle(api_call("POST", "/v1/leases/1/release", "alice-token", "{}")).body;
  // the trainer was heard from after the outage: the whole 21 s are its
  EXPECT_NEAR(released["gpu_hours"].get<double>(), 21.0 / 3600, 1e-9);
  EXPECT_EQ(count_audit(s, "quotad.outage"), 1);
}

// A database restored from a backup lacks the leases granted after it: their trainers present their grant receipts
// and get them back, their ids and GPUs kept; forged, someone else's or doubled receipts are refused.
TEST(QuotaService, LeasesARestoreLostAreReattachedFromTheirReceipts) {
  const std::string db = temp_db("reattach");
  Clock clock;
  ServiceOptions o;
  o.db_path = db;
  o.clock = clock.fn();
  json kept_receipt, lost_receipt, queued_receipt;
  {
    QuotaService s(testing::example_policy(), o);
    const ApiResponse kept = s.handle(api_call("POST", "/v1/leases", "alice-token", R"({"model":"yolov8s"})"));
    ASSERT_EQ(kept.status, 201);
    kept_receipt = kept.body["lease"]["receipt"];
    EXPECT_EQ(kept_receipt["user"], "alice");
    EXPECT_EQ(kept_receipt["devices"], kept.body["lease"]["devices"]);
    backup_database(db, clock.t->load());
    *clock.t += kMinute;
    const ApiResponse lost =
        s.handle(api_call("POST", "/v1/leases", "bob-token", R"({"model":"yolov8s","gpus":2,"job":"det"})"));
    ASSERT_EQ(lost.status, 201);
    lost_receipt = lost.body["lease"]["receipt"];
    // a receipt is also what polling a grant answers
    queued_receipt = s.handle(api_call("GET", "/v1/leases/2", "bob-token")).body["receipt"];
    EXPECT_EQ(queued_receipt, lost_receipt);
    EXPECT_FALSE(s.handle(api_call("GET", "/v1/leases/2", "alice-token")).body.contains("receipt"));
  }
  std::filesystem::remove(db);
  std::filesystem::remove(db + "-wal");
  std::filesystem::remove(db + "-shm");
  const RepairReport report = repair_database(db, clock.t->load());
  ASSERT_FALSE(report.restored_from.empty());
  *clock.t += kMinute;
  QuotaService s(testing::example_policy(), o);
  const std::string lost_path = "/v1/leases/2";
  const ApiResponse unknown = s.handle(api_call("POST", lost_path + "/heartbeat", "bob-token", "{}"));
  EXPECT_EQ(unknown.status, 404);
  EXPECT_EQ(unknown.body["reason"], "unknown lease 2");
  auto present = [&](const std::string& token, const json& receipt, int64_t id = 2) {
    return s.handle(
        api_call("POST", "/v1/leases/" + std::to_string(id) + "/reattach", token, json{{"receipt", receipt}}.dump()));
  };
  EXPECT_EQ(present("alice-token", lost_receipt).status, 403);
  json altered = lost_receipt;
  altered["devices"].push_back("node-b:7");
  const ApiResponse forged = present("bob-token", altered);
  EXPECT_EQ(forged.status, 400);
  EXPECT_NE(forged.body["reason"].get<std::string>().find("signature"), std::string::npos);
  EXPECT_EQ(present("bob-token", lost_receipt, 3).status, 400);    // the path names another lease
  EXPECT_EQ(present("alice-token", kept_receipt, 1).status, 409);  // the backup holds it: heartbeats keep it
  const ApiResponse back = present("bob-token", lost_receipt);
  ASSERT_EQ(back.status, 200) << back.serialized();
  EXPECT_EQ(back.body["state"], "granted");
  EXPECT_EQ(back.body["reattached"], true);
  EXPECT_EQ(s.handle(api_call("POST", lost_path + "/heartbeat", "bob-token", "{}")).body["state"], "granted");
  const json view = s.handle(api_call("GET", lost_path, "bob-token")).body;
  EXPECT_EQ(view["devices"], lost_receipt["devices"]);
  EXPECT_EQ(view["granted_ms"], lost_receipt["granted_ms"]);
  EXPECT_EQ(present("bob-token", lost_receipt).status, 409);  // once
  // new leases take other GPUs and ids of the new epoch
  const ApiResponse next = s.handle(api_call("POST", "/v1/leases", "bob-token", R"({"model":"yolov8s"})"));
  ASSERT_EQ(next.status, 201);
  EXPECT_EQ(next.body["lease_id"], report.id_epoch);
  for (const json& device : next.body["lease"]["devices"]) {
    EXPECT_EQ(std::count(lost_receipt["devices"].begin(), lost_receipt["devices"].end(), device), 0);
  }
  EXPECT_EQ(count_audit(s, "lease.reattach"), 1);
  EXPECT_TRUE(s.check_invariants().empty());
  // stored: a restart keeps it
  QuotaService restarted(testing::example_policy(), o);
  EXPECT_EQ(restarted.handle(api_call("GET", lost_path, "bob-token")).body["state"], "granted");
}

}  // namespace
}  // namespace yolo8::quota
