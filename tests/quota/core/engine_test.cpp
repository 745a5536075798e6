#include "quota/core/engine.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "tests/quota/quota_test_util.h"

namespace yolo8::quota {
namespace {

using testing::kHour;
using testing::kMinute;
using testing::kMonday;
using Kind = AcquireResult::Kind;

const int64_t kInsideWindow = kMonday + 9 * kHour;    // 10:00 at +01:00
const int64_t kOutsideWindow = kMonday + 13 * kHour;  // 14:00 at +01:00

LeaseRequest req(const std::string& team, const std::string& user, int gpus = 1, const std::string& model = "yolov8s") {
  LeaseRequest r;
  r.team = team;
  r.user = user;
  r.job = "job";
  r.model = model;
  r.gpus = gpus;
  return r;
}

void expect_sound(const Engine& e, int64_t now) {
  const auto errors = e.check_invariants(now);
  EXPECT_TRUE(errors.empty()) << errors.front();
}

bool has_audit(const Engine& e, const std::string& action, int64_t lease_id) {
  return std::any_of(e.audit().begin(), e.audit().end(),
                     [&](const AuditEntry& a) { return a.action == action && a.lease_id == lease_id; });
}

TEST(Engine, SixGpuTeamSeventhRequestWaits) {
  Engine e(testing::example_policy());
  const int64_t t = kOutsideWindow;
  std::vector<int64_t> ids;
  for (int i = 0; i < 6; ++i) {
    auto r = e.acquire(req("team-robotics", "erin"), t);
    ASSERT_EQ(r.kind, Kind::kGranted) << r.reason;
    ids.push_back(r.lease_id);
  }
  auto seventh = e.acquire(req("team-robotics", "erin"), t);
  ASSERT_EQ(seventh.kind, Kind::kQueued);
  EXPECT_EQ(seventh.position, 1);
  EXPECT_NE(seventh.reason.find("team-robotics uses 6.0 of the 6.0"), std::string::npos) << seventh.reason;
  expect_sound(e, t);
  // other teams are not affected
  EXPECT_EQ(e.acquire(req("team-cv", "alice"), t).kind, Kind::kGranted);
  // one release hands the GPU to the waiting request
  ASSERT_TRUE(e.release(ids[0], Outcome::kCompleted, t + kMinute));
  EXPECT_EQ(e.find(seventh.lease_id)->state, LeaseState::kGranted);
  expect_sound(e, t + kMinute);
}

TEST(Engine, BurstFourteenInsideWindowEightOutside) {
  for (const auto& [now, limit] : {std::make_pair(kInsideWindow, 14), std::make_pair(kOutsideWindow, 8)}) {
    Engine e(testing::example_policy());
    for (int i = 0; i < limit; ++i) {
      auto r = e.acquire(req("team-cv", "alice"), now);
      ASSERT_EQ(r.kind, Kind::kGranted) << "request " << i + 1 << ": " << r.reason;
      EXPECT_EQ(e.find(r.lease_id)->over_base, i >= 8);
    }
    auto next = e.acquire(req("team-cv", "bob"), now);
    EXPECT_EQ(next.kind, Kind::kQueued) << "limit " << limit;
    expect_sound(e, now);
  }
}

TEST(Engine, WindowClosingKeepsBurstLeasesButQueuesNewOnes) {
  Engine e(testing::example_policy());
  std::vector<int64_t> ids;
  for (int i = 0; i < 14; ++i) ids.push_back(e.acquire(req("team-cv", "alice"), kInsideWindow).lease_id);
  const int64_t after = kMonday + 11 * kHour + 5 * kMinute;  // the window closed at 11:00 UTC
  for (int64_t id : ids) e.heartbeat(id, {}, after - kMinute);
  e.tick(after);
  for (int64_t id : ids) EXPECT_EQ(e.find(id)->state, LeaseState::kGranted) << "lease " << id;
  auto r = e.acquire(req("team-cv", "bob"), after);
  EXPECT_EQ(r.kind, Kind::kQueued);
  EXPECT_NE(r.reason.find("only inside burst windows"), std::string::npos) << r.reason;
}

TEST(Engine, LargeModelsNeedApprovalFromTheirLead) {
  Engine e(testing::example_policy());
  const int64_t t = kOutsideWindow;
  auto no_reason = e.acquire(req("team-cv", "alice", 1, "yolov8x"), t);
  EXPECT_EQ(no_reason.kind, Kind::kNotAllowed);
  EXPECT_NE(no_reason.reason.find("justification"), std::string::npos);
  auto r = req("team-cv", "alice", 1, "yolov8l");
  r.justification = "paper deadline";
  auto pending = e.acquire(r, t);
  ASSERT_EQ(pending.kind, Kind::kNeedsApproval);
  EXPECT_GT(pending.approval_id, 0);
  EXPECT_EQ(e.find(pending.lease_id)->state, LeaseState::kPendingApproval);
  e.approve(pending.approval_id, "carol", t + kMinute);
  EXPECT_EQ(e.find(pending.lease_id)->state, LeaseState::kGranted);
  EXPECT_TRUE(has_audit(e, "approval.approved", pending.lease_id));
  EXPECT_THROW(e.approve(pending.approval_id, "carol", t + kMinute), PolicyError);
  // a custom model is in the approval tier too; rejection ends it
  auto c = req("team-cv", "bob", 1, "my-detector");
  c.justification = "try";
  auto custom = e.acquire(c, t);
  ASSERT_EQ(custom.kind, Kind::kNeedsApproval);
  e.reject(custom.approval_id, "carol", t + kMinute, "use yolov8m");
  EXPECT_EQ(e.find(custom.lease_id)->state, LeaseState::kRejected);
  // small models are self-service
  EXPECT_EQ(e.acquire(req("team-cv", "bob", 1, "yolov8n"), t).kind, Kind::kGranted);
}

TEST(Engine, EmergencyPoolGrantsCriticalAtOnceWithAudit) {
  Engine e(testing::example_policy());
  const int64_t t = kInsideWindow;
  for (int i = 0; i < 14; ++i) ASSERT_EQ(e.acquire(req("team-cv", "alice"), t).kind, Kind::kGranted);
  for (int i = 0; i < 3; ++i) ASSERT_EQ(e.acquire(req("team-robotics", "erin"), t).kind, Kind::kGranted);
  // 17 of 20 GPUs are used: the last 3 are the pool
  auto normal = e.acquire(req("team-interns", "ivan"), t);
  ASSERT_EQ(normal.kind, Kind::kQueued);
  EXPECT_NE(normal.reason.find("reserved for critical"), std::string::npos) << normal.reason;
  auto c = req("team-interns", "ivan", 2);
  c.priority = Priority::kCritical;
  EXPECT_EQ(e.acquire(c, t).kind, Kind::kNotAllowed);  // no justification
  c.justification = "production model regression";
  auto crit = e.acquire(c, t);
  ASSERT_EQ(crit.kind, Kind::kGranted) << crit.reason;
  EXPECT_TRUE(e.find(crit.lease_id)->emergency);
  EXPECT_TRUE(e.find(crit.lease_id)->review_pending);
  EXPECT_TRUE(has_audit(e, "emergency.granted", crit.lease_id));
  EXPECT_EQ(e.find(normal.lease_id)->state, LeaseState::kQueued);
  expect_sound(e, t);
}

TEST(Engine, PreemptsTheRightVictimAndHandsOverOnlyAfterRelease) {
  Engine e(testing::example_policy());
  const int64_t t0 = kInsideWindow;
  std::vector<int64_t> cv;
  for (int i = 0; i < 13; ++i) cv.push_back(e.acquire(req("team-cv", "alice"), t0).lease_id);
  for (int i = 0; i < 3; ++i) e.acquire(req("team-robotics", "erin"), t0);
  const int64_t young = e.acquire(req("team-cv", "bob"), t0 + 15 * kMinute).lease_id;  // 14th, over base
  ASSERT_EQ(e.find(young)->state, LeaseState::kGranted);
  const int64_t t1 = t0 + 20 * kMinute;
  // every lease reports a checkpoint; lease cv[10] (over base) has the freshest among the old ones,
  // the young one is fresher still but is protected by min_runtime
  for (const auto& [id, l] : e.leases()) {
    Telemetry tel;
    tel.last_checkpoint_ms = t0 + 10 * kMinute;
    if (id == cv[10]) tel.last_checkpoint_ms = t0 + 19 * kMinute;
    if (id == young) tel.last_checkpoint_ms = t1 - 1000;
    if (id == cv[2]) tel.last_checkpoint_ms = t1 - 2000;  // within base: not a first victim
    e.heartbeat(id, tel, t1);
  }
  auto waiter = e.acquire(req("team-robotics", "erin"), t1);  // 4th of a base of 6: a guarantee
  ASSERT_EQ(waiter.kind, Kind::kQueued);
  const Lease* victim = e.find(cv[10]);
  EXPECT_EQ(victim->state, LeaseState::kRevoking);
  EXPECT_EQ(victim->deadline_ms, t1 + 120 * 1000);
  EXPECT_EQ(victim->preempted_for, waiter.lease_id);
  EXPECT_TRUE(has_audit(e, "preempt.revoke", cv[10]));
  int revoking = 0;
  for (const auto& [id, l] : e.leases()) revoking += l.state == LeaseState::kRevoking;
  EXPECT_EQ(revoking, 1);
  EXPECT_NE(waiter.reason.find("waiting for preempted"), std::string::npos) << waiter.reason;
  // the victim learns it on its heartbeat; the waiter still waits
  auto hb = e.heartbeat(cv[10], {}, t1 + 5000);
  EXPECT_EQ(hb.state, LeaseState::kRevoking);
  EXPECT_EQ(hb.deadline_ms, t1 + 120 * 1000);
  e.tick(t1 + 10000);
  EXPECT_EQ(e.find(waiter.lease_id)->state, LeaseState::kQueued);
  expect_sound(e, t1 + 10000);
  const auto victim_devices = e.find(cv[10])->devices;
  ASSERT_TRUE(e.release(cv[10], Outcome::kPreempted, t1 + 30000));
  const Lease* w = e.find(waiter.lease_id);
  EXPECT_EQ(w->state, LeaseState::kGranted);
  EXPECT_EQ(w->devices, victim_devices);
  expect_sound(e, t1 + 30000);
  // the preempted job asks again and waits in the queue
  auto again = e.acquire(req("team-cv", "alice"), t1 + 31000);
  EXPECT_EQ(again.kind, Kind::kQueued);
}

TEST(Engine, CriticalPreemptsLowestPriorityOnceThePoolIsGoneAndDeadlinesBind) {
  Engine e(testing::example_policy());
  const int64_t t0 = kOutsideWindow;
  const int64_t t1 = t0 + 30 * kMinute;
  auto low = req("team-interns", "ivan");
  low.priority = Priority::kLow;
  const int64_t old_low = e.acquire(low, t0).lease_id;
  for (int i = 0; i < 6; ++i) ASSERT_EQ(e.acquire(req("team-robotics", "erin"), t0).kind, Kind::kGranted);
  for (int i = 0; i < 8; ++i) ASSERT_EQ(e.acquire(req("team-cv", "alice"), t0).kind, Kind::kGranted);
  const int64_t young_low = e.acquire(low, t1 - 5 * kMinute).lease_id;  // younger than min_runtime
  ASSERT_EQ(e.find(young_low)->state, LeaseState::kGranted);
  for (const auto& [id, l] : e.leases()) e.heartbeat(id, {}, t1);
  auto crit = req("team-robotics", "dave", 4);
  crit.priority = Priority::kCritical;
  crit.justification = "outage";
  ASSERT_EQ(e.acquire(crit, t1).kind, Kind::kGranted);  // 1 free GPU + the pool of 3
  auto crit2 = req("team-cv", "carol", 1);
  crit2.priority = Priority::kCritical;
  crit2.justification = "second outage";
  auto waiter = e.acquire(crit2, t1);
  ASSERT_EQ(waiter.kind, Kind::kQueued);
  EXPECT_EQ(e.find(old_low)->state, LeaseState::kRevoking);  // lowest priority, old enough
  EXPECT_EQ(e.find(young_low)->state, LeaseState::kGranted);
  // the victim ignores the deadline: its lease ends at the deadline and the waiter starts then, not before
  const int64_t deadline = e.find(old_low)->deadline_ms;
  for (int64_t t = t1 + 30000; t < deadline; t += 30000) {
    for (const auto& [id, l] : e.leases()) e.heartbeat(id, {}, t);
    e.tick(t);
  }
  e.tick(deadline - 1000);
  EXPECT_EQ(e.find(old_low)->state, LeaseState::kRevoking);
  EXPECT_EQ(e.find(waiter.lease_id)->state, LeaseState::kQueued);
  e.tick(deadline);
  EXPECT_EQ(e.find(old_low)->state, LeaseState::kExpired);
  EXPECT_EQ(e.find(old_low)->outcome, Outcome::kPreempted);
  EXPECT_EQ(e.find(waiter.lease_id)->state, LeaseState::kGranted);
  expect_sound(e, deadline);
}

TEST(Engine, AtItsLimitATeamPreemptsOnlyItsOwnLowerPriorityWork) {
  Engine e(testing::example_policy());
  const int64_t t0 = kOutsideWindow;
  std::vector<int64_t> robo;
  for (int i = 0; i < 6; ++i) {
    auto r = req("team-robotics", "erin");
    r.priority = i == 4 ? Priority::kLow : Priority::kNormal;
    robo.push_back(e.acquire(r, t0).lease_id);
  }
  auto low_cv = req("team-cv", "alice");
  low_cv.priority = Priority::kLow;
  const int64_t cv_low = e.acquire(low_cv, t0).lease_id;
  const int64_t t1 = t0 + 15 * kMinute;
  for (const auto& [id, l] : e.leases()) e.heartbeat(id, {}, t1);
  auto high = req("team-robotics", "dave");
  high.priority = Priority::kHigh;
  auto w = e.acquire(high, t1);
  ASSERT_EQ(w.kind, Kind::kQueued);
  EXPECT_EQ(e.find(robo[4])->state, LeaseState::kRevoking);  // its own low-priority lease
  EXPECT_EQ(e.find(cv_low)->state, LeaseState::kGranted);    // another team's work is not touched
  e.release(robo[4], Outcome::kPreempted, t1 + 1000);
  EXPECT_EQ(e.find(w.lease_id)->state, LeaseState::kGranted);
  // an equal-priority request at the limit preempts nobody
  auto same = e.acquire(req("team-robotics", "erin"), t1 + 2000);
  EXPECT_EQ(same.kind, Kind::kQueued);
  int revoking = 0;
  for (const auto& [id, l] : e.leases()) revoking += l.state == LeaseState::kRevoking;
  EXPECT_EQ(revoking, 0);
}

TEST(Engine, AfterTheBurstWindowClosesBurstLeasesAreTheFirstVictims) {
  Engine e(testing::example_policy());
  const int64_t t0 = kInsideWindow;
  std::vector<int64_t> cv;
  for (int i = 0; i < 14; ++i) cv.push_back(e.acquire(req("team-cv", "alice"), t0).lease_id);
  for (int i = 0; i < 3; ++i) e.acquire(req("team-robotics", "erin"), t0);
  const int64_t closed = kMonday + 11 * kHour + 10 * kMinute;
  for (const auto& [id, l] : e.leases()) {
    Telemetry t;
    // a within-base cv lease has the freshest checkpoint, yet burst leases go first
    t.last_checkpoint_ms = l.id == cv[0] ? closed - 1000 : closed - 60 * kMinute;
    if (l.id == cv[12]) t.last_checkpoint_ms = closed - 2000;
    e.heartbeat(id, t, closed);
  }
  e.tick(closed);
  for (int64_t id : cv) EXPECT_EQ(e.find(id)->state, LeaseState::kGranted);  // not killed at the close
  auto w = e.acquire(req("team-robotics", "erin", 2), closed);
  ASSERT_EQ(w.kind, Kind::kQueued);
  std::vector<int64_t> victims;
  for (const auto& [id, l] : e.leases()) {
    if (l.state == LeaseState::kRevoking) victims.push_back(id);
  }
  ASSERT_EQ(victims.size(), 2u);
  for (int64_t v : victims) EXPECT_TRUE(e.find(v)->over_base) << "lease " << v;
  EXPECT_TRUE(std::find(victims.begin(), victims.end(), cv[12]) != victims.end());  // freshest burst checkpoint
}

TEST(Engine, EmergencyReviewIsClosedOnceAndAudited) {
  Engine e(testing::example_policy());
  auto c = req("team-interns", "ivan");
  c.priority = Priority::kCritical;
  c.justification = "demo day";
  auto g = e.acquire(c, kMonday);
  ASSERT_TRUE(e.find(g.lease_id)->review_pending);
  e.review_emergency(g.lease_id, "admin", kMonday + kHour, "justified");
  EXPECT_FALSE(e.find(g.lease_id)->review_pending);
  EXPECT_TRUE(has_audit(e, "emergency.reviewed", g.lease_id));
  EXPECT_THROW(e.review_emergency(g.lease_id, "admin", kMonday + kHour, ""), PolicyError);
}

TEST(Engine, CancelledWaiterGivesTheVictimItsLeaseBack) {
  Engine e(testing::example_policy());
  const int64_t t0 = kInsideWindow;
  for (int i = 0; i < 14; ++i) e.acquire(req("team-cv", "alice"), t0);
  for (int i = 0; i < 3; ++i) e.acquire(req("team-robotics", "erin"), t0);
  const int64_t t1 = t0 + 20 * kMinute;
  for (const auto& [id, l] : e.leases()) e.heartbeat(id, {}, t1);
  auto waiter = e.acquire(req("team-robotics", "erin"), t1);
  ASSERT_EQ(waiter.kind, Kind::kQueued);
  int64_t victim = 0;
  for (const auto& [id, l] : e.leases()) {
    if (l.state == LeaseState::kRevoking) victim = id;
  }
  ASSERT_NE(victim, 0);
  EXPECT_TRUE(e.find(victim)->over_base);
  e.release(waiter.lease_id, Outcome::kCancelled, t1 + 1000);
  EXPECT_EQ(e.find(victim)->state, LeaseState::kGranted);
  EXPECT_EQ(e.find(victim)->deadline_ms, 0);
}

TEST(Engine, ExpiryReturnsGpusAfterGrace) {
  Engine e(testing::example_policy());
  const int64_t t0 = kOutsideWindow;
  std::vector<int64_t> ids;
  for (int i = 0; i < 6; ++i) ids.push_back(e.acquire(req("team-robotics", "erin"), t0).lease_id);
  auto waiter = e.acquire(req("team-robotics", "erin"), t0);
  ASSERT_EQ(waiter.kind, Kind::kQueued);
  for (int s = 10; s <= 60; s += 10) {
    for (size_t i = 1; i < ids.size(); ++i) e.heartbeat(ids[i], {}, t0 + s * 1000);
    e.heartbeat(waiter.lease_id, {}, t0 + s * 1000);  // polling keeps the queued request alive
    e.tick(t0 + s * 1000);
  }
  e.tick(t0 + 61 * 1000);  // ids[0] has been silent for 61 s (ttl 60)
  EXPECT_EQ(e.find(ids[0])->state, LeaseState::kExpired);
  EXPECT_TRUE(e.find(ids[0])->holds_gpus(t0 + 61 * 1000));
  EXPECT_EQ(e.find(waiter.lease_id)->state, LeaseState::kQueued);
  for (size_t i = 1; i < ids.size(); ++i) e.heartbeat(ids[i], {}, t0 + 85 * 1000);
  e.heartbeat(waiter.lease_id, {}, t0 + 85 * 1000);
  e.tick(t0 + 89 * 1000);  // expired at 60 s, grace 30 s: GPUs still held
  EXPECT_EQ(e.find(waiter.lease_id)->state, LeaseState::kQueued);
  e.tick(t0 + 90 * 1000);
  EXPECT_EQ(e.find(waiter.lease_id)->state, LeaseState::kGranted);
  EXPECT_TRUE(has_audit(e, "lease.expired", ids[0]));
  expect_sound(e, t0 + 90 * 1000);
}

TEST(Engine, AdmissionRefusesWhatCannotFitWithTheLargestBatch) {
  Engine e(testing::example_policy());
  auto r = req("team-cv", "alice", 1, "yolov8m");
  r.batch = 256;  // 2.5 + 0.33 * 256 = 87 GiB > 80
  auto refused = e.acquire(r, kOutsideWindow);
  ASSERT_EQ(refused.kind, Kind::kAdmissionRefused);
  EXPECT_EQ(refused.max_batch, 234);  // floor((80 - 2.5) / 0.33)
  EXPECT_NE(refused.reason.find("at most batch 234 fits, or use batch=auto"), std::string::npos) << refused.reason;
  r.gpus = 2;  // 128 per GPU fits
  EXPECT_EQ(e.acquire(r, kOutsideWindow).kind, Kind::kGranted);
  auto shared = req("team-cv", "alice", 1, "yolov8s");
  shared.shared = true;
  shared.memory_gib = 6;
  shared.batch = 64;  // 1.5 + 0.16 * 64 = 11.7 > 6
  auto s = e.acquire(shared, kOutsideWindow);
  ASSERT_EQ(s.kind, Kind::kAdmissionRefused);
  EXPECT_EQ(s.max_batch, 28);
  shared.batch = 0;  // auto
  EXPECT_EQ(e.acquire(shared, kOutsideWindow).kind, Kind::kGranted);
}

// The answer names the memory table row admission used, granted or refused.
TEST(Engine, AdmissionNamesTheMemoryTableRowItUsed) {
  Engine e(testing::example_policy());
  auto r = req("team-cv", "alice", 1, "yolov8m");
  r.batch = 32;
  auto granted = e.acquire(r, kOutsideWindow);
  ASSERT_EQ(granted.kind, Kind::kGranted) << granted.reason;
  EXPECT_NE(granted.memory_row.find("memory-table.yaml row yolov8m: 2.500 GiB + 0.3300 GiB per image at 640 "
                                    "(estimate)"),
            std::string::npos)
      << granted.memory_row;
  EXPECT_NEAR(granted.needed_gib, 2.5 + 0.33 * 32, 1e-9);
  r.batch = 512;
  auto refused = e.acquire(r, kOutsideWindow);
  ASSERT_EQ(refused.kind, Kind::kAdmissionRefused);
  EXPECT_EQ(refused.memory_row, granted.memory_row);
  EXPECT_NE(refused.reason.find("; from memory table "), std::string::npos) << refused.reason;
  EXPECT_EQ(e.acquire(req("team-cv", "alice", 1, "custom-net"), kOutsideWindow).memory_row, "");
}

TEST(Engine, WholeGpuLeasesLandOnGpusBigEnoughForTheEstimate) {
  Engine e(testing::example_policy());
  auto small = e.acquire(req("team-cv", "alice", 1, "yolov8n"), kOutsideWindow);  // best fit: the 24 GiB node
  EXPECT_EQ(e.policy().gpus.at(static_cast<size_t>(e.find(small.lease_id)->devices.at(0))).node, "node-c");
  auto r = req("team-cv", "alice", 1, "yolov8m");
  r.batch = 64;  // 2.5 + 0.33 * 64 = 23.6 GiB fits 24
  auto fits = e.acquire(r, kOutsideWindow);
  EXPECT_EQ(e.policy().gpus.at(static_cast<size_t>(e.find(fits.lease_id)->devices.at(0))).node, "node-c");
  r.batch = 96;  // 34.2 GiB: only the 80 GiB nodes
  auto big = e.acquire(r, kOutsideWindow);
  ASSERT_EQ(big.kind, Kind::kGranted);
  EXPECT_DOUBLE_EQ(e.policy().gpus.at(static_cast<size_t>(e.find(big.lease_id)->devices.at(0))).memory_gib, 80);
}

// The lease's memory is what its holder may use (the trainer sizes batch=auto to it), not the admission
// estimate it was placed by: the whole GPU for a whole-GPU lease, the share for a shared one.
TEST(Engine, WholeGpuLeaseCarriesItsGpusMemory) {
  Engine e(testing::example_policy());
  auto small = e.acquire(req("team-cv", "alice", 1, "yolov8n"), kOutsideWindow);  // best fit: node-c, 24 GiB
  ASSERT_EQ(small.kind, Kind::kGranted) << small.reason;
  EXPECT_DOUBLE_EQ(e.find(small.lease_id)->memory_gib, 24);
  auto r = req("team-cv", "alice", 1, "yolov8m");
  r.batch = 96;  // 34.2 GiB estimated: an 80 GiB GPU
  auto big = e.acquire(r, kOutsideWindow);
  ASSERT_EQ(big.kind, Kind::kGranted) << big.reason;
  EXPECT_DOUBLE_EQ(e.find(big.lease_id)->memory_gib, 80);
  auto shared = req("team-cv", "alice", 1, "yolov8n");
  shared.shared = true;
  shared.memory_gib = 6;
  auto s = e.acquire(shared, kOutsideWindow);
  ASSERT_EQ(s.kind, Kind::kGranted) << s.reason;
  EXPECT_DOUBLE_EQ(e.find(s.lease_id)->memory_gib, 6);
  expect_sound(e, kOutsideWindow);
}

// A shared request the policy cannot honour is refused with the reason, never granted as whole GPUs.
TEST(Engine, SharedRequestsThePolicyDoesNotAllowAreRefused) {
  Policy policy = testing::example_policy();
  policy.shared_models = {"yolov8n", "yolov8s"};
  Engine e(policy);
  auto big = req("team-cv", "alice", 1, "yolov8m");
  big.shared = true;
  auto refused = e.acquire(big, kOutsideWindow);
  EXPECT_EQ(refused.kind, Kind::kNotAllowed);
  EXPECT_NE(refused.reason.find("model yolov8m needs whole GPUs; only yolov8n, yolov8s may share"), std::string::npos)
      << refused.reason;
  auto two = req("team-cv", "alice", 2, "yolov8n");
  two.shared = true;
  EXPECT_EQ(e.acquire(two, kOutsideWindow).kind, Kind::kNotAllowed);
  auto fine = req("team-cv", "alice", 1, "yolov8n");
  fine.shared = true;
  EXPECT_EQ(e.acquire(fine, kOutsideWindow).kind, Kind::kGranted);
  policy.sharing_enabled = false;
  Engine off(policy);
  auto no = off.acquire(fine, kOutsideWindow);
  EXPECT_EQ(no.kind, Kind::kNotAllowed);
  EXPECT_NE(no.reason.find("sharing.enabled is false"), std::string::npos) << no.reason;
  EXPECT_TRUE(off.leases().empty());
}

TEST(Engine, SharedLeasesNeverExceedGpuMemory) {
  Engine e(testing::example_policy());
  std::vector<int> devices;
  for (int i = 0; i < 4; ++i) {
    auto r = req("team-cv", "alice", 1, "yolov8n");
    r.shared = true;
    r.memory_gib = 6;
    auto g = e.acquire(r, kOutsideWindow);
    ASSERT_EQ(g.kind, Kind::kGranted);
    devices.push_back(e.find(g.lease_id)->devices.at(0));
  }
  // packed: all four 6 GiB shares on one 24 GiB GPU (best fit)
  EXPECT_TRUE(std::all_of(devices.begin(), devices.end(), [&](int d) { return d == devices[0]; }));
  EXPECT_NEAR(e.team_units("team-cv", kOutsideWindow), 1.0, 1e-9);
  auto r = req("team-cv", "alice", 1, "yolov8n");
  r.shared = true;
  r.memory_gib = 2;
  auto fifth = e.acquire(r, kOutsideWindow);
  ASSERT_EQ(fifth.kind, Kind::kGranted);
  EXPECT_NE(e.find(fifth.lease_id)->devices.at(0), devices[0]);  // at most 4 leases per GPU
  EXPECT_DOUBLE_EQ(e.policy().gpus.at(static_cast<size_t>(devices[0])).memory_gib, 24);
  expect_sound(e, kOutsideWindow);
}

TEST(Engine, CreditsChargedFromServerTimeWithLoan) {
  Engine e(testing::example_policy());
  const int64_t t0 = kMonday + 9 * kHour;  // same month: November 2026 ends Monday night
  auto g = e.acquire(req("team-cv", "alice", 4), t0);
  ASSERT_EQ(g.kind, Kind::kGranted);
  for (int m = 1; m <= 90; ++m) {
    e.heartbeat(g.lease_id, {}, t0 + m * kMinute);
    e.tick(t0 + m * kMinute);
  }
  e.release(g.lease_id, Outcome::kCompleted, t0 + 90 * kMinute);
  EXPECT_NEAR(e.used_gpu_hours("alice", "2026-11", t0 + 90 * kMinute), 6.0, 1e-6);  // 1.5 h x 4 GPUs
  EXPECT_NEAR(e.find(g.lease_id)->gpu_hours, 6.0, 1e-6);
  // an account at 119 of 100 + 20 loan may still start; at 120 it is spent
  std::map<std::pair<std::string, std::string>, double> usage{{{"bob", "2026-11"}, 119.0}};
  e.restore({}, {}, {}, usage, 1, 0);
  EXPECT_EQ(e.acquire(req("team-cv", "bob"), t0).kind, Kind::kGranted);
  usage[{"bob", "2026-11"}] = 120.0;
  e.restore({}, {}, {}, usage, 1, 0);
  auto spent = e.acquire(req("team-cv", "bob"), t0);
  EXPECT_EQ(spent.kind, Kind::kCreditsSpent);
  EXPECT_NE(spent.reason.find("120.0 of 120.0"), std::string::npos) << spent.reason;
  // last month's 20 h loan is paid back from this month's allowance
  usage = {{{"bob", "2026-10"}, 120.0}, {{"bob", "2026-11"}, 100.0}};
  e.restore({}, {}, {}, usage, 1, 0);
  EXPECT_NEAR(e.credit_allowance("bob", "2026-11", t0), 100.0, 1e-9);
  EXPECT_EQ(e.acquire(req("team-cv", "bob"), t0).kind, Kind::kCreditsSpent);
  // critical work is not blocked by credits
  auto c = req("team-cv", "bob");
  c.priority = Priority::kCritical;
  c.justification = "incident";
  EXPECT_EQ(e.acquire(c, t0).kind, Kind::kGranted);
}

TEST(Engine, IdempotencyKeyReplaysTheSameLease) {
  Engine e(testing::example_policy());
  auto r = req("team-cv", "alice");
  r.idempotency_key = "k1";
  auto a = e.acquire(r, kOutsideWindow);
  auto b = e.acquire(r, kOutsideWindow + 1000);
  EXPECT_EQ(a.lease_id, b.lease_id);
  EXPECT_TRUE(b.replayed);
  EXPECT_EQ(e.leases().size(), 1u);
  r.user = "bob";  // keys are per user
  EXPECT_NE(e.acquire(r, kOutsideWindow).lease_id, a.lease_id);
}

TEST(Engine, InvalidRequestsAreRefusedWithTheKey) {
  Engine e(testing::example_policy());
  auto r = req("team-nope", "alice");
  EXPECT_EQ(e.acquire(r, kMonday).kind, Kind::kInvalid);
  r = req("team-cv", "alice", 99);
  auto bad = e.acquire(r, kMonday);
  EXPECT_EQ(bad.kind, Kind::kInvalid);
  EXPECT_NE(bad.reason.find("gpus"), std::string::npos);
  r = req("team-cv", "alice");
  r.imgsz = 100000;
  EXPECT_EQ(e.acquire(r, kMonday).kind, Kind::kInvalid);
  EXPECT_TRUE(e.leases().empty());
}

}  // namespace
}  // namespace yolo8::quota
