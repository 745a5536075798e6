#include "quota/core/scheduler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "quota/core/engine.h"
#include "tests/quota/quota_test_util.h"

namespace yolo8::quota {
namespace {

using testing::kHour;
using testing::kMinute;
using testing::kMonday;
using Kind = Decision::Step::Kind;

constexpr double kEps = 1e-6;
const int64_t kInsideWindow = kMonday + 9 * kHour;    // team-cv's burst window (10:00 at +01:00)
const int64_t kOutsideWindow = kMonday + 13 * kHour;  // its burst closed

// The example policy's teams and their members (configs/quota-policy.yaml).
const std::vector<std::pair<std::string, std::vector<std::string>>> kTeams = {
    {"team-cv", {"alice", "bob", "carol"}}, {"team-robotics", {"erin", "dave"}}, {"team-interns", {"ivan", "oscar"}}};

// A random queued request, as the engine records one after admission.
Lease random_queued(std::mt19937& rng, int64_t id, int64_t now_ms) {
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<unsigned>(n)); };
  const auto& [team, users] = kTeams[static_cast<size_t>(pick(3))];
  Lease lease;
  lease.id = id;
  lease.req.team = team;
  lease.req.user = users[static_cast<size_t>(pick(static_cast<int>(users.size())))];
  lease.req.job = "job";
  lease.req.priority = static_cast<Priority>(pick(10) == 0 ? static_cast<int>(Priority::kCritical) : pick(3));
  lease.req.preemptible = pick(4) != 0;
  lease.state = LeaseState::kQueued;
  lease.shared = lease.req.priority != Priority::kCritical && pick(3) == 0;
  lease.req.shared = lease.shared;
  if (lease.shared) {
    lease.req.model = "yolov8n";
    lease.req.gpus = 1;
    lease.gpus = 1;
    lease.memory_gib = 2 + pick(20);
  } else {
    lease.req.model = "yolov8s";
    lease.req.gpus = 1 + (pick(3) == 0 ? pick(4) : 0);
    lease.gpus = lease.req.gpus;
    if (pick(5) == 0) lease.req.max_gpus = lease.gpus + 1 + pick(3);
    lease.memory_gib = pick(4) == 0 ? 30 : 6;  // 30 GiB: only the 80 GiB GPUs
  }
  if (pick(8) == 0) lease.req.node = pick(2) == 0 ? "node-c" : "node-a";
  lease.req.memory_gib = lease.memory_gib;
  lease.created_ms = now_ms - pick(600) * 1000;
  lease.last_seen_ms = now_ms;
  return lease;
}

// Applies a decision to `leases` as the engine does (its records only; the engine also audits).
void apply(std::map<int64_t, Lease>& leases, const Decision& decision, const Policy& policy, int64_t now_ms) {
  for (const auto& step : decision.steps) apply_step(leases, step, policy, now_ms);
}

// A random state the scheduler could meet: rounds of random requests scheduled at random times (inside and
// outside team-cv's burst window), some leases released, some revoked, the rest waiting.
struct RandomState {
  Policy policy = testing::example_policy();
  Inventory inventory{policy};
  std::map<int64_t, Lease> leases;
  FairUsage usage;
  int64_t now_ms = kInsideWindow;

