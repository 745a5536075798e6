#include "quota/server/metrics.h"

#include <sqlite3.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include "quota/store/store.h"
#include "tests/quota/server/activity_util.h"

namespace yolo8::quota {
namespace {

using testing::parse_samples;

TEST(QuotadMetrics, ScriptedHistoryFigures) {
  testing::ScriptedHistory h;
  h.run();
  const auto m = parse_samples(h.metrics_text());
  auto at = [&](const std::string& key) {
    auto it = m.find(key);
    EXPECT_NE(it, m.end()) << key;
    return it == m.end() ? -1.0 : it->second;
  };
  EXPECT_EQ(at("quotad_gpus"), 20);
  EXPECT_EQ(at("quotad_emergency_pool_gpus"), 3);
  // 09:00 UTC Monday: team-cv's window (09:00-12:00 +01:00) is open, the interns' (weekends) is not
  EXPECT_EQ(at(R"(quotad_team_gpus_in_use{team="team-cv"})"), 4);  // lease 2 released
  EXPECT_EQ(at(R"(quotad_team_gpus_in_use{team="team-robotics"})"), 6);
  EXPECT_EQ(at(R"(quotad_team_base_gpus{team="team-cv"})"), 8);
  EXPECT_EQ(at(R"(quotad_team_burst_gpus{team="team-cv"})"), 14);
  EXPECT_EQ(at(R"(quotad_team_quota_gpus{team="team-cv"})"), 14);
  EXPECT_EQ(at(R"(quotad_team_quota_gpus{team="team-interns"})"), 2);
  EXPECT_EQ(at(R"(quotad_team_in_burst_window{team="team-cv"})"), 1);
  EXPECT_EQ(at(R"(quotad_team_memory_allocated_gib{team="team-robotics"})"), 6 * 80);
  EXPECT_EQ(at(R"(quotad_team_memory_used_gib{team="team-cv"})"), 4 * 12);
  EXPECT_EQ(at(R"(quotad_team_memory_used_gib{team="team-robotics"})"), 6 * 30);
  EXPECT_DOUBLE_EQ(at(R"(quotad_team_gpu_utilization{team="team-cv"})"), 0.10);
  EXPECT_DOUBLE_EQ(at(R"(quotad_team_gpu_utilization{team="team-robotics"})"), 0.80);
  EXPECT_EQ(m.count(R"(quotad_team_gpu_utilization{team="team-interns"})"), 0u);  // nothing reported
  // alice: 2 leases x 4 GPUs x 1.5 h; erin: 6 GPUs x 1.5 h
  EXPECT_DOUBLE_EQ(at(R"(quotad_team_gpu_seconds{month="2026-11",team="team-cv"})"), 12 * 3600);
  EXPECT_DOUBLE_EQ(at(R"(quotad_member_gpu_seconds{month="2026-11",team="team-cv",user="alice"})"), 12 * 3600);
  EXPECT_DOUBLE_EQ(at(R"(quotad_member_gpu_seconds{month="2026-11",team="team-robotics",user="erin"})"), 9 * 3600);
  EXPECT_DOUBLE_EQ(at(R"(quotad_member_credit_gpu_seconds{month="2026-11",team="team-cv",user="alice"})"), 120 * 3600);
  // queue: ivan has waited 90 minutes; the three granted leases waited 0 s
  EXPECT_EQ(at("quotad_queue_length"), 1);
  EXPECT_EQ(at("quotad_queue_oldest_wait_seconds"), 5400);
  EXPECT_EQ(at(R"(quotad_queue_wait_seconds_current{lease="4",team="team-interns",user="ivan"})"), 5400);
  EXPECT_EQ(at(R"(quotad_queue_wait_seconds_bucket{le="1"})"), 3);
  EXPECT_EQ(at("quotad_queue_wait_seconds_count"), 3);
  EXPECT_EQ(at(R"(quotad_leases{state="granted"})"), 2);
  EXPECT_EQ(at(R"(quotad_leases{state="queued"})"), 1);
  EXPECT_EQ(at(R"(quotad_leases{state="released"})"), 1);
  EXPECT_EQ(at(R"(quotad_lease_runtime_seconds{job_name="idle-sweep",lease="1",team="team-cv",user="alice"})"), 5400);
  // lease 3: 15 % for 30 min then 80 % for 60 min
  EXPECT_NEAR(at(R"(quotad_lease_avg_gpu_utilization{job_name="grasp",lease="3",team="team-robotics",user="erin"})"),
              (0.15 * 30 + 0.80 * 60) / 90, 1e-9);
  // the released job: 5400 s at 90 %
  EXPECT_EQ(at(R"(quotad_job_duration_seconds_bucket{le="3600"})"), 0);
  EXPECT_EQ(at(R"(quotad_job_duration_seconds_bucket{le="14400"})"), 1);
  EXPECT_EQ(at("quotad_job_duration_seconds_sum"), 5400);
  EXPECT_EQ(at(R"(quotad_job_gpu_utilization_bucket{le="0.8"})"), 0);
  EXPECT_EQ(at(R"(quotad_job_gpu_utilization_bucket{le="0.9"})"), 1);
  // waste: lease 1 below 20 % for 90 min; lease 3 was low only 30 min
  EXPECT_EQ(at("quotad_waste_threshold_gpu_utilization"), 0.2);
  EXPECT_EQ(at("quotad_waste_threshold_seconds"), 3600);
  EXPECT_EQ(at("quotad_waste_leases"), 1);
  EXPECT_EQ(at(R"(quotad_waste_low_utilization_seconds{job_name="idle-sweep",lease="1",team="team-cv",user="alice"})"),
            5400);
  EXPECT_DOUBLE_EQ(at(R"(quotad_waste_gpu_seconds{job_name="idle-sweep",lease="1",team="team-cv",user="alice"})"),
                   6 * 3600);
  EXPECT_EQ(m.count(R"(quotad_waste_gpu_seconds{job_name="grasp",lease="3",team="team-robotics",user="erin"})"), 0u);
  EXPECT_EQ(at("quotad_heartbeats_total"), 3 * 181);
  EXPECT_EQ(at("quotad_preemptions_total"), 0);
}

TEST(QuotadMetrics, WasteListNeedsTheFullDuration) {
  testing::ScriptedHistory h;
  h.run();
  // a lease that just went idle is not waste until the hour is over
  *h.clock += 30000;
  h.post("/v1/leases/3/heartbeat", "erin-token", R"({"gpu_util":0.05})");
  *h.clock += 3600000 - 1000;
  auto m = parse_samples(h.metrics_text());
  EXPECT_EQ(m["quotad_waste_leases"], 1);
  *h.clock += 1000;
  m = parse_samples(h.metrics_text());
  EXPECT_EQ(m["quotad_waste_leases"], 2);
  // a sample above the threshold takes it off the list
  h.post("/v1/leases/1/heartbeat", "alice-token", R"({"gpu_util":0.5})");
  m = parse_samples(h.metrics_text());
  EXPECT_EQ(m["quotad_waste_leases"], 1);
  EXPECT_EQ(m.count(R"(quotad_waste_gpu_seconds{job_name="idle-sweep",lease="1",team="team-cv",user="alice"})"), 0u);
}

// quotad_lease_gpu_utilization says whether the figure is the devices' (nvml) or the share of time in steps.
TEST(QuotadMetrics, LeaseUtilisationIsLabelledWithItsSource) {
  testing::ScriptedHistory h;
  h.run();
  ASSERT_EQ(h.post("/v1/leases/3/heartbeat", "erin-token", R"({"gpu_util":0.65,"gpu_util_source":"nvml"})"), 200);
  ASSERT_EQ(h.post("/v1/leases/1/heartbeat", "alice-token", R"({"gpu_util":0.3,"gpu_util_source":"busy_time"})"), 200);
  auto m = parse_samples(h.metrics_text());
  EXPECT_EQ(
      m.count(
          R"(quotad_lease_gpu_utilization{job_name="grasp",lease="3",source="nvml",team="team-robotics",user="erin"})"),
      1u);
  EXPECT_DOUBLE_EQ(
      m[R"(quotad_lease_gpu_utilization{job_name="grasp",lease="3",source="nvml",team="team-robotics",user="erin"})"],
      0.65);
  EXPECT_DOUBLE_EQ(
      m[R"(quotad_lease_gpu_utilization{job_name="idle-sweep",lease="1",source="busy_time",team="team-cv",user="alice"})"],
      0.3);
  ASSERT_EQ(h.post("/v1/leases/3/heartbeat", "erin-token", R"({"gpu_util":0.5,"gpu_util_source":"guess"})"), 400);
}

TEST(QuotadMetrics, QuotaInForceFollowsTheBurstWindow) {
  testing::ScriptedHistory h;
  h.run();
  // team-cv's window closes at 11:00 UTC (12:00 +01:00): the quota falls back to the base
  *h.clock = testing::kMonday + 11 * testing::kHour;
  auto m = parse_samples(h.metrics_text());
  EXPECT_EQ(m[R"(quotad_team_quota_gpus{team="team-cv"})"], 8);
  EXPECT_EQ(m[R"(quotad_team_in_burst_window{team="team-cv"})"], 0);
  // Saturday: the interns' weekend window is open
  *h.clock = testing::kMonday - 2 * 24 * testing::kHour + testing::kHour;
  m = parse_samples(h.metrics_text());
  EXPECT_EQ(m[R"(quotad_team_quota_gpus{team="team-interns"})"], 3);
}

TEST(QuotadMetrics, WasteListSurvivesARestart) {
  const std::string dir = std::string(yolo8::test::kBinaryDir) + "/quota_test_tmp";
  std::filesystem::create_directories(dir);
  const std::string db = dir + "/waste_restart_" + std::to_string(::getpid()) + ".db";
  for (const char* suffix : {"", "-wal", "-shm"}) std::filesystem::remove(db + suffix);
  int64_t now = 0;
  {
    testing::ScriptedHistory h(db);
    h.run();
    h.service->flush_heartbeats();
    now = h.clock->load();
  }
  testing::ScriptedHistory again(db);
  *again.clock = now;
  auto m = parse_samples(again.metrics_text());
  EXPECT_EQ(m["quotad_waste_leases"], 1);
  EXPECT_EQ(m[R"(quotad_waste_low_utilization_seconds{job_name="idle-sweep",lease="1",team="team-cv",user="alice"})"],
            5400);
  EXPECT_NEAR(m[R"(quotad_lease_avg_gpu_utilization{job_name="grasp",lease="3",team="team-robotics",user="erin"})"],
              (0.15 * 30 + 0.80 * 60) / 90, 1e-9);
}

// The audit chain's head is exported, as written and after a restart, equal to what
// `quotad audit --verify` recomputes from the database: an external copy of it can be compared.
TEST(QuotadMetrics, TheAuditChainHeadIsExported) {
  const std::string dir = std::string(yolo8::test::kBinaryDir) + "/quota_test_tmp";
  std::filesystem::create_directories(dir);
  const std::string db = dir + "/audit_head_" + std::to_string(::getpid()) + ".db";
  for (const char* suffix : {"", "-wal", "-shm"}) std::filesystem::remove(db + suffix);
  std::string exported;
  {
    testing::ScriptedHistory h(db);
    h.run();
    exported = h.metrics_text();
  }
  const AuditChainCheck check = verify_audit_chain(db);
  ASSERT_TRUE(check.intact) << check.problem;
  ASSERT_GT(check.head_seq, 3);
  ASSERT_EQ(check.head.size(), 64u);
  for (const std::string& text : {exported, testing::ScriptedHistory(db).metrics_text()}) {
    auto m = parse_samples(text);
    EXPECT_EQ(m["quotad_audit_chain_head_seq"], static_cast<double>(check.head_seq));
    EXPECT_EQ(m["quotad_audit_chain_info{head=\"" + check.head + "\"}"], 1) << text;
  }
  // without a database there is no chain to show
  EXPECT_EQ(testing::ScriptedHistory().metrics_text().find("quotad_audit_chain"), std::string::npos);
}

TEST(QuotadMetrics, ExpositionFormatIsWellFormed) {
  testing::ScriptedHistory h;
  h.run();
  const std::string text = h.metrics_text();
  std::set<std::string> help, type, families_seen;
  const std::regex sample(R"(^(quotad_[a-z0-9_]+)(\{([a-z_]+="([^"\\]|\\.)*",?)*\})? (-?[0-9.e+-]+|\+Inf|NaN)$)");
  std::istringstream is(text);
  std::string line;
  while (std::getline(is, line)) {
    if (line.rfind("# HELP ", 0) == 0) {
      help.insert(line.substr(7, line.find(' ', 7) - 7));
      continue;
    }
    if (line.rfind("# TYPE ", 0) == 0) {
      const std::string name = line.substr(7, line.find(' ', 7) - 7);
      const std::string kind = line.substr(line.find(' ', 7) + 1);
      EXPECT_TRUE(kind == "gauge" || kind == "counter" || kind == "histogram") << line;
      EXPECT_TRUE(type.insert(name).second) << "TYPE twice: " << name;
      continue;
    }
    std::smatch sm;
    ASSERT_TRUE(std::regex_match(line, sm, sample)) << line;
    std::string family = sm[1];
    for (const char* suffix : {"_bucket", "_sum", "_count"}) {
      const std::string s(suffix);
      if (!type.count(family) && family.size() > s.size() &&
          family.compare(family.size() - s.size(), s.size(), s) == 0) {
        family.resize(family.size() - s.size());
      }
    }
    EXPECT_TRUE(type.count(family)) << "sample before its TYPE: " << line;
    families_seen.insert(sm[1]);
  }
  EXPECT_EQ(help, type);
  // every family exported is in the published list and the other way round
  std::set<std::string> listed;
  for (const auto& n : exported_metric_names()) listed.insert(n);
  for (const auto& n : families_seen) EXPECT_TRUE(listed.count(n)) << n << " missing from exported_metric_names()";
  for (const auto& n : type) {
    EXPECT_TRUE(listed.count(n) || listed.count(n + "_count")) << n;
  }
}

TEST(QuotadMetrics, LabelValuesAreEscaped) {
  testing::ScriptedHistory h;
  h.post("/v1/leases", "alice-token", R"({"model":"yolov8s","gpus":1,"job":"a\"b\\c\nd"})");
  const std::string text = h.metrics_text();
  EXPECT_NE(text.find(R"(quotad_lease_gpus{job_name="a\"b\\c\nd",lease="1",team="team-cv",user="alice"} 1)"),
            std::string::npos)
      << text;
}

