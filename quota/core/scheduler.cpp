#include "quota/core/scheduler.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>

#include "quota/core/api.h"

namespace yolo8::quota {

namespace {
constexpr double kEps = 1e-6;

// The owner a GPU is counted against: the team, or the emergency pool for critical leases.
bool same_owner(const Lease& holder, const Ask& ask) {
  const bool holder_critical = holder.req.priority == Priority::kCritical;
  const bool ask_critical = ask.priority == Priority::kCritical;
  return holder_critical == ask_critical && (holder_critical || holder.req.team == ask.team);
}
}  // namespace

Inventory::Inventory(const Policy& policy) {
  for (size_t device = 0; device < policy.gpus.size(); ++device) {
    const Gpu& gpu = policy.gpus[device];
    node_devices[gpu.node].push_back(static_cast<int>(device));
    if (!gpu.uuid.empty()) uuid_index[lower_case(gpu.uuid)] = static_cast<int>(device);
  }
}

Pin pin_of(const Policy& policy, const Inventory& inventory, const LeaseRequest& req) {
  Pin pin;
  std::set<int> matched;
  for (const auto& uuid : req.visible_devices) {
    if (auto it = inventory.uuid_index.find(lower_case(uuid)); it != inventory.uuid_index.end()) {
      matched.insert(it->second);
    }
  }
  if (!matched.empty()) {
    pin.devices.assign(matched.begin(), matched.end());
    pin.by_uuid = true;
    for (int device : pin.devices) {
      pin.text += (pin.text.empty() ? "" : ",") + policy.gpus[static_cast<size_t>(device)].uuid;
    }
    pin.text += " on " + policy.gpus[static_cast<size_t>(pin.devices.front())].node;
    return pin;
  }
  // an inventory without UUIDs (or a node listing none) only records them: the node still pins
  if (auto it = inventory.node_devices.find(req.node); !req.node.empty() && it != inventory.node_devices.end()) {
    pin.devices = it->second;
    pin.text = req.node;
    if (!req.node_gpus.empty()) {
      // device= named the GPUs: exactly those of the node (the engine turned away indices it does not have)
      std::vector<int> asked;
      std::string indices;
      for (int device : pin.devices) {
        const int index = policy.gpus[static_cast<size_t>(device)].index;
        if (std::find(req.node_gpus.begin(), req.node_gpus.end(), index) == req.node_gpus.end()) continue;
        asked.push_back(device);
        indices += (indices.empty() ? "" : ",") + std::to_string(index);
      }
      pin.devices = asked;
      pin.by_index = true;
      pin.text = "GPU " + indices + " of " + req.node;
    }
  }
  return pin;
}

bool pin_spills(const Pin& pin, int lease_gpus) {
  return !pin.devices.empty() && static_cast<size_t>(lease_gpus) > pin.devices.size();
}

int guaranteed_gpus(const Policy& policy, const Lease& lease) {
  return lease.req.gpus > 0 ? lease.req.gpus : policy.default_gpus;
}

Ask ask_of(const ClusterState& state, const Lease& lease) {
  Ask ask;
  ask.team = lease.req.team;
  ask.user = lease.req.user;
  ask.gpus = lease.gpus;
  ask.max_gpus = lease.req.max_gpus;
  ask.shared = lease.shared;
  ask.memory_gib = lease.memory_gib;
  ask.priority = lease.req.priority;
  ask.pin = pin_of(state.policy, state.inventory, lease.req).devices;
  ask.guaranteed_gpus = guaranteed_gpus(state.policy, lease);
  return ask;
}

double held_gpus(const ClusterState& state, const std::function<bool(const Lease&)>& match,
                 const std::set<int64_t>& ignore) {
  // a GPU carrying any shared lease of the matched leases counts whole: nobody else can use it whole, so
  // counting the memory share would let a team hold many GPUs while counting as a fraction of one
  double whole = 0;
  std::set<int> shared_gpus;
  for (const auto& [id, lease] : state.leases) {
    // emergency leases come out of the pool, not the team's quota
    if (lease.emergency || !lease.holds_gpus(state.now_ms) || ignore.count(id) || !match(lease)) continue;
    if (lease.shared) {
      shared_gpus.insert(lease.devices.begin(), lease.devices.end());
    } else {
      whole += lease.gpus;
    }
  }
  return whole + static_cast<double>(shared_gpus.size());
}

double team_units(const ClusterState& state, const std::string& team) {
  return held_gpus(state, [&](const Lease& lease) { return lease.req.team == team; });
}

double added_gpus(const ClusterState& state, const Ask& ask, int64_t self, const std::vector<int>& devices) {
  if (!ask.shared) return static_cast<double>(devices.size());
  // shared leases of one team only ever share a GPU with each other (place()), so joining a GPU that already
  // carries leases costs nothing more
  for (const auto& [id, holder] : state.leases) {
    if (id == self || !holder.holds_gpus(state.now_ms)) continue;
    for (int device : holder.devices) {
      if (std::find(devices.begin(), devices.end(), device) != devices.end()) return 0;
    }
  }
  return 1;
}

std::optional<std::vector<int>> place(const ClusterState& state, const Ask& ask, int64_t self,
                                      const std::set<int64_t>& ignore) {
  const Policy& policy = state.policy;
  const size_t gpu_count = policy.gpus.size();
  // a shared lease's share caps only its process's caching allocator: the CUDA context and library workspaces
  // come on top, so each shared lease occupies its share plus this, and the card is never overcommitted
  const double overhead = policy.shared_overhead_gib();
  std::vector<double> used(gpu_count, 0);
  std::vector<int> count(gpu_count, 0);
  std::vector<bool> whole(gpu_count, false), non_critical(gpu_count, false), foreign(gpu_count, false);
  for (const auto& [id, holder] : state.leases) {
    if (id == self || !holder.holds_gpus(state.now_ms) || ignore.count(id)) continue;
    for (int device : holder.devices) {
      if (device < 0 || static_cast<size_t>(device) >= gpu_count) continue;
      const auto gpu = static_cast<size_t>(device);
      // a GPU belongs to one team (or to the emergency pool) at a time: shared leases of different teams never
      // share it, so that every GPU counts against exactly one team's quota
      foreign[gpu] = foreign[gpu] || !same_owner(holder, ask);
      used[gpu] += holder.shared ? holder.memory_gib + overhead : policy.gpus[gpu].memory_gib;
      count[gpu] += 1;
      whole[gpu] = whole[gpu] || !holder.shared;
      non_critical[gpu] = non_critical[gpu] || holder.req.priority != Priority::kCritical;
    }
  }
  std::vector<int> placed;
  // where the trainer already runs: only its GPUs, or all of them and the rest elsewhere (a multi-pod job)
  std::vector<bool> allowed(gpu_count, ask.pin.empty());
  for (int device : ask.pin) allowed[static_cast<size_t>(device)] = true;
  if (ask.shared) {
    int best = -1;
    for (size_t device = 0; device < gpu_count; ++device) {
      const double free = policy.gpus[device].memory_gib - used[device];
      if (!allowed[device] || whole[device] || foreign[device] || count[device] >= policy.max_leases_per_gpu ||
          free + kEps < ask.memory_gib + overhead) {
        continue;
      }
      // pack: prefer GPUs already shared, then the tightest fit
      auto key = [&](size_t gpu) { return std::make_pair(count[gpu] == 0, policy.gpus[gpu].memory_gib - used[gpu]); };
      if (best < 0 || key(device) < key(static_cast<size_t>(best))) best = static_cast<int>(device);
    }
    if (best < 0) return std::nullopt;
    placed = {best};
  } else {
    auto free_whole = [&](size_t device) {
      return count[device] == 0 && policy.gpus[device].memory_gib + kEps >= ask.memory_gib;
    };
    Pin pin;
    pin.devices = ask.pin;
    if (pin_spills(pin, ask.guaranteed_gpus)) {
      for (int device : ask.pin) {
        if (!free_whole(static_cast<size_t>(device))) return std::nullopt;
        placed.push_back(device);
      }
      for (size_t device = 0; device < gpu_count; ++device) {
        allowed[device] = std::find(ask.pin.begin(), ask.pin.end(), static_cast<int>(device)) == ask.pin.end();
      }
    }
    std::map<std::string, std::vector<int>> free_by_node;
    std::vector<std::string> node_order;
    for (size_t device = 0; device < gpu_count; ++device) {
      const auto& gpu = policy.gpus[device];
      if (!free_by_node.count(gpu.node)) node_order.push_back(gpu.node);
      auto& free_devices = free_by_node[gpu.node];
      if (allowed[device] && free_whole(device)) free_devices.push_back(static_cast<int>(device));
    }
    const size_t need = static_cast<size_t>(ask.gpus) - std::min(placed.size(), static_cast<size_t>(ask.gpus));
    // best fit: the node with the fewest free GPUs that still holds the whole lease
    const std::vector<int>* fit = nullptr;
    for (const auto& node : node_order) {
      const auto& free_devices = free_by_node[node];
      if (free_devices.size() >= need && (fit == nullptr || free_devices.size() < fit->size())) fit = &free_devices;
    }
    if (fit != nullptr) {
      placed.insert(placed.end(), fit->begin(), fit->begin() + static_cast<long>(need));
    } else {
      std::stable_sort(node_order.begin(), node_order.end(), [&](const std::string& left, const std::string& right) {
        return free_by_node[left].size() > free_by_node[right].size();
      });
      size_t taken = 0;
      for (const auto& node : node_order) {
        for (int device : free_by_node[node]) {
          if (taken < need) {
            placed.push_back(device);
            ++taken;
          }
        }
      }
      if (taken < need) return std::nullopt;
    }
  }
  if (ask.priority != Priority::kCritical) {
    for (int device : placed) non_critical[static_cast<size_t>(device)] = true;
    const long busy = std::count(non_critical.begin(), non_critical.end(), true);
    if (busy > policy.total_gpus() - policy.emergency_pool_gpus()) return std::nullopt;
  }
  return placed;
}

std::string user_cap_reason(const ClusterState& state, const Ask& ask, int64_t self, const std::vector<int>* devices) {
  auto team_it = state.policy.teams.find(ask.team);
  if (team_it == state.policy.teams.end() || team_it->second.max_gpus_per_user <= 0) return "";
  const double cap = team_it->second.max_gpus_per_user;
  auto mine = [&](const Lease& other) { return other.req.user == ask.user; };
  const double held = held_gpus(state, mine);
  double added = ask.shared ? 1.0 : ask.gpus;
  if (ask.shared && devices != nullptr) {
    // joining a GPU that already carries one of the user's shared leases adds nothing to the user's count
    for (const auto& [id, other] : state.leases) {
      if (id != self && other.shared && mine(other) && !other.emergency && other.holds_gpus(state.now_ms) &&
          other.devices == *devices) {
        added = 0;
      }
    }
  }
  if (held + added <= cap + kEps) return "";
  return "user " + ask.user + " holds " + fixed_text(held) + " of the " + fixed_text(cap) +
         " GPUs one member of team " + ask.team + " may hold (teams." + ask.team + ".max_gpus_per_user)";
}

double decayed(const Policy& policy, const FairUsage& usage, const std::string& key, int64_t now_ms) {
  auto it = usage.find(key);
  if (it == usage.end() || policy.fair_share_half_life_h <= 0) return 0;
  const double age_h = static_cast<double>(std::max<int64_t>(0, now_ms - it->second.as_of_ms)) / 3.6e6;
  return it->second.value * std::exp2(-age_h / policy.fair_share_half_life_h);
}

void add_fair_usage(const Policy& policy, FairUsage& usage, const std::string& team, const std::string& user,
                    double gpu_hours, int64_t at_ms) {
  if (policy.fair_share_half_life_h <= 0 || !(gpu_hours > 0)) return;
  for (const std::string& key : {"team:" + team, "user:" + user}) {
    const double before = decayed(policy, usage, key, at_ms);
    Decayed& entry = usage[key];
    entry.value = before + gpu_hours;
    entry.as_of_ms = std::max(entry.as_of_ms, at_ms);
  }
}

FairShare fair_share(const ClusterState& state, const std::string& team, const std::string& user) {
  const Policy& policy = state.policy;
  auto recent = [&](const std::string& key) { return decayed(policy, state.usage, key, state.now_ms); };
  FairShare out;
  double all_teams = 0, all_shares = 0;
  for (const auto& [name, other] : policy.teams) {
    all_teams += recent("team:" + name);
    all_shares += other.share_weight();
  }
  auto team_it = policy.teams.find(team);
  if (team_it == policy.teams.end()) return out;
  out.team_gpu_hours = recent("team:" + team);
  out.team_usage = all_teams > 0 ? out.team_gpu_hours / all_teams : 0;
  out.team_share = all_shares > 0 ? team_it->second.share_weight() / all_shares : 0;
  // within the team, every member (leads included) has an equal share
  std::set<std::string> people(team_it->second.members.begin(), team_it->second.members.end());
  people.insert(team_it->second.leads.begin(), team_it->second.leads.end());
  people.insert(user);  // an admin acting in the team
  double all_users = 0;
  for (const auto& name : people) all_users += recent("user:" + name);
  out.user_gpu_hours = recent("user:" + user);
  out.user_usage = all_users > 0 ? out.user_gpu_hours / all_users : 0;
  out.user_share = 1.0 / static_cast<double>(people.size());
  // Slurm's classic fair-share factor F = 2^(-U/S); a share of 0 with any use ranks last
  auto factor = [](double usage, double share) {
    if (usage <= 0) return 1.0;
    return share > 0 ? std::exp2(-usage / share) : 0.0;
  };
  out.factor = factor(out.team_usage, out.team_share) * factor(out.user_usage, out.user_share);
  return out;
}

namespace {
// The queue order of `queued` (queued leases, any order).
std::vector<QueueEntry> order(const ClusterState& state, const std::vector<const Lease*>& queued) {
  std::map<std::pair<std::string, std::string>, double> factors;  // (team, user) -> fair-share factor
  std::vector<QueueEntry> entries;
  entries.reserve(queued.size());
  for (const Lease* lease : queued) {
    QueueEntry entry;
    entry.lease_id = lease->id;
    entry.waiting_on_preemption = !lease->waiting_on.empty();
    entry.priority = lease->req.priority;
    entry.created_ms = lease->created_ms;
    if (state.policy.fair_share_half_life_h > 0) {
      const auto key = std::make_pair(lease->req.team, lease->req.user);
      auto it = factors.find(key);
      if (it == factors.end()) it = factors.emplace(key, fair_share(state, key.first, key.second).factor).first;
      entry.fair_share = it->second;
    }
    entries.push_back(entry);
  }
  auto key = [](const QueueEntry& entry) {
    return std::make_tuple(!entry.waiting_on_preemption, -static_cast<int>(entry.priority), -entry.fair_share,
                           entry.created_ms, entry.lease_id);
  };
  std::sort(entries.begin(), entries.end(),
            [&](const QueueEntry& left, const QueueEntry& right) { return key(left) < key(right); });
  return entries;
}
}  // namespace

std::vector<QueueEntry> order_queue(const ClusterState& state) {
  std::vector<const Lease*> queued;
  for (const auto& [id, lease] : state.leases) {
    if (lease.state == LeaseState::kQueued) queued.push_back(&lease);
  }
  return order(state, queued);
}

std::string to_string(PreemptionRule rule) {
  switch (rule) {
    case PreemptionRule::kNotRunning: return "not_running";
    case PreemptionRule::kCritical: return "critical";
    case PreemptionRule::kMinRuntime: return "min_runtime";
    case PreemptionRule::kOverOwnLimitOnlyOwn: return "over_own_limit_only_own_team";
    case PreemptionRule::kIdleBurst: return "idle_burst";
    case PreemptionRule::kReclaimBurstLease: return "reclaim_burst_lease";
    case PreemptionRule::kNotPreemptible: return "not_preemptible";
    case PreemptionRule::kReclaimOverBaseTeam: return "reclaim_over_base_team";
    case PreemptionRule::kLowerPriority: return "lower_priority";
    case PreemptionRule::kNoRule: return "no_rule";
  }
  return "no_rule";
}

bool allows_preemption(PreemptionRule rule) {
  return rule == PreemptionRule::kIdleBurst || rule == PreemptionRule::kReclaimBurstLease ||
         rule == PreemptionRule::kReclaimOverBaseTeam || rule == PreemptionRule::kLowerPriority;
}

PreemptionRule preemption_rule(const PreemptionFacts& facts) {
  // the base is a guarantee: a team above its base gives GPUs back to a team below it
  const bool reclaim = facts.waiting_within_base && !facts.same_team;
  if (!facts.running) return PreemptionRule::kNotRunning;
  if (facts.critical) return PreemptionRule::kCritical;
  if (facts.too_young) return PreemptionRule::kMinRuntime;
  if (facts.waiting_over_own_limit && !facts.same_team) return PreemptionRule::kOverOwnLimitOnlyOwn;
  if (facts.idle_burst) return PreemptionRule::kIdleBurst;
  // `preemptible: false` protects work within the team's base, not GPUs taken beyond it
  if (reclaim && facts.victim_over_base) return PreemptionRule::kReclaimBurstLease;
  if (!facts.preemptible) return PreemptionRule::kNotPreemptible;
  if (reclaim && facts.victim_team_over_base) return PreemptionRule::kReclaimOverBaseTeam;
  if (facts.lower_priority) return PreemptionRule::kLowerPriority;
  return PreemptionRule::kNoRule;
}

VictimRank victim_rank(const ClusterState& state, const Lease& victim) {
  auto team_it = state.policy.teams.find(victim.req.team);
  const bool team_over_limit = team_it != state.policy.teams.end() &&
                               team_units(state, victim.req.team) > team_it->second.limit_at(state.now_ms) + kEps;
  return VictimRank{victim.extra_gpus == 0,
                    !team_over_limit,
                    !victim.over_base,
                    static_cast<int>(victim.req.priority),
                    -victim.telemetry.last_checkpoint_ms,
                    -victim.granted_ms,
                    victim.id};
}

std::optional<Grant> decide_grant(const ClusterState& state, const Lease& lease, const Ask& ask, bool others_waiting) {
  auto team_it = state.policy.teams.find(ask.team);
  if (team_it == state.policy.teams.end()) return std::nullopt;  // the team left the policy since the request
  const Team& team = team_it->second;
  const double limit = team.limit_at(state.now_ms);
  const bool critical = ask.priority == Priority::kCritical;
  const double before = team_units(state, ask.team);
  // a whole lease's cost is known before placing it (placing is the dearer check)
  if (!critical && !ask.shared && before + ask.gpus > limit + kEps) return std::nullopt;
  auto placement = place(state, ask, lease.id);
  if (!placement) return std::nullopt;
  const double added = added_gpus(state, ask, lease.id, *placement);
  if (!critical && before + added > limit + kEps) return std::nullopt;
  if (!critical && !user_cap_reason(state, ask, lease.id, &*placement).empty()) return std::nullopt;
  // per-job burst: more GPUs, up to max_gpus, only from idle capacity (nobody else waiting), revoked first
  int extra = 0;
  if (!critical && !ask.shared && ask.max_gpus > ask.gpus && !others_waiting) {
    for (int more = ask.max_gpus - ask.gpus; more > 0 && extra == 0; --more) {
      Ask bigger = ask;
      bigger.gpus = ask.gpus + more;
      if (before + bigger.gpus > limit + kEps) continue;
      if (!user_cap_reason(state, bigger, lease.id, nullptr).empty()) continue;
      if (auto wider = place(state, bigger, lease.id)) {
        placement = wider;
        extra = more;
      }
    }
  }
  Grant grant;
  grant.lease_id = lease.id;
  grant.devices = *placement;
  grant.gpus = ask.gpus + extra;
  grant.extra_gpus = extra;
  // A whole-GPU lease may use all the memory of its GPUs (the smallest, when they differ): that, not the
  // admission estimate it was placed by, is the budget the trainer sizes its batch to.
  grant.memory_gib = ask.memory_gib;
  if (!ask.shared) {
    double smallest = 0;
    for (int device : grant.devices) {
      const double gib = state.policy.gpus[static_cast<size_t>(device)].memory_gib;
      smallest = smallest > 0 ? std::min(smallest, gib) : gib;
    }
    grant.memory_gib = smallest;
  }
  grant.emergency = critical;
  grant.over_base = !critical && before + added + extra > team.base + kEps;
  return grant;
}

std::optional<Preemption> decide_preemption(const ClusterState& state, const Lease& waiting, const Ask& ask) {
  auto team_it = state.policy.teams.find(ask.team);
  if (team_it == state.policy.teams.end()) return std::nullopt;
  const Team& team = team_it->second;
  const double limit = team.limit_at(state.now_ms);
  const bool critical = ask.priority == Priority::kCritical;
  const double own_now = team_units(state, ask.team);
  // a shared request that does not fit needs a GPU of its own: it counts whole
  const double mine = own_now + (ask.shared ? 1.0 : ask.gpus);
  // over its own team's limit, a request may only displace lower-priority work of its own team
  const bool over_own = !critical && mine > limit + kEps;
  const double must_free_own = over_own ? mine - limit : 0;
  const bool within_base = critical || mine <= team.base + kEps;
  // a request held back by its user's own cap waits for the user's leases, never takes anyone else's
  if (!critical && !user_cap_reason(state, ask, waiting.id, nullptr).empty()) return std::nullopt;
  std::map<std::string, bool> team_over_base;
  for (const auto& [name, other_team] : state.policy.teams) {
    team_over_base[name] = team_units(state, name) > other_team.base + kEps;
  }

  struct Candidate {
    const Lease* lease;
    PreemptionRule rule;
    VictimRank rank;
  };
  std::vector<Candidate> candidates;
  for (const auto& [id, victim] : state.leases) {
    PreemptionFacts facts;
    facts.running = victim.state == LeaseState::kGranted;
    facts.critical = victim.req.priority == Priority::kCritical;
    facts.too_young = state.now_ms - victim.granted_ms < static_cast<int64_t>(state.policy.min_runtime_s) * 1000;
    facts.waiting_over_own_limit = over_own;
    facts.same_team = victim.req.team == ask.team;
    facts.idle_burst = victim.extra_gpus > 0;
    facts.waiting_within_base = within_base;
    facts.victim_over_base = victim.over_base;
    auto over_it = team_over_base.find(victim.req.team);
    facts.victim_team_over_base = over_it != team_over_base.end() && over_it->second;
    facts.preemptible = victim.req.preemptible;
    facts.lower_priority = victim.req.priority < ask.priority;
    const PreemptionRule rule = preemption_rule(facts);
    if (allows_preemption(rule)) candidates.push_back({&victim, rule, victim_rank(state, victim)});
  }
  if (candidates.empty()) return std::nullopt;
  std::stable_sort(candidates.begin(), candidates.end(),
                   [](const Candidate& left, const Candidate& right) { return left.rank < right.rank; });
  std::set<int64_t> ignore;
  std::vector<Candidate> victims;
  auto enough = [&]() {
    const double freed_own =
        own_now - held_gpus(
                      state, [&](const Lease& lease) { return lease.req.team == ask.team; }, ignore);
    return freed_own + kEps >= must_free_own && place(state, ask, waiting.id, ignore).has_value();
  };
  bool fits = false;
  for (const Candidate& candidate : candidates) {
    ignore.insert(candidate.lease->id);
    victims.push_back(candidate);
    if (enough()) {
      fits = true;
      break;
    }
  }
  if (!fits) return std::nullopt;
  // drop victims that turned out unnecessary
  for (size_t i = 0; i < victims.size();) {
    const Candidate victim = victims[i];
    ignore.erase(victim.lease->id);
    victims.erase(victims.begin() + static_cast<long>(i));
    if (enough()) continue;
    ignore.insert(victim.lease->id);
    victims.insert(victims.begin() + static_cast<long>(i), victim);
    ++i;
  }
  Preemption preemption;
  preemption.for_lease_id = waiting.id;
  for (const Candidate& victim : victims) {
    preemption.victims.push_back(victim.lease->id);
    preemption.rules.push_back(victim.rule);
  }
  return preemption;
}

namespace {
void apply_grant(Lease& lease, const Grant& grant, int64_t now_ms) {
  lease.gpus = grant.gpus;
  lease.extra_gpus = grant.extra_gpus;
  lease.devices = grant.devices;
  lease.memory_gib = grant.memory_gib;
  lease.state = LeaseState::kGranted;
  lease.granted_ms = now_ms;
  lease.last_seen_ms = now_ms;
  lease.charged_until_ms = now_ms;
  lease.emergency = grant.emergency;
  lease.review_pending = grant.emergency;
  lease.over_base = grant.over_base;
  lease.waiting_on.clear();
  lease.reason.clear();
}

void apply_revocation(Lease& victim, const Lease& waiting, const Policy& policy, int64_t now_ms) {
  victim.state = LeaseState::kRevoking;
  victim.deadline_ms = now_ms + static_cast<int64_t>(policy.preempt_grace_s) * 1000;
  victim.preempted_for = waiting.id;
  victim.reason = "preempted for lease " + std::to_string(waiting.id) + " (" + to_string(waiting.req.priority) +
                  ", team " + waiting.req.team + ")";
}

}  // namespace

void apply_step(std::map<int64_t, Lease>& leases, const Decision::Step& step, const Policy& policy, int64_t now_ms) {
  Lease& lease = leases.at(step.lease_id);
  switch (step.kind) {
    case Decision::Step::Kind::kGrant: apply_grant(lease, step.grant, now_ms); break;
    case Decision::Step::Kind::kRechoose: lease.waiting_on.clear(); break;
    case Decision::Step::Kind::kPreempt:
      lease.waiting_on = step.preemption.victims;
      for (int64_t victim : step.preemption.victims) apply_revocation(leases.at(victim), lease, policy, now_ms);
      break;
  }
}

Decision schedule(const ClusterState& state) {
  Decision decision;
  // The pass changes its own copy: the leases that hold GPUs, and each queued lease once it is looked at (a
  // flood of alike requests refused by the cache is never copied).
  std::map<int64_t, Lease> live;
  for (const auto& [id, lease] : state.leases) {
    if (lease.holds_gpus(state.now_ms)) live.emplace(id, lease);
  }
  const ClusterState work{state.policy, state.inventory, live, state.usage, state.now_ms};
  const std::vector<QueueEntry> initial = order_queue(state);
  size_t granted = 0;
  // requests alike in everything the decision reads (their Ask) get the same answer until something changes:
  // a flood of identical requests (1,200 from one member, seen in testing) costs one check per pass, not one per
  // request
  std::set<decltype(ask_key(std::declval<Ask>()))> refused;
  for (const QueueEntry& entry : initial) {
    const Lease& original = state.leases.at(entry.lease_id);
    auto live_it = live.find(entry.lease_id);
    const Lease& current = live_it != live.end() ? live_it->second : original;
    if (current.state != LeaseState::kQueued) continue;
    const Ask ask = ask_of(work, current);
    if (current.waiting_on.empty() && refused.count(ask_key(ask))) continue;
    Lease& lease = live_it != live.end() ? live_it->second : live.emplace(entry.lease_id, original).first->second;
    // the queued leases other than this one not granted in this pass
    const bool others_waiting = initial.size() - granted > 1;
    if (auto grant = decide_grant(work, lease, ask, others_waiting)) {
      Decision::Step step;
      step.kind = Decision::Step::Kind::kGrant;
      step.lease_id = lease.id;
      step.grant = std::move(*grant);
      apply_step(live, step, state.policy, state.now_ms);
      decision.steps.push_back(std::move(step));
      ++granted;
      refused.clear();
      continue;
    }
    const bool still_waiting = std::any_of(lease.waiting_on.begin(), lease.waiting_on.end(), [&](int64_t victim) {
      auto it = live.find(victim);
      return it != live.end() && it->second.holds_gpus(state.now_ms);
    });
    if (still_waiting) continue;
    if (!lease.waiting_on.empty()) {
      // victims are gone but it still does not fit: choose again
      Decision::Step step;
      step.kind = Decision::Step::Kind::kRechoose;
      step.lease_id = lease.id;
      apply_step(live, step, state.policy, state.now_ms);
      decision.steps.push_back(std::move(step));
    }
    if (auto preemption = decide_preemption(work, lease, ask)) {
      Decision::Step step;
      step.kind = Decision::Step::Kind::kPreempt;
      step.lease_id = lease.id;
      step.preemption = std::move(*preemption);
      apply_step(live, step, state.policy, state.now_ms);
      decision.steps.push_back(std::move(step));
      refused.clear();
    } else {
      refused.insert(ask_key(ask));
    }
  }
  std::vector<const Lease*> queued;
  for (const QueueEntry& entry : initial) {
    auto it = live.find(entry.lease_id);
    const Lease& lease = it != live.end() ? it->second : state.leases.at(entry.lease_id);
    if (lease.state == LeaseState::kQueued) queued.push_back(&lease);
  }
  decision.queue = order(state, queued);
  return decision;
}

}  // namespace yolo8::quota