  explicit RandomState(uint32_t seed) {
    std::mt19937 rng(seed);
    int64_t next_id = 1;
    const int rounds = 1 + static_cast<int>(rng() % 4);
    for (int round = 0; round < rounds; ++round) {
      const int requests = static_cast<int>(rng() % 12);
      for (int i = 0; i < requests; ++i) {
        Lease lease = random_queued(rng, next_id++, now_ms);
        leases.emplace(lease.id, lease);
      }
      for (const char* team : {"team-cv", "team-robotics", "team-interns"}) {
        add_fair_usage(policy, usage, team, kTeams[0].second[0], static_cast<double>(rng() % 50), now_ms);
      }
      const Decision decision = schedule(view());
      apply(leases, decision, policy, now_ms);
      // some leases end (their GPUs free at once), time passes (past min_runtime_s, often)
      for (auto& [id, lease] : leases) {
        if (lease.state == LeaseState::kGranted && rng() % 5 == 0) lease.state = LeaseState::kReleased;
        if (lease.state == LeaseState::kRevoking && rng() % 2 == 0) lease.state = LeaseState::kReleased;
      }
      now_ms += static_cast<int64_t>(rng() % 3) * 6 * kMinute;
      if (rng() % 3 == 0) now_ms = std::max(now_ms, kOutsideWindow);
    }
    // the last requests, not yet looked at
    for (int i = static_cast<int>(rng() % 10); i > 0; --i) {
      Lease lease = random_queued(rng, next_id++, now_ms);
      leases.emplace(lease.id, lease);
    }
  }
  ClusterState view() const { return ClusterState{policy, inventory, leases, usage, now_ms}; }
};

std::string describe(const Decision& decision) {
  std::string text;
  for (const auto& step : decision.steps) {
    text += std::to_string(static_cast<int>(step.kind)) + ":" + std::to_string(step.lease_id) + "[";
    for (int device : step.grant.devices) text += std::to_string(device) + ",";
    text += "|" + std::to_string(step.grant.gpus) + "|";
    for (int64_t victim : step.preemption.victims) text += std::to_string(victim) + ",";
    text += "] ";
  }
  text += "queue:";
  for (const auto& entry : decision.queue) text += " " + std::to_string(entry.lease_id);
  return text;
}

// Every GPU within its memory (a shared lease counting its share plus the per-process overhead), a whole lease
// alone on its GPUs, one owner (a team or the pool) per GPU, at most max_leases_per_gpu leases and no more
// non-critical GPUs than the pool leaves.
std::vector<std::string> gpu_errors(const ClusterState& state) {
  std::vector<std::string> errors;
  const size_t gpus = state.policy.gpus.size();
  std::vector<double> memory(gpus, 0);
  std::vector<int> count(gpus, 0), whole(gpus, 0);
  std::vector<std::set<std::string>> owners(gpus);
  std::vector<bool> non_critical(gpus, false);
  for (const auto& [id, lease] : state.leases) {
    if (!lease.holds_gpus(state.now_ms)) continue;
    if (lease.devices.size() != (lease.shared ? 1u : static_cast<size_t>(lease.gpus))) {
      errors.push_back("lease " + std::to_string(id) + " holds the wrong number of devices");
    }
    for (int device : lease.devices) {
      const auto gpu = static_cast<size_t>(device);
      memory[gpu] +=
          lease.shared ? lease.memory_gib + state.policy.shared_overhead_gib() : state.policy.gpus[gpu].memory_gib;
      ++count[gpu];
      whole[gpu] += lease.shared ? 0 : 1;
      const bool critical = lease.req.priority == Priority::kCritical;
      owners[gpu].insert(critical ? "pool" : lease.req.team);
      non_critical[gpu] = non_critical[gpu] || !critical;
      if (!lease.shared && state.policy.gpus[gpu].memory_gib + kEps < lease.req.memory_gib) {
        errors.push_back("lease " + std::to_string(id) + " on a GPU smaller than it needs");
      }
    }
  }
  for (size_t gpu = 0; gpu < gpus; ++gpu) {
    const std::string name = "GPU " + std::to_string(gpu);
    if (memory[gpu] > state.policy.gpus[gpu].memory_gib + kEps) errors.push_back(name + " over its memory");
    if (whole[gpu] > 0 && count[gpu] > 1) errors.push_back(name + " shares a whole lease's GPU");
    if (count[gpu] > state.policy.max_leases_per_gpu) errors.push_back(name + " over max_leases_per_gpu");
    if (owners[gpu].size() > 1) errors.push_back(name + " has more than one owner");
  }
  const long busy = std::count(non_critical.begin(), non_critical.end(), true);
  if (busy > state.policy.total_gpus() - state.policy.emergency_pool_gpus()) {
    errors.push_back("non-critical leases hold the emergency pool");
  }
  return errors;
}

