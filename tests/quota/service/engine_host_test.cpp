#include "quota/service/engine_host.h"

#include <gtest/gtest.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "quota/core/codec.h"
#include "tests/quota/quota_test_util.h"
#include "tests/quota/write_lock_holder.h"

namespace yolo8::quota {
namespace {

using testing::kHour;
using testing::kMonday;

ServiceOptions options_for(const std::string& db, int64_t now_ms) {
  ServiceOptions options;
  options.db_path = db;
  options.clock = [now_ms] { return now_ms; };
  options.store_busy_timeout_ms = 50;
  options.store_backoff_ms = 0;
  return options;
}

TEST(EngineHost, TheModeFollowsTheOptions) {
  const int64_t now = kMonday + 9 * kHour;
  HeartbeatBoard board(100);
  EXPECT_EQ(EngineHost(testing::example_policy(), options_for("", now), nullptr, board).mode(), EngineMode::kMemory);
  const std::string db = testing::temp_db("host_mode");
  ServiceOptions options = options_for(db, now);
  EXPECT_EQ(EngineHost(testing::example_policy(), options, std::make_unique<Store>(db), board).mode(),
            EngineMode::kSingle);
  options.reload_per_call = true;
  EXPECT_EQ(EngineHost(testing::example_policy(), options, std::make_unique<Store>(db), board).mode(),
            EngineMode::kLocal);
}

// A change the store did not take leaves the engine's state the value it was before, every record of it: the
// leases, the queue, the ids, the audit, the changes still to store.
TEST(EngineHost, AChangeTheStoreDidNotTakeLeavesTheStateEqualToBefore) {
  const int64_t now = kMonday + 9 * kHour;
  const std::string db = testing::temp_db("host_rollback");
  const ServiceOptions options = options_for(db, now);
  HeartbeatBoard board(100);
  EngineHost host(testing::example_policy(), options, std::make_unique<Store>(db, false, 50), board);
  int64_t granted = 0;
  host.run(
      [&] {
        granted = host.engine().acquire(testing::lease_request("team-cv", "alice"), now).lease_id;
        return ApiResponse{};
      },
      true);
  nlohmann::json before;
  host.run(
      [&] {
        before = to_json(host.engine().state(), host.engine().policy());
        return ApiResponse{};
      },
      false);
  {
    yolo8::test::WriteLockHolder other_process(db);
    EXPECT_THROW(host.run(
                     [&] {
                       host.engine().release(granted, Outcome::kCompleted, now);
                       host.engine().acquire(testing::lease_request("team-robotics", "erin"), now);
                       host.engine().tick(now + kHour);
                       return ApiResponse{};
                     },
                     true),
                 Unavailable);
  }
  EXPECT_EQ(host.storage_write_errors(), 1u);
  host.run(
      [&] {
        EXPECT_EQ(to_json(host.engine().state(), host.engine().policy()), before);
        return ApiResponse{};
      },
      false);
  // the store released, the same change goes through
  host.run(
      [&] {
        EXPECT_TRUE(host.engine().release(granted, Outcome::kCompleted, now));
        return ApiResponse{};
      },
      true);
  EngineHost restarted(testing::example_policy(), options, std::make_unique<Store>(db), board);
  restarted.run(
      [&] {
        EXPECT_EQ(restarted.engine().find(granted)->state, LeaseState::kReleased);
        return ApiResponse{};
      },
      false);
}

// Heartbeats answered from the board reach the engine with the next call, in the engine's frame.
TEST(EngineHost, TheBoardsReportsReachTheEngineWithTheNextCall) {
  const int64_t now = kMonday + 9 * kHour;
  HeartbeatBoard board(100);
  EngineHost host(testing::example_policy(), options_for("", now), nullptr, board);
  int64_t id = 0;
  host.run(
      [&] {
        id = host.engine().acquire(testing::lease_request("team-cv", "alice"), now).lease_id;
        return ApiResponse{};
      },
      true);
  HeartbeatResult result;
  const Caller alice{"alice", "team-cv", Role::kMember};
  // received 5 s later on the monotonic clock, which is the wall clock here
  ASSERT_EQ(board.beat(alice, id, Telemetry{}, now, now + 5000, false, result), HeartbeatBoard::Answer::kAnswered);
  EXPECT_EQ(result.state, LeaseState::kGranted);  // published after the committed change
  host.run(
      [&] {
        EXPECT_EQ(host.engine().find(id)->last_seen_ms, now + 5000);
        return ApiResponse{};
      },
      false);
  EXPECT_TRUE(board.take_reports().empty());
}

// With a retention period the heartbeat flush folds what is older than it, a bounded batch at a time, and a
// restart replays the same waste figures from the hourly summaries.
TEST(EngineHost, TheFlushFoldsHeartbeatsOlderThanTheRetentionAndTheReplayStaysTheSame) {
  const int64_t now = kMonday + 9 * kHour;
  const std::string db = testing::temp_db("host_fold");
  const Policy policy = testing::example_policy();
  Engine engine(policy);
  const int64_t id = engine.acquire(testing::lease_request("team-cv", "alice"), now - 20 * 24 * kHour).lease_id;
  std::vector<HeartbeatSample> samples;
  int64_t recent = 0;
  for (int64_t ts = now - 20 * 24 * kHour + 7000; ts < now; ts += 7 * 60000) {
    Telemetry beat;
    beat.gpu_util = (ts / (3 * kHour)) % 2 == 0 ? 0.02 : 0.8;  // low for 3 h, busy for 3 h
    samples.push_back({id, ts, beat});
    recent += ts >= now - 3 * 24 * kHour ? 1 : 0;
  }
  {
    Store store(db);
    store.write(engine, engine.take_changes());
    store.write_heartbeats(samples);
  }
  const auto replayed = [&](ServiceOptions options) {
    HeartbeatBoard board(100);
    EngineHost host(policy, options, std::make_unique<Store>(db), board);
    host.flush_heartbeats();
    host.flush_heartbeats();
    std::optional<Engine> view;
    std::optional<UtilTracker> tracker;
    std::string head;
    host.copy_for_view(view, tracker, head);
    return *tracker->find(id);
  };
  ServiceOptions keep_all = options_for(db, now);
  const LeaseUtil before = replayed(keep_all);
  EXPECT_EQ(Store(db).count_heartbeats(), static_cast<int64_t>(samples.size()));  // no retention: all kept
  ASSERT_GT(before.wasted_ms, 0);
  ServiceOptions three_days = options_for(db, now);
  three_days.heartbeat_retention_ms = 3 * 24 * kHour;
  replayed(three_days);  // folds
  Store store(db);
  const int64_t cutoff = hour_of(now - 3 * 24 * kHour);
  int64_t kept = 0;
  for (const HeartbeatSample& sample : samples) kept += sample.ts_ms >= cutoff ? 1 : 0;
  EXPECT_EQ(store.count_heartbeats(), kept);
  EXPECT_GE(kept, recent);
  EXPECT_GT(store.count_heartbeat_hours(), 24 * 16);
  const LeaseUtil after = replayed(keep_all);
  EXPECT_EQ(after.samples, before.samples);
  EXPECT_EQ(after.util_micro_ms, before.util_micro_ms);
  EXPECT_EQ(after.covered_ms, before.covered_ms);
  EXPECT_EQ(after.wasted_ms, before.wasted_ms);
  EXPECT_EQ(after.longest_low_ms, before.longest_low_ms);
  EXPECT_EQ(after.low_since_ms, before.low_since_ms);
  EXPECT_EQ(after.first_ts_ms, before.first_ts_ms);
}

}  // namespace
}  // namespace yolo8::quota
