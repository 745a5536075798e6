#include "quota/core/recommend.h"

#include <gtest/gtest.h>

namespace yolo8::quota {
namespace {

constexpr int64_t kHourMs = 3600000;

// 10 GPUs, a pool of 2: bases must fit in 8.
const char* kPolicy = R"(
inventory:
  nodes: [{name: n, gpus: 10, memory_gib: 80}]
emergency_pool: 0.2
users:
  a: {token_sha256: 9c220f200955d76c0a38d308225e0ef10c5f971acaf2f8d1d8f732affa5bd1dc}
  b: {token_sha256: 97dd3707015dcf069cf73022ed7173b1165db6eff24b441cb57fd069a8c4e525}
teams:
  ta: {base: 4, burst: 8, members: [a]}
  tb: {base: 4, burst: 8, members: [b]}
credits: {monthly_gpu_hours: 0}
)";

HistoryLease held(int64_t id, const std::string& team, double gpus, int64_t from_h, int64_t to_h) {
  HistoryLease lease;
  lease.id = id;
  lease.team = team;
  lease.units = gpus;
  lease.created_ms = from_h * kHourMs;
  lease.granted_ms = from_h * kHourMs;
  lease.end_ms = to_h * kHourMs;
  return lease;
}

TEST(Recommend, BasesAreScaledToFitOutsideTheEmergencyPool) {
  const Policy policy = load_policy_from_string(kPolicy, "p.yaml");
  UsageHistory history;
  history.from_ms = 0;
  history.to_ms = 10 * kHourMs;
  history.leases = {held(1, "ta", 7, 1, 10), held(2, "tb", 5, 1, 10)};
  HistoryLease critical = held(3, "tb", 2, 1, 10);
  critical.emergency = true;  // counts against no team
  history.leases.push_back(critical);
  const Recommendation rec = recommend(policy, history);
  EXPECT_EQ(rec.capacity, 8);
  // 7 + 5 = 12 > 8: scaled to 4.67 and 3.33, largest remainder gives ta the spare GPU
  EXPECT_DOUBLE_EQ(rec.teams[0].base, 5);
  EXPECT_DOUBLE_EQ(rec.teams[1].base, 3);
  EXPECT_DOUBLE_EQ(rec.teams[0].burst, 7);
  EXPECT_DOUBLE_EQ(rec.teams[1].burst, 5);
  EXPECT_FALSE(rec.notes.empty());
  const std::string diff = policy_diff(kPolicy, "p.yaml", policy, rec);
  EXPECT_NE(diff.find("+  ta: {base: 5, burst: 7, members: [a]}"), std::string::npos) << diff;
  EXPECT_NE(diff.find("@@ -6,6 +6,6 @@"), std::string::npos) << diff;
}

TEST(Recommend, WithoutHistoryNothingChanges) {
  const Policy policy = load_policy_from_string(kPolicy, "p.yaml");
  UsageHistory history;
  history.to_ms = 10 * kHourMs;
  const Recommendation rec = recommend(policy, history);
  EXPECT_DOUBLE_EQ(rec.teams[0].base, 4);
  EXPECT_DOUBLE_EQ(rec.teams[0].burst, 8);
  EXPECT_EQ(policy_diff(kPolicy, "p.yaml", policy, rec), "");
}

}  // namespace
}  // namespace yolo8::quota