constexpr uint32_t kStates = 2000;

TEST(Scheduler, RandomStatesAreNeverOverGranted) {
  size_t grants = 0, preemptions = 0;
  for (uint32_t seed = 1; seed <= kStates; ++seed) {
    RandomState random(seed);
    ASSERT_TRUE(gpu_errors(random.view()).empty()) << "seed " << seed << ": " << gpu_errors(random.view()).front();
    const Decision decision = schedule(random.view());
    // grant by grant, in the decision's order: each within its team's limit now and its user's cap
    std::map<int64_t, Lease> after = random.leases;
    for (const auto& step : decision.steps) {
      Decision one;
      one.steps = {step};
      apply(after, one, random.policy, random.now_ms);
      const ClusterState state{random.policy, random.inventory, after, random.usage, random.now_ms};
      if (step.kind == Kind::kPreempt) ++preemptions;
      if (step.kind != Kind::kGrant) continue;
      ++grants;
      const Lease& lease = after.at(step.lease_id);
      ASSERT_EQ(lease.state, LeaseState::kGranted);
      EXPECT_LE(lease.gpus, std::max(lease.req.gpus, lease.req.max_gpus)) << "seed " << seed;
      if (lease.req.priority == Priority::kCritical) continue;
      const Team& team = random.policy.teams.at(lease.req.team);
      EXPECT_LE(team_units(state, lease.req.team), team.limit_at(random.now_ms) + kEps)
          << "seed " << seed << " lease " << lease.id << ": " << describe(decision);
      if (team.max_gpus_per_user > 0) {
        EXPECT_LE(held_gpus(state, [&](const Lease& other) { return other.req.user == lease.req.user; }),
                  team.max_gpus_per_user + kEps)
            << "seed " << seed;
      }
    }
    const ClusterState state{random.policy, random.inventory, after, random.usage, random.now_ms};
    const auto errors = gpu_errors(state);
    EXPECT_TRUE(errors.empty()) << "seed " << seed << ": " << errors.front() << "; " << describe(decision);
    // the queue lists exactly the leases still waiting
    size_t queued = 0;
    for (const auto& [id, lease] : after) queued += lease.state == LeaseState::kQueued ? 1 : 0;
    EXPECT_EQ(decision.queue.size(), queued) << "seed " << seed;
  }
  // the random states exercise both kinds of decision
  EXPECT_GT(grants, kStates);
  EXPECT_GT(preemptions, kStates / 20);
}

TEST(Scheduler, TheSameStateGivesTheSameDecisionWhateverEndedLeasesItCarries) {
  for (uint32_t seed = 1; seed <= kStates; ++seed) {
    RandomState random(seed);
    const std::string first = describe(schedule(random.view()));
    EXPECT_EQ(describe(schedule(random.view())), first) << "seed " << seed;
    // leases that neither hold GPUs nor wait are read by no decision
    std::map<int64_t, Lease> live;
    for (const auto& [id, lease] : random.leases) {
      if (lease.state == LeaseState::kQueued || lease.holds_gpus(random.now_ms)) live.emplace(id, lease);
    }
    const ClusterState only_live{random.policy, random.inventory, live, random.usage, random.now_ms};
    EXPECT_EQ(describe(schedule(only_live)), first) << "seed " << seed;
  }
}

