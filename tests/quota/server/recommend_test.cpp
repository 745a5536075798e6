// `quotad recommend`: ten days of recorded history (leases, queue waits, heartbeats) written through the service
// into a real store, read back by load_history, and the proposal and policy diff it gives.
#include "quota/core/recommend.h"

#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>

#include "quota/server/history.h"
#include "quota/service/service.h"
#include "tests/quota/quota_test_util.h"

namespace yolo8::quota {
namespace {

using nlohmann::json;
using testing::kHour;
using testing::kMinute;

// 2026-11-02 00:00 UTC, a Monday.
constexpr int64_t kStart = testing::kMonday - 28 * 24 * kHour;
constexpr int kDays = 10;

// ta in flow style with a burst, tb in block style without one (it defaults to base).
const char* kPolicy = R"(# two teams, 16 GPUs
inventory:
  nodes:
    - {name: n1, gpus: 8, memory_gib: 80}
    - {name: n2, gpus: 8, memory_gib: 80}
emergency_pool: 0
users:
  alice: {token_sha256: 9c220f200955d76c0a38d308225e0ef10c5f971acaf2f8d1d8f732affa5bd1dc}
  bob: {token_sha256: 97dd3707015dcf069cf73022ed7173b1165db6eff24b441cb57fd069a8c4e525}
  erin: {token_sha256: 31cda640df783340475d42ae13821d0e4d5d9ab7ccd3b6146884948f39870860}
  ivan: {token_sha256: 747140d0142617597ded9d4638f8d433a81d5f565432869c2faf901297d7adde}
teams:
  ta: {base: 6, burst: 16, members: [alice, bob]}
  tb:
    base: 8
    members: [erin]
  tc:
    base: 2
    members: [ivan]
credits: {monthly_gpu_hours: 0}
waste: {gpu_util_below: 0.2, after_s: 600}
)";

std::string temp_path(const std::string& name) {
  const std::string dir = std::string(yolo8::test::kBinaryDir) + "/quota_test_tmp";
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/" + name + "_" + std::to_string(::getpid());
  for (const char* suffix : {"", "-wal", "-shm"}) std::filesystem::remove(path + suffix);
  return path;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Every day: erin 8 GPUs 00-12 h and a second request for 4 at 06 h that waits until 12 h and runs to 14 h
// (util 0.9); alice 2 GPUs 08-16 h (util 0.9); bob 4 GPUs 10-12 h (util 0.1, idle). Heartbeats every 10 min.
std::string recorded_history() {
  const std::string db = temp_path("recommend.db");
  auto clock = std::make_shared<std::atomic<int64_t>>(kStart);
  ServiceOptions options;
  options.db_path = db;
  options.clock = [clock] { return clock->load(); };
  QuotaService service(load_policy_from_string(kPolicy, "policy.yaml"), options);
  auto post = [&](const std::string& path, const std::string& token, const std::string& body) {
    const ApiResponse response = service.handle(testing::api_call("POST", path, token, body));
    EXPECT_LT(response.status, 300) << path << " " << response.body.dump();
    return response.body;
  };
  struct Running {
    int64_t id;
    std::string token;
    double util;
  };
  for (int day = 0; day < kDays; ++day) {
    const int64_t midnight = kStart + day * 24 * kHour;
    std::vector<Running> running;
    int64_t erin_big = 0, erin_small = 0, alice = 0, bob = 0;
    auto heartbeat = [&](const Running& lease) {
      post("/v1/leases/" + std::to_string(lease.id) + "/heartbeat", lease.token,
           R"({"gpu_util":)" + std::to_string(lease.util) + "}");
    };
    auto acquire = [&](const std::string& token, int gpus, double util) {
      const json answer = post("/v1/leases", token, R"({"model":"yolov8s","gpus":)" + std::to_string(gpus) + "}");
      const int64_t id = answer.value("lease_id", int64_t{0});
      if (answer.value("status", "") == "granted") {
        running.push_back({id, token, util});
        heartbeat(running.back());  // the first sample at the grant
      }
      return id;
    };
    auto release = [&](int64_t id, const std::string& token) {
      post("/v1/leases/" + std::to_string(id) + "/release", token, "{}");
      running.erase(std::remove_if(running.begin(), running.end(), [&](const Running& r) { return r.id == id; }),
                    running.end());
    };
    for (int64_t t = midnight; t <= midnight + 16 * kHour; t += 10 * kMinute) {
      *clock = t;
      const int64_t hour = (t - midnight) / kHour, minute = (t - midnight) % kHour;
      for (const auto& lease : running) heartbeat(lease);
      if (minute != 0) continue;
      if (hour == 0) erin_big = acquire("erin-token", 8, 0.9);
      if (hour == 6) erin_small = acquire("erin-token", 4, 0.9);  // tb is at its base of 8: it waits
      if (hour == 8) alice = acquire("alice-token", 2, 0.9);
      if (hour == 10) bob = acquire("bob-token", 4, 0.1);
      if (hour == 12) {
        release(bob, "bob-token");
        release(erin_big, "erin-token");  // the waiting request is granted now
        running.push_back({erin_small, "erin-token", 0.9});
        heartbeat(running.back());
      }
      if (hour == 14) release(erin_small, "erin-token");
      if (hour == 16) release(alice, "alice-token");
    }
    service.flush_heartbeats();
  }
  return db;
}

const std::string& history_db() {
  static const std::string db = recorded_history();
  return db;
}

TEST(QuotadRecommend, RecordedHistoryGivesTheExpectedProposal) {
  const Policy policy = load_policy_from_string(kPolicy, "policy.yaml");
  const UsageHistory history = load_history(history_db(), policy, kStart, kStart + kDays * 24 * kHour);
  EXPECT_EQ(history.leases.size(), static_cast<size_t>(4 * kDays));
  const Recommendation rec = recommend(policy, history);
  ASSERT_EQ(rec.teams.size(), 3u);
  const TeamRecommendation& ta = rec.teams[0];
  EXPECT_EQ(ta.team, "ta");
  // active 08-16 h: 2 GPUs for 6 h, 6 for 2 h
  EXPECT_NEAR(ta.active_share, 8.0 / 24, 1e-9);
  EXPECT_DOUBLE_EQ(ta.p50_in_use, 2);
  EXPECT_DOUBLE_EQ(ta.p95_in_use, 6);
  EXPECT_DOUBLE_EQ(ta.peak_in_use, 6);
  EXPECT_NEAR(ta.gpu_hours, kDays * 24.0, 1e-6);
  // bob's 8 GPU-hours a day at 10 % are idle: a third of ta's sampled time
  EXPECT_NEAR(ta.idle_share, 1.0 / 3, 1e-6);
  EXPECT_DOUBLE_EQ(ta.base, 2);   // ceil(2 x 0.667)
  EXPECT_DOUBLE_EQ(ta.burst, 6);  // nobody of ta waited
  EXPECT_DOUBLE_EQ(ta.p95_wait_s, 0);
  const TeamRecommendation& tb = rec.teams[1];
  // active 00-14 h: held 8 for 12 h, 4 for 2 h; 4 more waited 06-12 h
  EXPECT_DOUBLE_EQ(tb.p50_in_use, 8);
  EXPECT_DOUBLE_EQ(tb.p95_demand, 12);
  EXPECT_DOUBLE_EQ(tb.idle_share, 0);
  EXPECT_NEAR(tb.p95_wait_s, 6 * 3600, 1e-6);
  EXPECT_DOUBLE_EQ(tb.p50_wait_s, 0);
  EXPECT_DOUBLE_EQ(tb.base, 8);
  EXPECT_DOUBLE_EQ(tb.burst, 12);
  const TeamRecommendation& tc = rec.teams[2];
  EXPECT_FALSE(tc.has_history);
  EXPECT_DOUBLE_EQ(tc.base, 2);
  const std::string text = recommendation_text(rec);
  EXPECT_NE(text.find("ta: base 6 -> 2, burst 16 -> 6"), std::string::npos) << text;
  EXPECT_NE(text.find("p95 wait 6.0 h"), std::string::npos) << text;
}

TEST(QuotadRecommend, PolicyDiffAppliesWithPatchAndLoads) {
  const Policy policy = load_policy_from_string(kPolicy, "policy.yaml");
  const Recommendation rec = recommend(policy, load_history(history_db(), policy, kStart, kStart + kDays * 24 * kHour));
  const std::string diff = policy_diff(kPolicy, "policy.yaml", policy, rec);
  EXPECT_NE(diff.find("-  ta: {base: 6, burst: 16, members: [alice, bob]}\n"
                      "+  ta: {base: 2, burst: 6, members: [alice, bob]}\n"),
            std::string::npos)
      << diff;
  EXPECT_NE(diff.find("     base: 8\n+    burst: 12\n"), std::string::npos) << diff;
  // the real tool applies it, and the result is a valid policy with the proposed numbers
  if (std::system("command -v patch > /dev/null 2>&1") != 0) GTEST_SKIP() << "GNU patch is not installed";
  const std::string dir = temp_path("recommend_patch");
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/policy.yaml") << kPolicy;
  std::ofstream(dir + "/change.diff") << diff;
  ASSERT_EQ(std::system(("cd " + dir + " && patch -p0 --quiet < change.diff").c_str()), 0) << diff;
  const Policy patched = load_policy(dir + "/policy.yaml");
  EXPECT_DOUBLE_EQ(patched.teams.at("ta").base, 2);
  EXPECT_DOUBLE_EQ(patched.teams.at("ta").burst, 6);
  EXPECT_DOUBLE_EQ(patched.teams.at("tb").base, 8);
  EXPECT_DOUBLE_EQ(patched.teams.at("tb").burst, 12);
  EXPECT_DOUBLE_EQ(patched.teams.at("tc").base, 2);
  // proposing again from the patched file changes nothing
  EXPECT_EQ(policy_diff(read_text(dir + "/policy.yaml"), "policy.yaml", patched,
                        recommend(patched, load_history(history_db(), patched, kStart, kStart + kDays * 24 * kHour))),
            "");
}

TEST(QuotadRecommend, CommandLinePrintsTheFiguresAndWritesTheDiff) {
  const std::string bin = std::string(yolo8::test::kBinaryDir) + "/quota/quotad";
  const std::string policy = temp_path("recommend_policy.yaml");
  std::ofstream(policy) << kPolicy;
  const std::string out = temp_path("recommend.txt"), diff = temp_path("recommend.diff");
  // the 30 days up to 2026-11-20 hold the recorded days
  const std::string cmd = bin + " recommend --months 1 --until 2026-11-20 --db " + history_db() + " --policy " +
                          policy + " --diff " + diff + " > " + out;
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  const std::string text = read_text(out);
  EXPECT_NE(text.find("GPUs in use while active: p50 2.0, p95 6.0"), std::string::npos) << text;
  EXPECT_NE(read_text(diff).find("+    burst: 12"), std::string::npos) << read_text(diff);
  EXPECT_NE(std::system((bin + " recommend --until 2026-11-31 --db " + history_db() + " --policy " + policy +
                         " > /dev/null 2>&1")
                            .c_str()),
            0);
}

}  // namespace
}  // namespace yolo8::quota