TEST(QuotadMetrics, AllocatedAndFreeAddUpWithEmergencyLeases) {
  testing::ScriptedHistory h;
  h.run();
  ASSERT_TRUE(testing::add_shared_and_emergency(h));
  const auto m = parse_samples(h.metrics_text());
  const double shared_gpu = 1;  // bob's yolov8n share: its GPU counts whole, for the allocation and his team
  EXPECT_DOUBLE_EQ(m.at("quotad_gpus"), 20);
  EXPECT_DOUBLE_EQ(m.at("quotad_gpus_allocated"), 4 + 6 + shared_gpu + 3);
  EXPECT_DOUBLE_EQ(m.at("quotad_gpus_allocated") + m.at("quotad_gpus_free"), m.at("quotad_gpus"));
  EXPECT_DOUBLE_EQ(m.at("quotad_emergency_gpus_allocated"), 3);
  // the teams' GPUs in use leave the emergency lease out; the allocation puts it back
  double teams = 0;
  for (const auto& [key, value] : m) {
    if (key.rfind("quotad_team_gpus_in_use{", 0) == 0) teams += value;
  }
  EXPECT_DOUBLE_EQ(teams + m.at("quotad_emergency_gpus_allocated"), m.at("quotad_gpus_allocated"));
  EXPECT_DOUBLE_EQ(m.at(R"(quotad_lease_gpus{job_name="hotfix",lease="6",team="team-robotics",user="dave"})"), 3);
  EXPECT_DOUBLE_EQ(
      m.at(R"(quotad_emergency_review_pending_seconds{job_name="hotfix",lease="6",team="team-robotics",user="dave"})"),
      0);
  EXPECT_EQ(m.at("quotad_emergency_grants_total"), 1);
}