TEST(Scheduler, VictimsAreRevocableByTheDocumentedRulesAndTakenInRankOrder) {
  size_t checked = 0;
  for (uint32_t seed = 1; seed <= kStates; ++seed) {
    RandomState random(seed);
    const Decision decision = schedule(random.view());
    std::map<int64_t, Lease> after = random.leases;
    for (const auto& step : decision.steps) {
      const ClusterState before{random.policy, random.inventory, after, random.usage, random.now_ms};
      if (step.kind == Kind::kPreempt) {
        const Lease& waiting = after.at(step.lease_id);
        ASSERT_FALSE(step.preemption.victims.empty());
        ASSERT_EQ(step.preemption.rules.size(), step.preemption.victims.size());
        for (size_t i = 0; i < step.preemption.victims.size(); ++i) {
          const Lease& victim = after.at(step.preemption.victims[i]);
          const PreemptionRule rule = step.preemption.rules[i];
          EXPECT_TRUE(allows_preemption(rule)) << to_string(rule);
          // quota/README.md: victims are running, never critical, never younger than min_runtime_s, and never
          // `preemptible: false` unless granted over their team's base or holding a per-job burst
          EXPECT_EQ(victim.state, LeaseState::kGranted);
          EXPECT_NE(victim.req.priority, Priority::kCritical);
          EXPECT_GE(random.now_ms - victim.granted_ms, int64_t{random.policy.min_runtime_s} * 1000);
          if (!victim.req.preemptible) {
            EXPECT_TRUE(victim.over_base || victim.extra_gpus > 0) << "seed " << seed;
          }
          if (rule == PreemptionRule::kLowerPriority) {
            EXPECT_LT(victim.req.priority, waiting.req.priority);
          }
          if (rule == PreemptionRule::kIdleBurst) {
            EXPECT_GT(victim.extra_gpus, 0);
          }
          if (rule == PreemptionRule::kReclaimBurstLease || rule == PreemptionRule::kReclaimOverBaseTeam) {
            EXPECT_NE(victim.req.team, waiting.req.team);
          }
          if (i > 0) {
            EXPECT_LE(victim_rank(before, after.at(step.preemption.victims[i - 1])), victim_rank(before, victim))
                << "seed " << seed;
          }
          ++checked;
        }
        // with its victims gone the waiting request fits, and it waits for them
        std::set<int64_t> gone(step.preemption.victims.begin(), step.preemption.victims.end());
        EXPECT_TRUE(place(before, ask_of(before, waiting), waiting.id, gone).has_value()) << "seed " << seed;
      }
      Decision one;
      one.steps = {step};
      apply(after, one, random.policy, random.now_ms);
    }
  }
  EXPECT_GT(checked, kStates / 20);
}

TEST(Scheduler, TheQueueIsInTheDocumentedOrder) {
  size_t pairs = 0;
  for (uint32_t seed = 1; seed <= kStates; seed += 4) {
    RandomState random(seed);
    const Decision decision = schedule(random.view());
    // waiting on a preemption first, then priority, then the fair-share factor (higher first), then arrival
    for (size_t i = 1; i < decision.queue.size(); ++i) {
      const QueueEntry& front = decision.queue[i - 1];
      const QueueEntry& back = decision.queue[i];
      const auto key = [](const QueueEntry& entry) {
        return std::make_tuple(!entry.waiting_on_preemption, -static_cast<int>(entry.priority), -entry.fair_share,
                               entry.created_ms);
      };
      EXPECT_LE(key(front), key(back)) << "seed " << seed;
      ++pairs;
    }
  }
  EXPECT_GT(pairs, kStates / 2);
}

TEST(Scheduler, PreemptionRulesApplyInTheDocumentedOrder) {
  PreemptionFacts facts;
  facts.running = true;
  facts.lower_priority = true;
  EXPECT_EQ(preemption_rule(facts), PreemptionRule::kLowerPriority);
  facts.preemptible = false;
  EXPECT_EQ(preemption_rule(facts), PreemptionRule::kNotPreemptible);
  // a per-job burst and a lease over base reclaimed for a team within its base go, preemptible or not
  facts.idle_burst = true;
  EXPECT_EQ(preemption_rule(facts), PreemptionRule::kIdleBurst);
  facts.idle_burst = false;
  facts.waiting_within_base = true;
  facts.victim_over_base = true;
  EXPECT_EQ(preemption_rule(facts), PreemptionRule::kReclaimBurstLease);
  facts.same_team = true;  // never reclaimed by its own team
  EXPECT_EQ(preemption_rule(facts), PreemptionRule::kNotPreemptible);
  facts.same_team = false;
  facts.preemptible = true;
  facts.victim_over_base = false;
  facts.victim_team_over_base = true;
  facts.lower_priority = false;
  EXPECT_EQ(preemption_rule(facts), PreemptionRule::kReclaimOverBaseTeam);
  // over its own limit a request takes nothing of another team, not even a burst
  facts.waiting_over_own_limit = true;
  facts.idle_burst = true;
  EXPECT_EQ(preemption_rule(facts), PreemptionRule::kOverOwnLimitOnlyOwn);
  // the protections come first
  facts.too_young = true;
  EXPECT_EQ(preemption_rule(facts), PreemptionRule::kMinRuntime);
  facts.critical = true;
  EXPECT_EQ(preemption_rule(facts), PreemptionRule::kCritical);
  facts.running = false;
  EXPECT_EQ(preemption_rule(facts), PreemptionRule::kNotRunning);
  EXPECT_FALSE(allows_preemption(PreemptionRule::kNoRule));
}

