#include "quota/service/heartbeat_board.h"

#include <gtest/gtest.h>

#include <string>

#include "tests/quota/quota_test_util.h"

namespace yolo8::quota {
namespace {

using testing::kHour;
using testing::kMonday;

const Caller kAlice{"alice", "team-cv", Role::kMember};

TEST(HeartbeatBoard, AnswersFromWhatWasPublishedWithTheOneRuleForActing) {
  const int64_t now = kMonday + 13 * kHour;
  Engine engine(testing::example_policy());
  const int64_t granted = engine.acquire(testing::lease_request("team-cv", "alice", 8), now).lease_id;
  const int64_t queued = engine.acquire(testing::lease_request("team-cv", "alice", 8), now).lease_id;
  HeartbeatBoard board(100);
  HeartbeatResult result;
  EXPECT_EQ(board.beat(kAlice, granted, Telemetry{}, now, now, true, result), HeartbeatBoard::Answer::kUnknownLease);
  board.publish(engine, engine.take_changes(), true, now);
  ASSERT_EQ(board.beat(kAlice, granted, Telemetry{}, now, now, true, result), HeartbeatBoard::Answer::kAnswered);
  EXPECT_EQ(result.state, LeaseState::kGranted);
  ASSERT_EQ(board.beat(kAlice, queued, Telemetry{}, now, now, true, result), HeartbeatBoard::Answer::kAnswered);
  EXPECT_EQ(result.state, LeaseState::kQueued);
  EXPECT_EQ(result.position, 1);
  EXPECT_EQ(board.position(queued), 1);
  EXPECT_FALSE(result.reason.empty());
  const Caller bob{"bob", "team-cv", Role::kMember};
  const Caller carol{"carol", "team-cv", Role::kLead};
  EXPECT_EQ(board.beat(bob, granted, Telemetry{}, now, now, true, result), HeartbeatBoard::Answer::kForbidden);
  EXPECT_EQ(board.beat(carol, granted, Telemetry{}, now, now, true, result), HeartbeatBoard::Answer::kAnswered);
  // every answered report goes to the engine; only running leases' figures to the store
  EXPECT_EQ(board.take_reports().size(), 3u);
  EXPECT_EQ(board.take_samples().size(), 2u);
  // a change published: the released lease answers its end, the queued one is granted
  ASSERT_TRUE(engine.release(granted, Outcome::kCompleted, now));
  board.publish(engine, engine.take_changes(), false, now);
  ASSERT_EQ(board.beat(kAlice, granted, Telemetry{}, now, now, true, result), HeartbeatBoard::Answer::kAnswered);
  EXPECT_EQ(result.state, LeaseState::kReleased);
  ASSERT_EQ(board.beat(kAlice, queued, Telemetry{}, now, now, true, result), HeartbeatBoard::Answer::kAnswered);
  EXPECT_EQ(result.state, LeaseState::kGranted);
  // an ended lease's heartbeat is answered but reported nowhere
  EXPECT_EQ(board.take_reports().size(), 1u);
  // pruned leases leave the board
  engine.prune(now + 48 * kHour, kHour);
  board.publish(engine, engine.take_changes(), false, now + 48 * kHour);
  EXPECT_EQ(board.beat(kAlice, granted, Telemetry{}, now, now, true, result), HeartbeatBoard::Answer::kUnknownLease);
}

TEST(HeartbeatBoard, SamplesTheStoreDidNotTakeComeBackFirstWithinTheBound) {
  HeartbeatBoard board(3);
  board.add_sample(HeartbeatSample{1, 10, Telemetry{}});
  board.add_sample(HeartbeatSample{2, 20, Telemetry{}});
  std::vector<HeartbeatSample> batch = board.take_samples();
  board.add_sample(HeartbeatSample{3, 30, Telemetry{}});
  board.add_sample(HeartbeatSample{4, 40, Telemetry{}});
  board.put_back_samples(std::move(batch));
  const std::vector<HeartbeatSample> kept = board.take_samples();
  ASSERT_EQ(kept.size(), 3u);  // the oldest dropped
  EXPECT_EQ(kept[0].lease_id, 2);
  EXPECT_EQ(kept[1].lease_id, 3);
  EXPECT_EQ(kept[2].lease_id, 4);
}

}  // namespace
}  // namespace yolo8::quota
