#pragma once
// The scheduler as pure functions of a ClusterState: placement, grants, preemption, queue order and fair share.
// Nothing here changes the state, audits or persists; the Engine validates, applies a Decision, audits and
// persists.
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "quota/core/cluster_state.h"

namespace yolo8::quota {

// The GPUs a request is pinned to, where the trainer already runs: those with its visible UUIDs (where the
// inventory lists them), else its node's (or the node's GPUs it named); none when the request names neither.
Pin pin_of(const Policy& policy, const Inventory& inventory, const LeaseRequest& req);
// Whether a lease of `lease_gpus` guaranteed GPUs pinned to `pin` holds all the pinned GPUs plus GPUs elsewhere:
// a multi-pod job (an indexed DDP Job) whose requester sees fewer GPUs than the job runs on.
bool pin_spills(const Pin& pin, int lease_gpus);
// GPUs the lease guarantees (the request's, before any per-job burst).
int guaranteed_gpus(const Policy& policy, const Lease& lease);

// What a queued lease asks for: everything the grant and preemption decisions read of it. The refusal cache of
// schedule() is keyed by the whole Ask (ask_key), so a field added here is part of the key.
struct Ask {
  std::string team;
  std::string user;
  int gpus = 1;
  int max_gpus = 0;  // per-job burst
  bool shared = false;
  double memory_gib = 0;
  Priority priority = Priority::kNormal;
  std::vector<int> pin;  // Pin::devices
  int guaranteed_gpus = 1;
};
Ask ask_of(const ClusterState& state, const Lease& lease);
// The refusal cache's key: all of Ask's fields (a structured binding, so a field left out does not compile).
inline auto ask_key(const Ask& ask) {
  const auto& [team, user, gpus, max_gpus, shared, memory_gib, priority, pin, guaranteed] = ask;
  return std::make_tuple(team, user, gpus, max_gpus, shared, memory_gib, static_cast<int>(priority), pin, guaranteed);
}

// GPUs held by the leases `match` selects (emergency ones and `ignore` left out): whole leases count their
// GPUs, and a GPU carrying any of their shared leases counts whole.
double held_gpus(const ClusterState& state, const std::function<bool(const Lease&)>& match,
                 const std::set<int64_t>& ignore = {});
double team_units(const ClusterState& state, const std::string& team);
// Where `ask` (of lease `self`, which holds nothing while it waits) fits now, the leases in `ignore` gone; the
// GPUs (indices into Policy::gpus), or none. On a shared GPU every lease occupies its share plus the per-process
// overhead (Policy::shared_overhead_gib), and together they stay within the GPU's memory.
std::optional<std::vector<int>> place(const ClusterState& state, const Ask& ask, int64_t self,
                                      const std::set<int64_t>& ignore = {});
// GPUs `ask` would add to its team's count on `devices`: 0 for a shared lease joining a GPU its team holds.
double added_gpus(const ClusterState& state, const Ask& ask, int64_t self, const std::vector<int>& devices);
// Why `ask` may not start now for its user's cap; "" when within it.
// `devices`: where it would go (a shared lease joining a GPU with the user's shares adds nothing); null: anywhere.
std::string user_cap_reason(const ClusterState& state, const Ask& ask, int64_t self, const std::vector<int>* devices);

// The fair share: decayed recent use of `key` ("team:<name>" / "user:<name>").
double decayed(const Policy& policy, const FairUsage& usage, const std::string& key, int64_t now_ms);
// Adds `gpu_hours` used at `at_ms` to the team's and the user's recent use.
void add_fair_usage(const Policy& policy, FairUsage& usage, const std::string& team, const std::string& user,
                    double gpu_hours, int64_t at_ms);
FairShare fair_share(const ClusterState& state, const std::string& team, const std::string& user);

// A queued lease's place in the queue and why it stands there: requests already waiting on a preemption first
// (nobody else takes the GPUs they freed), then priority, then the fair-share factor (higher first), then arrival.
struct QueueEntry {
  int64_t lease_id = 0;
  bool waiting_on_preemption = false;
  Priority priority = Priority::kNormal;
  double fair_share = 1;
  int64_t created_ms = 0;
};
std::vector<QueueEntry> order_queue(const ClusterState& state);

// The preemption rules, in the order they are tried: the first that applies to a (victim, waiting request)
// pair decides whether the victim may be revoked for it. docs/quotad-policy.md ("Rules the engine applies") says the
// same.
enum class PreemptionRule {
  kNotRunning,           // keep: only granted leases are revoked (revoking ones already go)
  kCritical,             // keep: critical leases are never revoked
  kMinRuntime,           // keep: younger than preemption.min_runtime_s
  kOverOwnLimitOnlyOwn,  // keep: a request over its own team's limit displaces only its own team's leases
  kIdleBurst,            // take: a per-job burst took idle GPUs, any request may have them back
  kReclaimBurstLease,    // take: granted over its team's base, for a request within its own base
  kNotPreemptible,       // keep: `preemptible: false`
  kReclaimOverBaseTeam,  // take: its team is above its base, for a request within its own base
  kLowerPriority,        // take: lower priority than the request
  kNoRule,               // keep: none of the above
};
std::string to_string(PreemptionRule rule);
bool allows_preemption(PreemptionRule rule);
// What the rules read of a victim and the request it would make room for.
struct PreemptionFacts {
  bool running = false;    // granted
  bool critical = false;   // the victim is critical
  bool too_young = false;  // granted less than min_runtime_s ago
  bool waiting_over_own_limit = false;
  bool same_team = false;
  bool idle_burst = false;           // the victim holds GPUs beyond its request (extra_gpus > 0)
  bool waiting_within_base = false;  // the request (critical, or its team within its base with it)
  bool victim_over_base = false;     // the victim lease was granted over its team's base
  bool victim_team_over_base = false;
  bool preemptible = true;
  bool lower_priority = false;
};
// The first rule that applies.
PreemptionRule preemption_rule(const PreemptionFacts& facts);
// The rank of a revocable victim (lower first): leases holding a per-job burst, then leases of teams past their
// current limit (a burst window closed), then burst leases (over base), then lower priority, then the most
// recent checkpoint (least work lost), then the youngest.
using VictimRank = std::tuple<bool, bool, bool, int, int64_t, int64_t, int64_t>;
VictimRank victim_rank(const ClusterState& state, const Lease& victim);

// A queued lease granted: where, and how it counts.
struct Grant {
  int64_t lease_id = 0;
  std::vector<int> devices;
  int gpus = 0;        // with the per-job burst
  int extra_gpus = 0;  // per-job burst: beyond the request, from idle capacity
  double memory_gib = 0;
  bool over_base = false;
  bool emergency = false;
};
// Leases revoked so that a queued lease fits.
struct Preemption {
  int64_t for_lease_id = 0;
  std::vector<int64_t> victims;       // in rank order
  std::vector<PreemptionRule> rules;  // why each victim may be revoked
};
struct Decision {
  struct Step {
    enum class Kind { kGrant, kPreempt, kRechoose };  // kRechoose: the victims are gone, its wait is cleared
    Kind kind = Kind::kGrant;
    int64_t lease_id = 0;
    Grant grant;
    Preemption preemption;
  };
  std::vector<Step> steps;        // in the order they were decided (and are applied and audited)
  std::vector<QueueEntry> queue;  // the queue after the steps
};

// Whether the queued `lease` can be granted now, and how.
std::optional<Grant> decide_grant(const ClusterState& state, const Lease& lease, const Ask& ask, bool others_waiting);
// Which leases to revoke so that the queued `lease` fits; none when no set of victims makes it fit.
std::optional<Preemption> decide_preemption(const ClusterState& state, const Lease& lease, const Ask& ask);
// One pass over the queue in order: grants what fits, preempts for what does not and may, from `state` alone.
// Same state, same decision.
Decision schedule(const ClusterState& state);

// How one step of a decision changes the records (the engine audits it after); the engine and schedule()'s own
// pass both use it.
void apply_step(std::map<int64_t, Lease>& leases, const Decision::Step& step, const Policy& policy, int64_t now_ms);

}  // namespace yolo8::quota