// One 80 GiB GPU that one team may share with up to 8 leases (so only memory limits them), no pool.
Policy one_shared_gpu() {
  Policy policy;
  policy.gpus = {Gpu{"node", 0, 80, ""}};
  policy.emergency_pool_fraction = 0;
  policy.sharing_enabled = true;
  policy.max_leases_per_gpu = 8;
  Team team;
  team.name = "team";
  team.base = team.burst = 1;
  policy.teams[team.name] = team;
  return policy;
}

// `count` queued shared requests of `share_gib` each.
std::map<int64_t, Lease> queued_shares(int count, double share_gib) {
  std::map<int64_t, Lease> leases;
  for (int64_t id = 1; id <= count; ++id) {
    Lease lease;
    lease.id = id;
    lease.req.team = "team";
    lease.req.user = "user";
    lease.req.model = "yolov8n";
    lease.req.gpus = 1;
    lease.req.shared = lease.shared = true;
    lease.req.memory_gib = lease.memory_gib = share_gib;
    lease.created_ms = kMonday + id;
    leases.emplace(id, lease);
  }
  return leases;
}

// How many of `count` shares of `share_gib` one pass grants on the 80 GiB GPU.
size_t shares_granted(const Policy& policy, int count, double share_gib) {
  const Inventory inventory(policy);
  const std::map<int64_t, Lease> leases = queued_shares(count, share_gib);
  const FairUsage usage;
  const Decision decision = schedule(ClusterState{policy, inventory, leases, usage, kMonday});
  return static_cast<size_t>(std::count_if(decision.steps.begin(), decision.steps.end(),
                                           [](const Decision::Step& step) { return step.kind == Kind::kGrant; }));
}

// A share caps only its process's allocator; the CUDA context and library workspaces come on top, so a GPU
// takes shares only while the shares plus one overhead each fit its memory.
TEST(Scheduler, SharedLeasesOccupyTheirSharePlusThePerProcessOverhead) {
  const Policy policy = one_shared_gpu();
  EXPECT_DOUBLE_EQ(policy.shared_overhead_gib(), 0.75);  // the documented default
  EXPECT_EQ(shares_granted(policy, 4, 19), 4u);          // 4 x 19.75 = 79 GiB
  EXPECT_EQ(shares_granted(policy, 5, 16), 4u);          // 5 x 16.75 = 83.75 GiB: the fifth waits
  EXPECT_EQ(shares_granted(policy, 5, 15.25), 5u);       // 5 x 16 = 80 GiB exactly
  // place() alone: four 16 GiB shares on the GPU leave 13 GiB, not the 16.75 a fifth needs
  std::map<int64_t, Lease> leases = queued_shares(5, 16);
  for (int64_t id = 1; id <= 4; ++id) {
    leases.at(id).state = LeaseState::kGranted;
    leases.at(id).devices = {0};
  }
  const Inventory inventory(policy);
  const FairUsage usage;
  const ClusterState state{policy, inventory, leases, usage, kMonday};
  EXPECT_FALSE(place(state, ask_of(state, leases.at(5)), 5).has_value());
  EXPECT_TRUE(gpu_errors(state).empty());
  // without any overhead the five would fill the card exactly (what placement counted before)
  Policy none = policy;
  none.process_overhead_gib = 0;
  EXPECT_EQ(shares_granted(none, 5, 16), 5u);
}