TEST(QuotadMetrics, BuildInfoHeartbeatAgeAndPolicyTimes) {
  testing::ScriptedHistory h;
  h.run();
  *h.clock += 25000;
  const std::string text = h.metrics_text();
  const auto m = parse_samples(text);
  EXPECT_EQ(m.at(std::string("quotad_build_info{version=\"") + YOLO8_VERSION + "\"}"), 1) << text;
  EXPECT_EQ(m.at("quotad_heartbeat_interval_seconds"), 10);
  EXPECT_EQ(m.at("quotad_lease_ttl_seconds"), 60);
  EXPECT_EQ(m.at(R"(quotad_lease_heartbeat_age_seconds{job_name="grasp",lease="3",team="team-robotics",user="erin"})"),
            25);
  // no label named job or instance: Prometheus would rename it to exported_job / exported_instance
  EXPECT_EQ(text.find("{job="), std::string::npos);
  EXPECT_EQ(text.find(",job="), std::string::npos);
  EXPECT_EQ(text.find("instance="), std::string::npos);
  EXPECT_EQ(m.at("quotad_storage_write_errors_total"), 0);
}

TEST(QuotadMetrics, StorageWriteErrorsAreCounted) {
  const std::string dir = std::string(yolo8::test::kBinaryDir) + "/quota_test_tmp";
  std::filesystem::create_directories(dir);
  const std::string db = dir + "/write_errors_" + std::to_string(::getpid()) + ".db";
  for (const char* suffix : {"", "-wal", "-shm"}) std::filesystem::remove(db + suffix);
  testing::ScriptedHistory h(db);
  ASSERT_EQ(h.post("/v1/leases", "alice-token", R"({"model":"yolov8s","gpus":1,"job":"a"})"), 201);
  // another connection makes every heartbeat insert fail, as a full disk or a broken file would
  sqlite3* other = nullptr;
  ASSERT_EQ(sqlite3_open(db.c_str(), &other), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(other,
                         "CREATE TRIGGER refuse BEFORE INSERT ON heartbeats BEGIN SELECT RAISE(ABORT, 'refused'); END;",
                         nullptr, nullptr, nullptr),
            SQLITE_OK);
  sqlite3_close(other);
  ASSERT_EQ(h.post("/v1/leases/1/heartbeat", "alice-token", R"({"gpu_util":0.5})"), 200);
  EXPECT_THROW(h.service->flush_heartbeats(), std::exception);
  EXPECT_EQ(parse_samples(h.metrics_text()).at("quotad_storage_write_errors_total"), 1);
}

