// QuotaService on a PostgreSQL store: what a restart restores, and local mode's processes sharing one database.
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "quota/server/history.h"
#include "quota/server/report.h"
#include "quota/server/statement.h"
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
// The same calls on either backend give the same monthly report, quarter statement and usage history, read
// through each backend's reader; and so they do once the heartbeats are summed up and the old raw rows deleted.
void run_script(const std::string& db, int64_t start) {
  auto now = std::make_shared<std::atomic<int64_t>>(start);
  ServiceOptions o;
  o.db_path = db;
  o.clock = [now] { return now->load(); };
  QuotaService s(testing::example_policy(), o);
  const struct {
    const char* token;
    const char* body;
    int64_t at_ms, hours;
    double util;
  } leases[] = {{"alice-token", R"({"gpus":2,"job":"train","model":"yolov8s"})", 0, 5, 0.8},
                {"bob-token", R"({"gpus":1,"job":"idle","model":"yolov8s"})", 5 * kHour + 10 * 60000, 3, 0.05},
                {"erin-token", R"({"gpus":1,"job":"rob","model":"yolov8s"})", 26 * kHour, 2, 0.6}};
  for (const auto& lease : leases) {
    *now = start + lease.at_ms;
    const ApiResponse granted = s.handle(api_call("POST", "/v1/leases", lease.token, lease.body));
    ASSERT_EQ(granted.status, 201) << granted.body.dump();
    const std::string path = "/v1/leases/" + std::to_string(granted.body["lease_id"].get<int64_t>());
    const int64_t end = *now + lease.hours * kHour;
    for (int64_t t = *now; t <= end; t += 30000) {
      *now = t;
      const double util = t < end - kHour ? lease.util : 0.1;  // each ends idle for an hour
      ASSERT_EQ(
          s.handle(api_call("POST", path + "/heartbeat", lease.token, R"({"gpu_util":)" + std::to_string(util) + "}"))
              .status,
          200);
    }
    ASSERT_EQ(s.handle(api_call("POST", path + "/release", lease.token, R"({"outcome":"completed"})")).status, 200);
  }
  s.flush_heartbeats();
}

std::vector<std::string> report_figures(const std::string& db, int64_t now) {
  const Policy policy = testing::example_policy();
  std::vector<std::string> out;
  const MonthlyReport report = build_report(db, "2026-11", &policy, 10, now);
  out.push_back(report_markdown(report));
  out.push_back(report_csv(report));
  out.push_back(report_html(report));
  out.push_back(statement_markdown(build_statement(db, "2026-Q4", policy, now)));
  std::ostringstream history;
  history.precision(17);
  int64_t from = 0, to = 0;
  month_range_ms("2026-11", from, to);
  for (const HistoryLease& lease : load_history(db, policy, from + 7 * 60000, now).leases) {
    history << lease.id << " " << lease.sampled_gpu_hours << " " << lease.idle_gpu_hours << "\n";
  }
  out.push_back(history.str());
  return out;
}

TEST(QuotaServicePostgres, TheReportsReadTheSameFromBothBackendsBeforeAndAfterSummingUp) {
  int64_t from = 0, to = 0;
  month_range_ms("2026-11", from, to);
  const int64_t start = from + 9 * 24 * kHour + 8 * kHour + 20 * 60000;
  const int64_t now = to + 3 * 24 * kHour;
  const std::string sqlite = testing::temp_db("reports_both");
  const std::string postgres = PostgresCluster::get().fresh_database("reports_both");
  run_script(sqlite, start);
  run_script(postgres, start);
  if (HasFatalFailure()) return;
  const std::vector<std::string> figures = report_figures(sqlite, now);
  ASSERT_NE(figures[0].find("idle"), std::string::npos) << figures[0];
  EXPECT_EQ(report_figures(postgres, now), figures);
  // summed up and deleted up to the middle of the second day (an hour of erin's lease summed up in part)
  for (const std::string& db : {sqlite, postgres}) {
    const std::unique_ptr<StateStore> store = open_store(parse_db_target(db));
    const int64_t cut = start + 26 * kHour + 30 * 60000;
    while (store->fold_heartbeats(cut, cut, 0.2, 3600000, 200) > 0) {
    }
    EXPECT_GT(store->count_heartbeat_hours(), 5) << db;
  }
  EXPECT_EQ(report_figures(sqlite, now), figures);
  EXPECT_EQ(report_figures(postgres, now), figures);
}

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