// A memory table that carries a measured overhead overrides the policy's default in placement.
TEST(Scheduler, TheMemoryTablesMeasuredOverheadOverridesThePolicys) {
  Policy policy = one_shared_gpu();
  policy.memory_table.process_overhead_gib = 0.25;
  EXPECT_DOUBLE_EQ(policy.shared_overhead_gib(), 0.25);
  EXPECT_EQ(shares_granted(policy, 5, 15.75), 5u);  // 5 x 16 = 80
  policy.memory_table.process_overhead_gib = 2;
  EXPECT_EQ(shares_granted(policy, 4, 19), 3u);   // 4 x 21 = 84
  policy.memory_table.process_overhead_gib = -1;  // the table does not say: the policy's 0.75
  EXPECT_EQ(shares_granted(policy, 4, 19), 4u);
}

TEST(Scheduler, TheRefusalCacheKeyHasEveryFieldOfTheAsk) {
  Ask left;
  left.team = "team-cv";
  left.user = "alice";
  left.pin = {1};
  Ask right = left;
  EXPECT_EQ(ask_key(left), ask_key(right));
  right.pin = {2};
  EXPECT_NE(ask_key(left), ask_key(right));
  right = left;
  right.guaranteed_gpus = 2;
  EXPECT_NE(ask_key(left), ask_key(right));
  right = left;
  right.max_gpus = 3;
  EXPECT_NE(ask_key(left), ask_key(right));
}

// The engine, driven by a random sequence of operations: its invariants hold after every step, and the same
// sequence gives the same audit.
TEST(Scheduler, EngineInvariantsHoldAfterEveryStepOfRandomOperations) {
  std::map<std::string, int> actions;  // what the sequences did, over all seeds
  for (uint32_t seed = 1; seed <= 60; ++seed) {
    std::vector<std::string> audits;
    for (int run = 0; run < 2; ++run) {
      std::mt19937 rng(seed);
      Engine engine(testing::example_policy());
      int64_t now = kMonday + static_cast<int64_t>(rng() % 24) * kHour;
      auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<unsigned>(n)); };
      for (int op = 0; op < 150; ++op) {
        const int what = pick(10);
        if (what < 5) {
          const auto& [team, users] = kTeams[static_cast<size_t>(pick(3))];
          LeaseRequest req;
          req.team = team;
          req.user = users[static_cast<size_t>(pick(static_cast<int>(users.size())))];
          req.job = "job";
          req.model = pick(6) == 0 ? "yolov8l" : (pick(2) == 0 ? "yolov8n" : "yolov8s");
          req.gpus = 1 + (pick(4) == 0 ? pick(3) : 0);
          if (pick(6) == 0) req.max_gpus = req.gpus + 2;
          req.shared = req.model != "yolov8l" && req.gpus == 1 && pick(3) == 0;
          if (req.shared) req.memory_gib = 2 + pick(10);
          req.priority = static_cast<Priority>(pick(3));
          if (pick(15) == 0) {
            req.priority = Priority::kCritical;
            req.justification = "demo";
          }
          req.preemptible = pick(4) != 0;
          if (pick(10) == 0) req.node = "node-c";
          engine.acquire(req, now);
        } else if (what < 7 && !engine.leases().empty()) {
          auto it = engine.leases().begin();
          std::advance(it, pick(static_cast<int>(engine.leases().size())));
          engine.release(it->first, pick(2) == 0 ? Outcome::kCompleted : Outcome::kPreempted, now);
        } else if (what < 8 && !engine.approvals().empty()) {
          const auto& [id, approval] = *engine.approvals().rbegin();
          if (approval.state == ApprovalState::kPending) {
            pick(2) == 0 ? engine.approve(id, "carol", now) : engine.reject(id, "carol", now);
          }
        } else {
          now += static_cast<int64_t>(pick(90)) * 1000;
          Telemetry telemetry;
          telemetry.last_checkpoint_ms = now - pick(60) * 1000;
          for (const auto& [id, lease] : engine.leases()) {
            if (pick(10) != 0) engine.heartbeat(id, telemetry, now);
          }
          engine.tick(now);
        }
        const auto errors = engine.check_invariants(now);
        ASSERT_TRUE(errors.empty()) << "seed " << seed << " op " << op << ": " << errors.front();
      }
      std::string audit;
      for (const auto& entry : engine.audit()) {
        audit += entry.action + " " + std::to_string(entry.lease_id) + "\n";
        if (run == 0) ++actions[entry.action];
      }
      audits.push_back(audit);
    }
    EXPECT_EQ(audits[0], audits[1]) << "seed " << seed;
  }
  // the sequences reach grants, preemptions, emergencies and expiries
  for (const char* action : {"lease.granted", "preempt.revoke", "emergency.granted", "lease.expired"}) {
    EXPECT_GT(actions[action], 0) << action;
  }
}