TEST(QuotadMetrics, BackupAgeReloadsAndCertificateExpiry) {
  testing::ScriptedHistory h;
  OperationsFigures ops;
  h.metrics = std::make_unique<MetricsExporter>(*h.service, [&] { return ops; });
  // backups off, plain HTTP, nothing watched: the families are declared, without series
  std::string text = h.metrics_text();
  auto m = parse_samples(text);
  EXPECT_EQ(m.count("quotad_backup_age_seconds"), 0u) << text;
  EXPECT_EQ(m.count("quotad_tls_certificate_expiry_timestamp_seconds"), 0u);
  EXPECT_NE(text.find("# TYPE quotad_backup_age_seconds gauge"), std::string::npos);

  // backups every hour, none taken yet: the age is +Inf, which any staleness threshold exceeds
  ops.backup_interval_ms = 3600 * 1000;
  text = h.metrics_text();
  EXPECT_NE(text.find("\nquotad_backup_age_seconds +Inf\n"), std::string::npos) << text;
  EXPECT_EQ(parse_samples(text).at("quotad_backup_interval_seconds"), 3600);

  ops.newest_backup_ms = h.service->now() - 90 * 60 * 1000;
  ops.reloads = {{"policy", 2}, {"tokens", 0}};
  ops.reload_failures = {{"policy", 1}, {"tokens", 0}};
  ops.certificate_not_after_ms = 1800000000000;
  m = parse_samples(h.metrics_text());
  EXPECT_EQ(m.at("quotad_backup_age_seconds"), 90 * 60);
  EXPECT_EQ(m.at(R"(quotad_reloads_total{file="policy"})"), 2);
  EXPECT_EQ(m.at(R"(quotad_reload_failures_total{file="policy"})"), 1);
  EXPECT_EQ(m.at(R"(quotad_reload_failures_total{file="tokens"})"), 0);
  EXPECT_EQ(m.at("quotad_tls_certificate_expiry_timestamp_seconds"), 1800000000);
}

TEST(QuotadMetrics, TrackerAveragesAndClosesRuns) {
  UtilTracker t(0.2, 3600000);
  t.observe(7, 0, 0.1);
  t.observe(7, 1800000, 0.1);
  t.observe(7, 4000000, 0.5);  // closes a 4000 s low run: counted as waste
  t.observe(7, 5000000, 0.1);
  t.close(7, 6000000);  // a 1000 s low run: not waste
  const LeaseUtil* u = t.find(7);
  ASSERT_NE(u, nullptr);
  EXPECT_EQ(u->wasted_ms, 4000000);
  EXPECT_EQ(u->longest_low_ms, 4000000);
  EXPECT_EQ(u->low_since_ms, -1);
  EXPECT_NEAR(u->avg_util(), (0.1 * 4000 + 0.5 * 1000 + 0.1 * 1000) / 6000.0, 1e-12);
  t.observe(7, 10, 0.9);  // out of order: ignored
  EXPECT_EQ(t.find(7)->samples, 4);
  t.observe(8, 0, -1);  // no utilisation reported
  EXPECT_EQ(t.find(8), nullptr);
}

}  // namespace
}  // namespace yolo8::quota