// quota/README.md: a team below its base gets it within min_runtime_s + grace_s of asking, whatever the other
// teams hold (shared and whole, preemptible or not, any priority but critical).
TEST(Scheduler, EveryTeamReachesItsBaseWithinMinRuntimePlusGrace) {
  for (uint32_t seed = 1; seed <= 150; ++seed) {
    std::mt19937 rng(seed);
    auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<unsigned>(n)); };
    Policy policy = testing::example_policy();
    policy.max_queued_per_user = 1000;
    policy.monthly_gpu_hours = 0;
    Engine engine(policy);
    const auto& [team, members] = kTeams[static_cast<size_t>(pick(3))];
    int64_t now = pick(2) == 0 ? kInsideWindow : kOutsideWindow;
    for (int i = 0; i < 60; ++i) {
      const auto& [other, users] = kTeams[static_cast<size_t>(pick(3))];
      if (other == team) continue;
      LeaseRequest req;
      req.team = other;
      req.user = users[static_cast<size_t>(pick(static_cast<int>(users.size())))];
      req.job = "job";
      req.shared = pick(2) == 0;
      req.model = req.shared ? "yolov8n" : "yolov8s";
      if (req.shared) req.memory_gib = 2 + pick(30);
      req.gpus = req.shared ? 1 : 1 + (pick(3) == 0 ? 1 : 0);
      req.priority = static_cast<Priority>(pick(3));
      req.preemptible = pick(3) != 0;
      engine.acquire(req, now);
      now += pick(20) * 1000;
    }
    for (const auto& [id, lease] : engine.leases()) {
      if (lease.state == LeaseState::kQueued) engine.release(id, Outcome::kCancelled, now);
    }
    const double base = policy.teams.at(team).base;
    std::vector<int64_t> waiters;
    for (int i = 0; i < static_cast<int>(base); ++i) {
      LeaseRequest req;
      req.team = team;
      req.user = members[static_cast<size_t>(i) % members.size()];
      req.job = "job";
      req.model = "yolov8s";
      req.gpus = 1;
      waiters.push_back(engine.acquire(req, now).lease_id);
    }
    const int64_t bound = now + (int64_t{policy.min_runtime_s} + policy.preempt_grace_s) * 1000;
    for (; now <= bound; now += 10000) {
      for (const auto& [id, lease] : engine.leases()) engine.heartbeat(id, {}, now);
      engine.tick(now);
      const auto errors = engine.check_invariants(now);
      ASSERT_TRUE(errors.empty()) << errors.front();
    }
    for (int64_t id : waiters) {
      EXPECT_EQ(engine.find(id)->state, LeaseState::kGranted) << "seed " << seed << " " << team << " lease " << id;
    }
  }
}

}  // namespace
}  // namespace yolo8::quota
