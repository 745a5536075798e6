#include "quota/core/engine.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>
#include <sstream>
#include <tuple>
#include <utility>

#include "quota/core/api.h"
#include "quota/core/calendar.h"

namespace yolo8::quota {

namespace {
constexpr double kEps = 1e-6;
constexpr int64_t kAccrueEveryMs = 60000;
}  // namespace

namespace {

constexpr LeaseState kLeaseStates[] = {LeaseState::kPendingApproval, LeaseState::kQueued,   LeaseState::kGranted,
                                       LeaseState::kRevoking,        LeaseState::kReleased, LeaseState::kExpired,
                                       LeaseState::kRejected};
constexpr Outcome kOutcomes[] = {Outcome::kNone, Outcome::kCompleted, Outcome::kPreempted, Outcome::kFailed,
                                 Outcome::kCancelled};
constexpr ApprovalState kApprovalStates[] = {ApprovalState::kPending, ApprovalState::kApproved,
                                             ApprovalState::kRejected, ApprovalState::kCancelled};

// The accepted texts of an enum for error messages, "a, b, c"; the empty text (Outcome::kNone) is left out.
template <typename Enum, size_t kCount>
std::string accepted_texts(const Enum (&values)[kCount]) {
  std::string joined;
  for (const Enum value : values) {
    const std::string text = to_string(value);
    if (text.empty()) continue;
    joined += (joined.empty() ? "" : ", ") + text;
  }
  return joined;
}

// The enum value whose text is `text`; PolicyError naming `field` otherwise (never a silent default).
template <typename Enum, size_t kCount>
Enum parse_enum(const Enum (&values)[kCount], const std::string& text, const std::string& field) {
  for (const Enum value : values) {
    if (to_string(value) == text) return value;
  }
  throw PolicyError(field + ": '" + text + "' is not one of " + accepted_texts(values));
}

}  // namespace

std::string to_string(LeaseState state) {
  switch (state) {
    case LeaseState::kPendingApproval: return "pending_approval";
    case LeaseState::kQueued: return "queued";
    case LeaseState::kGranted: return "granted";
    case LeaseState::kRevoking: return "revoking";
    case LeaseState::kReleased: return "released";
    case LeaseState::kExpired: return "expired";
    case LeaseState::kRejected: return "rejected";
  }
  return "expired";
}

LeaseState parse_lease_state(const std::string& text) { return parse_enum(kLeaseStates, text, "state"); }

std::string to_string(Outcome outcome) {
  switch (outcome) {
    case Outcome::kNone: return "";
    case Outcome::kCompleted: return "completed";
    case Outcome::kPreempted: return "preempted";
    case Outcome::kFailed: return "failed";
    case Outcome::kCancelled: return "cancelled";
  }
  return "";
}

Outcome parse_outcome(const std::string& text) { return parse_enum(kOutcomes, text, "outcome"); }

std::string to_string(ApprovalState state) {
  switch (state) {
    case ApprovalState::kPending: return "pending";
    case ApprovalState::kApproved: return "approved";
    case ApprovalState::kRejected: return "rejected";
    case ApprovalState::kCancelled: return "cancelled";
  }
  return "pending";
}

ApprovalState parse_approval_state(const std::string& text) { return parse_enum(kApprovalStates, text, "state"); }

std::string to_string(AcquireResult::Kind kind) {
  switch (kind) {
    case AcquireResult::Kind::kGranted: return "granted";
    case AcquireResult::Kind::kQueued: return "queued";
    case AcquireResult::Kind::kNeedsApproval: return "needs_approval";
    case AcquireResult::Kind::kNotAllowed: return "not_allowed";
    case AcquireResult::Kind::kAdmissionRefused: return "refused";
    case AcquireResult::Kind::kCreditsSpent: return "credits_spent";
    case AcquireResult::Kind::kTooManyQueued: return "too_many_queued";
    case AcquireResult::Kind::kInvalid: return "invalid";
  }
  return "invalid";
}

void merge_memory_context(Telemetry& into, const Telemetry& from) {
  if (!from.model.empty()) into.model = from.model;
  if (from.imgsz > 0) into.imgsz = from.imgsz;
  if (from.batch > 0) into.batch = from.batch;
  if (from.amp >= 0) into.amp = from.amp;
  if (!from.device_name.empty()) into.device_name = from.device_name;
  if (!from.libtorch.empty()) into.libtorch = from.libtorch;
}

bool is_terminal(LeaseState state) {
  return state == LeaseState::kReleased || state == LeaseState::kExpired || state == LeaseState::kRejected;
}

double Lease::units(const Policy& policy) const {
  if (!shared) return gpus;
  const bool known = !devices.empty() && devices[0] >= 0 && static_cast<size_t>(devices[0]) < policy.gpus.size();
  const double gpu_mem = known ? policy.gpus[static_cast<size_t>(devices[0])].memory_gib : policy.max_gpu_memory_gib();
  return memory_gib / gpu_mem;
}

bool Lease::holds_gpus(int64_t now_ms) const {
  if (state == LeaseState::kGranted || state == LeaseState::kRevoking) return true;
  return state == LeaseState::kExpired && !devices.empty() && now_ms < free_at_ms;
}

Engine::Engine(Policy policy) : policy_(std::move(policy)) {
  policy_.validate();
  for (size_t device = 0; device < policy_.gpus.size(); ++device) {
    const Gpu& gpu = policy_.gpus[device];
    node_devices_[gpu.node].push_back(static_cast<int>(device));
    if (!gpu.uuid.empty()) uuid_index_[lower_case(gpu.uuid)] = static_cast<int>(device);
  }
}

Engine::Pin Engine::pin_of(const LeaseRequest& req) const {
  Pin pin;
  std::set<int> matched;
  for (const auto& uuid : req.visible_devices) {
    if (auto it = uuid_index_.find(lower_case(uuid)); it != uuid_index_.end()) matched.insert(it->second);
  }
  if (!matched.empty()) {
    pin.devices.assign(matched.begin(), matched.end());
    pin.by_uuid = true;
    for (int device : pin.devices) {
      pin.text += (pin.text.empty() ? "" : ",") + policy_.gpus[static_cast<size_t>(device)].uuid;
    }
    pin.text += " on " + policy_.gpus[static_cast<size_t>(pin.devices.front())].node;
    return pin;
  }
  // an inventory without UUIDs (or a node listing none) only records them: the node still pins
  if (auto it = node_devices_.find(req.node); !req.node.empty() && it != node_devices_.end()) {
    pin.devices = it->second;
    pin.text = req.node;
    if (!req.node_gpus.empty()) {
      // device= named the GPUs: exactly those of the node (pin_refusal turned away indices it does not have)
      std::vector<int> asked;
      std::string indices;
      for (int device : pin.devices) {
        const int index = policy_.gpus[static_cast<size_t>(device)].index;
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

std::string Engine::pin_refusal(const LeaseRequest& req) const {
  if (!req.node.empty() && !node_devices_.count(req.node)) {
    // the trainer reports the Kubernetes node it runs on: an inventory named otherwise is the usual cause
    const std::vector<std::string> names = policy_.node_names();
    std::string known;
    for (size_t i = 0; i < names.size() && i < 20; ++i) known += (i == 0 ? "" : ", ") + names[i];
    if (names.size() > 20) known += " and " + std::to_string(names.size() - 20) + " more";
    return "node: '" + req.node + "' (where the trainer runs, $NODE_NAME) is not a node of the inventory of " +
           policy_.source + " (" + known +
           "); inventory.nodes[].name must be the Kubernetes node names (kubectl get nodes)";
  }
  if (!req.node.empty()) {
    const std::vector<int>& on_node = node_devices_.at(req.node);
    for (int index : req.node_gpus) {
      const bool known = std::any_of(on_node.begin(), on_node.end(), [&](int device) {
        return policy_.gpus[static_cast<size_t>(device)].index == index;
      });
      if (!known) {
        return "node_gpus: GPU " + std::to_string(index) + " (device= of the trainer) is not a GPU of node " +
               req.node + " in the inventory of " + policy_.source + ", which lists " + std::to_string(on_node.size()) +
               " GPU(s) there";
      }
    }
  }
  if (req.visible_devices.empty()) return "";
  // UUIDs are matched where the inventory lists them: on the request's node, or anywhere without a node
  bool listed = false;
  if (req.node.empty()) {
    listed = policy_.has_gpu_uuids();
  } else {
    for (int device : node_devices_.at(req.node))
      listed = listed || !policy_.gpus[static_cast<size_t>(device)].uuid.empty();
  }
  if (!listed) return "";
  for (const auto& uuid : req.visible_devices) {
    auto it = uuid_index_.find(lower_case(uuid));
    if (it == uuid_index_.end()) {
      return "visible_devices: " + uuid + " (a GPU the trainer sees) is not a GPU of the inventory of " +
             policy_.source + (req.node.empty() ? std::string() : " (node " + req.node + ")") +
             "; list it in inventory.nodes[].uuids (nvidia-smi -L on the node)";
    }
    const Gpu& gpu = policy_.gpus[static_cast<size_t>(it->second)];
    if (!req.node.empty() && gpu.node != req.node) {
      return "visible_devices: " + uuid + " is GPU " + gpu.id() + " in the inventory, not a GPU of node " + req.node +
             " where the trainer runs (node)";
    }
  }
  return "";
}

std::string Engine::describe_devices(const Lease& lease) const {
  std::string devs;
  for (int device : lease.devices) {
    if (device >= 0 && static_cast<size_t>(device) < policy_.gpus.size()) {
      devs += (devs.empty() ? "" : ",") + policy_.gpus[static_cast<size_t>(device)].id();
    }
  }
  // what the trainer itself sees, when a device plugin chose its GPUs, and how the lease was matched to it
  if (!lease.req.visible_devices.empty() || !lease.req.node.empty()) {
    std::string seen;
    for (const auto& uuid : lease.req.visible_devices) seen += (seen.empty() ? "" : ",") + uuid;
    const Pin pin = pin_of(lease.req);
    devs += " (trainer" + (lease.req.node.empty() ? std::string() : " on " + lease.req.node) +
            (seen.empty() ? std::string() : " sees " + seen) + ")";
    if (!pin.devices.empty()) {
      devs += pin.by_uuid    ? ", matched by UUID"
              : pin.by_index ? ", as asked (" + pin.text + ")"
                             : ", pinned to node " + pin.text;
    }
    if (pin_spills(pin, guaranteed_gpus(lease))) devs += ", with the rest of the job's GPUs elsewhere";
  }
  return devs;
}

int Engine::guaranteed_gpus(const Lease& lease) const {
  return lease.req.gpus > 0 ? lease.req.gpus : policy_.default_gpus;
}

namespace {
// The owner a GPU is counted against: the team, or the emergency pool for critical leases.
bool same_owner(const Lease& left, const Lease& right) {
  const bool left_critical = left.req.priority == Priority::kCritical;
  const bool right_critical = right.req.priority == Priority::kCritical;
  return left_critical == right_critical && (left_critical || left.req.team == right.req.team);
}
std::string requester(const LeaseRequest& req) { return req.requested_by.empty() ? req.user : req.requested_by; }
std::string on_behalf(const LeaseRequest& req) {
  return req.requested_by.empty() ? "" : "on behalf of " + req.user + ": ";
}
}  // namespace

void Engine::note(int64_t now_ms, const std::string& actor, const std::string& action, const std::string& detail) {
  log(now_ms, actor, action, nullptr, detail);
}

void Engine::log(int64_t now_ms, const std::string& actor, const std::string& action, const Lease* lease,
                 const std::string& detail) {
  AuditEntry entry;
  entry.seq = next_audit_seq_++;
  entry.ts_ms = now_ms;
  entry.actor = actor;
  entry.action = action;
  if (lease != nullptr) {
    entry.lease_id = lease->id;
    entry.team = lease->req.team;
  }
  entry.detail = detail;
  audit_.push_back(entry);
  changes_.audit.push_back(entry);
}

const Lease* Engine::find(int64_t lease_id) const {
  auto it = leases_.find(lease_id);
  return it == leases_.end() ? nullptr : &it->second;
}

const Approval* Engine::find_approval(int64_t approval_id) const {
  auto it = approvals_.find(approval_id);
  return it == approvals_.end() ? nullptr : &it->second;
}

double Engine::team_units(const std::string& team, int64_t now_ms) const {
  return held_gpus([&](const Lease& lease) { return lease.req.team == team; }, now_ms, {});
}

double Engine::held_gpus(const std::function<bool(const Lease&)>& match, int64_t now_ms,
                         const std::set<int64_t>& ignore) const {
  // a GPU carrying any shared lease of the matched leases counts whole: nobody else can use it whole, so
  // counting the memory share would let a team hold many GPUs while counting as a fraction of one (issue 15)
  double whole = 0;
  std::set<int> shared_gpus;
  for (const auto& [id, lease] : leases_) {
    // emergency leases come out of the pool, not the team's quota
    if (lease.emergency || !lease.holds_gpus(now_ms) || ignore.count(id) || !match(lease)) continue;
    if (lease.shared) {
      shared_gpus.insert(lease.devices.begin(), lease.devices.end());
    } else {
      whole += lease.gpus;
    }
  }
  return whole + static_cast<double>(shared_gpus.size());
}

double Engine::added_gpus(const Lease& lease, const std::vector<int>& devices, int64_t now_ms) const {
  if (!lease.shared) return static_cast<double>(devices.size());
  // shared leases of one team only ever share a GPU with each other (place()), so joining a GPU that already
  // carries leases costs nothing more
  for (const auto& [id, holder] : leases_) {
    if (id == lease.id || !holder.holds_gpus(now_ms)) continue;
    for (int device : holder.devices) {
      if (std::find(devices.begin(), devices.end(), device) != devices.end()) return 0;
    }
  }
  return 1;
}

std::optional<Engine::Placement> Engine::place(const Lease& lease, int64_t now_ms,
                                               const std::set<int64_t>& ignore) const {
  const size_t gpu_count = policy_.gpus.size();
  std::vector<double> used(gpu_count, 0);
  std::vector<int> count(gpu_count, 0);
  std::vector<bool> whole(gpu_count, false), non_critical(gpu_count, false), foreign(gpu_count, false);
  for (const auto& [id, holder] : leases_) {
    if (id == lease.id || !holder.holds_gpus(now_ms) || ignore.count(id)) continue;
    for (int device : holder.devices) {
      if (device < 0 || static_cast<size_t>(device) >= gpu_count) continue;
      // a GPU belongs to one team (or to the emergency pool) at a time: shared leases of different teams never
      // share it, so that every GPU counts against exactly one team's quota
      foreign[static_cast<size_t>(device)] = foreign[static_cast<size_t>(device)] || !same_owner(holder, lease);
      used[static_cast<size_t>(device)] +=
          holder.shared ? holder.memory_gib : policy_.gpus[static_cast<size_t>(device)].memory_gib;
      count[static_cast<size_t>(device)] += 1;
      whole[static_cast<size_t>(device)] = whole[static_cast<size_t>(device)] || !holder.shared;
      non_critical[static_cast<size_t>(device)] =
          non_critical[static_cast<size_t>(device)] || holder.req.priority != Priority::kCritical;
    }
  }
  Placement placement;
  // where the trainer already runs: only its GPUs, or all of them and the rest elsewhere (a multi-pod job)
  const Pin pin = pin_of(lease.req);
  std::vector<bool> allowed(gpu_count, pin.devices.empty());
  for (int device : pin.devices) allowed[static_cast<size_t>(device)] = true;
  if (lease.shared) {
    int best = -1;
    for (size_t device = 0; device < gpu_count; ++device) {
      const double free = policy_.gpus[device].memory_gib - used[device];
      if (!allowed[device] || whole[device] || foreign[device] || count[device] >= policy_.max_leases_per_gpu ||
          free + kEps < lease.memory_gib) {
        continue;
      }
      // pack: prefer GPUs already shared, then the tightest fit
      auto key = [&](size_t gpu) { return std::make_pair(count[gpu] == 0, policy_.gpus[gpu].memory_gib - used[gpu]); };
      if (best < 0 || key(device) < key(static_cast<size_t>(best))) best = static_cast<int>(device);
    }
    if (best < 0) return std::nullopt;
    placement.devices = {best};
  } else {
    auto free_whole = [&](size_t device) {
      return count[device] == 0 && policy_.gpus[device].memory_gib + kEps >= lease.memory_gib;
    };
    if (pin_spills(pin, guaranteed_gpus(lease))) {
      for (int device : pin.devices) {
        if (!free_whole(static_cast<size_t>(device))) return std::nullopt;
        placement.devices.push_back(device);
      }
      for (size_t device = 0; device < gpu_count; ++device) {
        allowed[device] =
            std::find(pin.devices.begin(), pin.devices.end(), static_cast<int>(device)) == pin.devices.end();
      }
    }
    std::map<std::string, std::vector<int>> free_by_node;
    std::vector<std::string> node_order;
    for (size_t device = 0; device < gpu_count; ++device) {
      const auto& gpu = policy_.gpus[device];
      if (!free_by_node.count(gpu.node)) node_order.push_back(gpu.node);
      auto& free_devices = free_by_node[gpu.node];
      if (allowed[device] && free_whole(device)) free_devices.push_back(static_cast<int>(device));
    }
    const size_t need =
        static_cast<size_t>(lease.gpus) - std::min(placement.devices.size(), static_cast<size_t>(lease.gpus));
    // best fit: the node with the fewest free GPUs that still holds the whole lease
    const std::vector<int>* fit = nullptr;
    for (const auto& node : node_order) {
      const auto& free_devices = free_by_node[node];
      if (free_devices.size() >= need && (fit == nullptr || free_devices.size() < fit->size())) fit = &free_devices;
    }
    if (fit != nullptr) {
      placement.devices.insert(placement.devices.end(), fit->begin(), fit->begin() + static_cast<long>(need));
    } else {
      std::stable_sort(node_order.begin(), node_order.end(), [&](const std::string& left, const std::string& right) {
        return free_by_node[left].size() > free_by_node[right].size();
      });
      size_t taken = 0;
      for (const auto& node : node_order) {
        for (int device : free_by_node[node]) {
          if (taken < need) {
            placement.devices.push_back(device);
            ++taken;
          }
        }
      }
      if (taken < need) return std::nullopt;
    }
  }
  if (lease.req.priority != Priority::kCritical) {
    for (int device : placement.devices) non_critical[static_cast<size_t>(device)] = true;
    const long busy = std::count(non_critical.begin(), non_critical.end(), true);
    if (busy > policy_.total_gpus() - policy_.emergency_pool_gpus()) return std::nullopt;
  }
  return placement;
}

std::string Engine::user_cap_reason(const Lease& lease, const std::vector<int>* devices, int64_t now_ms) const {
  auto team_it = policy_.teams.find(lease.req.team);
  if (team_it == policy_.teams.end() || team_it->second.max_gpus_per_user <= 0) return "";
  const double cap = team_it->second.max_gpus_per_user;
  auto mine = [&](const Lease& other) { return other.req.user == lease.req.user; };
  const double held = held_gpus(mine, now_ms, {});
  double added = lease.shared ? 1.0 : lease.gpus;
  if (lease.shared && devices != nullptr) {
    // joining a GPU that already carries one of the user's shared leases adds nothing to the user's count
    for (const auto& [id, other] : leases_) {
      if (id != lease.id && other.shared && mine(other) && !other.emergency && other.holds_gpus(now_ms) &&
          other.devices == *devices) {
        added = 0;
      }
    }
  }
  if (held + added <= cap + kEps) return "";
  return "user " + lease.req.user + " holds " + fixed_text(held) + " of the " + fixed_text(cap) +
         " GPUs one member of team " + lease.req.team + " may hold (teams." + lease.req.team + ".max_gpus_per_user)";
}

bool Engine::try_grant(Lease& lease, int64_t now_ms) {
  auto team_it = policy_.teams.find(lease.req.team);
  if (team_it == policy_.teams.end()) return false;  // the team left the policy since the request
  const Team& team = team_it->second;
  const bool critical = lease.req.priority == Priority::kCritical;
  const double before = team_units(lease.req.team, now_ms);
  // a whole lease's cost is known before placing it (placing is the dearer check)
  if (!critical && !lease.shared && before + lease.gpus > team.limit_at(now_ms) + kEps) return false;
  auto placement = place(lease, now_ms, {});
  if (!placement) return false;
  const double added = added_gpus(lease, placement->devices, now_ms);
  if (!critical && before + added > team.limit_at(now_ms) + kEps) return false;
  if (!critical && !user_cap_reason(lease, &placement->devices, now_ms).empty()) return false;
  // per-job burst: more GPUs, up to max_gpus, only from idle capacity (nobody else waiting), revoked first
  int extra = 0;
  auto others_waiting = [&]() {
    return std::any_of(queue_.begin(), queue_.end(), [&](int64_t id) {
      auto it = leases_.find(id);
      return id != lease.id && it != leases_.end() && it->second.state == LeaseState::kQueued;
    });
  };
  if (!critical && !lease.shared && lease.req.max_gpus > lease.gpus && !others_waiting()) {
    for (int more = lease.req.max_gpus - lease.gpus; more > 0 && extra == 0; --more) {
      Lease bigger = lease;
      bigger.gpus = lease.gpus + more;
      if (before + bigger.gpus > team.limit_at(now_ms) + kEps) continue;
      if (!user_cap_reason(bigger, nullptr, now_ms).empty()) continue;
      if (auto wider = place(bigger, now_ms, {})) {
        placement = wider;
        extra = more;
      }
    }
  }
  lease.gpus += extra;
  lease.extra_gpus = extra;
  const double added_all = added + extra;
  lease.devices = placement->devices;
  // A whole-GPU lease may use all the memory of its GPUs (the smallest, when they differ): that, not the
  // admission estimate it was placed by, is the budget the trainer sizes its batch to.
  if (!lease.shared) {
    double smallest = 0;
    for (int device : lease.devices) {
      const double gib = policy_.gpus[static_cast<size_t>(device)].memory_gib;
      smallest = smallest > 0 ? std::min(smallest, gib) : gib;
    }
    lease.memory_gib = smallest;
  }
  lease.state = LeaseState::kGranted;
  lease.granted_ms = now_ms;
  lease.last_seen_ms = now_ms;
  lease.charged_until_ms = now_ms;
  lease.emergency = critical;
  lease.review_pending = critical;
  lease.over_base = !critical && before + added_all > team.base + kEps;
  lease.waiting_on.clear();
  lease.reason.clear();
  changes_.leases.insert(lease.id);
  const std::string devs = describe_devices(lease);
  if (critical) {
    log(now_ms, requester(lease.req), "emergency.granted", &lease,
        on_behalf(lease.req) + "critical lease on " + devs + "; justification: " + lease.req.justification +
            "; review pending");
  } else {
    log(now_ms, requester(lease.req), "lease.granted", &lease,
        on_behalf(lease.req) + devs + (lease.over_base ? " (burst, over base)" : "") +
            (extra > 0 ? " (+" + std::to_string(extra) + " idle GPU(s) beyond the " +
                             std::to_string(lease.gpus - extra) + " requested, revoked first)"
                       : ""));
  }
  return true;
}

bool Engine::try_preempt(Lease& waiting, int64_t now_ms) {
  auto team_it = policy_.teams.find(waiting.req.team);
  if (team_it == policy_.teams.end()) return false;
  const Team& team = team_it->second;
  const bool critical = waiting.req.priority == Priority::kCritical;
  // a shared request that does not fit needs a GPU of its own: it counts whole
  const double mine = team_units(waiting.req.team, now_ms) + (waiting.shared ? 1.0 : waiting.gpus);
  // over its own team's limit, a request may only displace lower-priority work of its own team
  const bool over_own = !critical && mine > team.limit_at(now_ms) + kEps;
  const double must_free_own = over_own ? mine - team.limit_at(now_ms) : 0;
  const bool within_base = critical || mine <= team.base + kEps;
  // a request held back by its user's own cap waits for the user's leases, never takes anyone else's
  if (!critical && !user_cap_reason(waiting, nullptr, now_ms).empty()) return false;
  std::map<std::string, bool> over_limit, over_base;
  for (const auto& [name, other_team] : policy_.teams) {
    const double used = team_units(name, now_ms);
    over_limit[name] = used > other_team.limit_at(now_ms) + kEps;
    over_base[name] = used > other_team.base + kEps;
  }

  std::vector<const Lease*> candidates;
  for (const auto& [id, victim] : leases_) {
    if (victim.state != LeaseState::kGranted || victim.req.priority == Priority::kCritical) continue;
    if (now_ms - victim.granted_ms < static_cast<int64_t>(policy_.min_runtime_s) * 1000) continue;
    const bool lower = victim.req.priority < waiting.req.priority;
    // the base is a guarantee: a team above its base (by the whole-GPU count) gives GPUs back to a team below it
    const bool reclaim =
        within_base && victim.req.team != waiting.req.team && (victim.over_base || over_base[victim.req.team]);
    // `preemptible: false` protects work within the team's base, not GPUs taken beyond it
    // a per-job burst took idle GPUs: any request within its team's limit may have them back
    const bool idle_burst = victim.extra_gpus > 0 && victim.id != waiting.id;
    if (!victim.req.preemptible && !idle_burst && !(reclaim && victim.over_base)) continue;
    if (over_own ? ((lower || idle_burst) && victim.req.team == waiting.req.team) : (lower || reclaim || idle_burst)) {
      candidates.push_back(&victim);
    }
  }
  if (candidates.empty()) return false;
  auto rank = [&](const Lease* victim) {
    // teams past their current limit (burst window closed) first, then burst leases, then low priority,
    // then the freshest checkpoint (least work lost), then the youngest
    return std::make_tuple(victim->extra_gpus == 0, !over_limit[victim->req.team], !victim->over_base,
                           static_cast<int>(victim->req.priority), -victim->telemetry.last_checkpoint_ms,
                           -victim->granted_ms, victim->id);
  };
  std::stable_sort(candidates.begin(), candidates.end(),
                   [&](const Lease* left, const Lease* right) { return rank(left) < rank(right); });
  std::set<int64_t> ignore;
  std::vector<const Lease*> victims;
  const double own_now = team_units(waiting.req.team, now_ms);
  auto enough = [&]() {
    const double freed_own =
        own_now - held_gpus([&](const Lease& lease) { return lease.req.team == waiting.req.team; }, now_ms, ignore);
    return freed_own + kEps >= must_free_own && place(waiting, now_ms, ignore).has_value();
  };
  bool fits = false;
  for (const Lease* victim : candidates) {
    ignore.insert(victim->id);
    victims.push_back(victim);
    if (enough()) {
      fits = true;
      break;
    }
  }
  if (!fits) return false;
  // drop victims that turned out unnecessary
  for (size_t i = 0; i < victims.size();) {
    const Lease* victim = victims[i];
    ignore.erase(victim->id);
    victims.erase(victims.begin() + static_cast<long>(i));
    if (enough()) continue;
    ignore.insert(victim->id);
    victims.insert(victims.begin() + static_cast<long>(i), victim);
    ++i;
  }
  waiting.waiting_on.clear();
  for (const Lease* candidate : victims) {
    Lease& victim = leases_.at(candidate->id);
    victim.state = LeaseState::kRevoking;
    victim.deadline_ms = now_ms + static_cast<int64_t>(policy_.preempt_grace_s) * 1000;
    victim.preempted_for = waiting.id;
    victim.reason = "preempted for lease " + std::to_string(waiting.id) + " (" + to_string(waiting.req.priority) +
                    ", team " + waiting.req.team + ")";
    changes_.leases.insert(victim.id);
    waiting.waiting_on.push_back(victim.id);
    log(now_ms, "quotad", "preempt.revoke", &victim,
        "revoking for lease " + std::to_string(waiting.id) + "; checkpoint and release within " +
            std::to_string(policy_.preempt_grace_s) + " s" + (victim.over_base ? " (over base)" : ""));
  }
  changes_.leases.insert(waiting.id);
  return true;
}

void Engine::order_queue(int64_t now_ms) {
  using Key = std::tuple<bool, int, double, int64_t, int64_t>;
  std::vector<std::pair<Key, int64_t>> keyed;
  std::map<std::pair<std::string, std::string>, double> factors;  // (team, user) -> fair-share factor
  for (const auto& [id, lease] : leases_) {
    if (lease.state != LeaseState::kQueued) continue;
    double factor = 1;
    if (policy_.fair_share_half_life_h > 0) {
      const auto key = std::make_pair(lease.req.team, lease.req.user);
      auto it = factors.find(key);
      if (it == factors.end()) it = factors.emplace(key, fair_share(key.first, key.second, now_ms).factor).first;
      factor = it->second;
    }
    // requests already waiting on a preemption go first, so nobody else takes the GPUs they freed; then
    // priority, the fair-share factor (higher first), arrival
    keyed.emplace_back(
        Key{lease.waiting_on.empty(), -static_cast<int>(lease.req.priority), -factor, lease.created_ms, id}, id);
  }
  std::sort(keyed.begin(), keyed.end());
  queue_.clear();
  queue_index_.clear();
  for (const auto& [key, id] : keyed) {
    queue_index_[id] = static_cast<int>(queue_.size());
    queue_.push_back(id);
  }
}

int Engine::queue_position(int64_t lease_id) const {
  auto it = queue_index_.find(lease_id);
  return it == queue_index_.end() ? 0 : it->second + 1;
}

double Engine::decayed(const std::string& key, int64_t now_ms) const {
  auto it = fair_usage_.find(key);
  if (it == fair_usage_.end() || policy_.fair_share_half_life_h <= 0) return 0;
  const double age_h = static_cast<double>(std::max<int64_t>(0, now_ms - it->second.as_of_ms)) / 3.6e6;
  return it->second.value * std::exp2(-age_h / policy_.fair_share_half_life_h);
}

void Engine::add_fair_usage(const Lease& lease, double gpu_hours, int64_t at_ms) {
  if (policy_.fair_share_half_life_h <= 0 || !(gpu_hours > 0)) return;
  for (const std::string& key : {"team:" + lease.req.team, "user:" + lease.req.user}) {
    Decayed& entry = fair_usage_[key];
    entry.value = decayed(key, at_ms) + gpu_hours;
    entry.as_of_ms = std::max(entry.as_of_ms, at_ms);
  }
}

FairShare Engine::fair_share(const std::string& team, const std::string& user, int64_t now_ms) const {
  FairShare out;
  double all_teams = 0, all_shares = 0;
  for (const auto& [name, other] : policy_.teams) {
    all_teams += decayed("team:" + name, now_ms);
    all_shares += other.share_weight();
  }
  auto team_it = policy_.teams.find(team);
  if (team_it == policy_.teams.end()) return out;
  out.team_gpu_hours = decayed("team:" + team, now_ms);
  out.team_usage = all_teams > 0 ? out.team_gpu_hours / all_teams : 0;
  out.team_share = all_shares > 0 ? team_it->second.share_weight() / all_shares : 0;
  // within the team, every member (leads included) has an equal share
  std::set<std::string> people(team_it->second.members.begin(), team_it->second.members.end());
  people.insert(team_it->second.leads.begin(), team_it->second.leads.end());
  people.insert(user);  // an admin acting in the team
  double all_users = 0;
  for (const auto& name : people) all_users += decayed("user:" + name, now_ms);
  out.user_gpu_hours = decayed("user:" + user, now_ms);
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

void Engine::schedule(int64_t now_ms) {
  order_queue(now_ms);
  const std::vector<int64_t> ids = queue_;
  // requests alike in everything the decision reads get the same answer until something changes: a flood of
  // identical requests (issue 15: 1,200 from one member) costs one check per pass, not one per request
  using Signature = std::tuple<std::string, std::string, int, int, bool, double, int, std::string, std::string>;
  std::set<Signature> refused;
  for (int64_t id : ids) {
    Lease& lease = leases_.at(id);
    if (lease.state != LeaseState::kQueued) continue;
    const Signature signature{lease.req.team,
                              lease.req.user,
                              lease.gpus,
                              lease.req.max_gpus,
                              lease.shared,
                              lease.memory_gib,
                              static_cast<int>(lease.req.priority),
                              lease.req.model,
                              pin_of(lease.req).text};  // pinned requests differ by where they may go
    if (lease.waiting_on.empty() && refused.count(signature)) continue;
    if (try_grant(lease, now_ms)) {
      refused.clear();
      continue;
    }
    bool still_waiting = false;
    for (int64_t victim_id : lease.waiting_on) {
      auto it = leases_.find(victim_id);
      if (it != leases_.end() && it->second.holds_gpus(now_ms)) still_waiting = true;
    }
    if (still_waiting) continue;
    if (!lease.waiting_on.empty()) {
      lease.waiting_on.clear();  // victims are gone but it still does not fit: choose again
      changes_.leases.insert(lease.id);
    }
    if (try_preempt(lease, now_ms)) {
      refused.clear();
    } else {
      refused.insert(signature);
    }
  }
  order_queue(now_ms);
}

std::string Engine::fair_share_text(const Lease& lease, int64_t now_ms) const {
  if (policy_.fair_share_half_life_h <= 0) return "";
  const FairShare share = fair_share(lease.req.team, lease.req.user, now_ms);
  auto percent = [](double fraction) { return fixed_text(100 * fraction, 0) + "%"; };
  return "; fair share " + fixed_text(share.factor, 2) + ": team " + lease.req.team + " " + percent(share.team_usage) +
         " of recent use (" + fixed_text(share.team_gpu_hours) + " GPU-h decayed) for a " + percent(share.team_share) +
         " share, " + lease.req.user + " " + percent(share.user_usage) + " of the team's for " +
         percent(share.user_share);
}

std::string Engine::queue_reason(const Lease& lease, int64_t now_ms) const {
  if (!lease.waiting_on.empty()) {
    std::string ids;
    int64_t deadline = 0;
    for (int64_t victim_id : lease.waiting_on) {
      ids += (ids.empty() ? "" : ", ") + std::to_string(victim_id);
      if (const Lease* victim = find(victim_id)) deadline = std::max(deadline, victim->deadline_ms);
    }
    return "waiting for preempted lease(s) " + ids + " to release (deadline in " +
           std::to_string(std::max<int64_t>(0, (deadline - now_ms) / 1000)) + " s)";
  }
  auto team_it = policy_.teams.find(lease.req.team);
  if (team_it == policy_.teams.end()) return "team " + lease.req.team + " is no longer in the policy";
  const Team& team = team_it->second;
  const double used = team_units(lease.req.team, now_ms);
  const auto placement = place(lease, now_ms, {});
  const double added = placement ? added_gpus(lease, placement->devices, now_ms) : (lease.shared ? 1.0 : lease.gpus);
  if (lease.req.priority != Priority::kCritical && used + added > team.limit_at(now_ms) + kEps) {
    return "team " + team.name + " uses " + fixed_text(used) + " of the " + fixed_text(team.limit_at(now_ms)) +
           " GPUs allowed now (base " + fixed_text(team.base) + ", burst " + fixed_text(team.burst) +
           (team.in_burst_window(now_ms) ? ", inside a burst window)" : " only inside burst windows)") +
           fair_share_text(lease, now_ms);
  }
  std::string reason = lease.req.priority != Priority::kCritical
                           ? user_cap_reason(lease, placement ? &placement->devices : nullptr, now_ms)
                           : "";
  if (reason.empty()) {
    reason = "no free GPU fits " + (lease.shared ? fixed_text(lease.memory_gib) + " GiB (shared)"
                                                 : std::to_string(lease.gpus) + " whole GPU(s)");
    if (const Pin pin = pin_of(lease.req); !pin.devices.empty()) {
      reason += pin_spills(pin, lease.gpus) ? " with all of " : " on ";
      reason += pin.text + (pin.by_uuid    ? " (the GPUs the trainer sees)"
                            : pin.by_index ? " (device= of the trainer)"
                                           : " (the node the trainer runs on)");
    }
    if (policy_.emergency_pool_gpus() > 0 && lease.req.priority != Priority::kCritical) {
      reason += "; " + std::to_string(policy_.emergency_pool_gpus()) + " GPU(s) stay reserved for critical leases";
    }
  }
  return reason + fair_share_text(lease, now_ms);
}

AcquireResult Engine::status_of(int64_t lease_id, int64_t now_ms) const {
  AcquireResult result;
  result.lease_id = lease_id;
  const Lease* lease = find(lease_id);
  if (lease == nullptr) {
    result.kind = AcquireResult::Kind::kInvalid;
    result.reason = "unknown lease " + std::to_string(lease_id);
    return result;
  }
  result.approval_id = lease->approval_id;
  switch (lease->state) {
    case LeaseState::kGranted:
    case LeaseState::kRevoking: result.kind = AcquireResult::Kind::kGranted; break;
    case LeaseState::kQueued:
      result.kind = AcquireResult::Kind::kQueued;
      result.position = queue_position(lease_id);
      result.reason = queue_reason(*lease, now_ms);
      break;
    case LeaseState::kPendingApproval:
      result.kind = AcquireResult::Kind::kNeedsApproval;
      result.reason = "model " + lease->req.model + " needs the approval of a lead of team " + lease->req.team;
      break;
    default:
      result.kind = AcquireResult::Kind::kNotAllowed;
      result.reason = "lease " + std::to_string(lease_id) + " has ended (" + to_string(lease->state) +
                      (lease->reason.empty() ? "" : ": " + lease->reason) + ")";
  }
  return result;
}

AcquireResult Engine::acquire(const LeaseRequest& req_in, int64_t now_ms) {
  if (!req_in.idempotency_key.empty()) {
    auto it = idempotency_.find({req_in.user, req_in.idempotency_key});
    if (it != idempotency_.end() && leases_.count(it->second)) {
      AcquireResult result = status_of(it->second, now_ms);
      result.replayed = true;
      return result;
    }
  }
  AcquireResult result;
  auto refuse = [&](AcquireResult::Kind kind, const std::string& why) {
    result.kind = kind;
    result.reason = why;
    return result;
  };
  LeaseRequest req = req_in;
  if (req.user.empty()) return refuse(AcquireResult::Kind::kInvalid, "user: required");
  if (!policy_.teams.count(req.team))
    return refuse(AcquireResult::Kind::kInvalid, "team: unknown team '" + req.team + "'");
  // only users of the policy, in their own team (admins in any), may hold leases: the credit check and the
  // audit depend on it
  const auto user_it = policy_.users.find(req.user);
  if (user_it == policy_.users.end()) {
    return refuse(AcquireResult::Kind::kNotAllowed, "user: unknown user '" + req.user + "' (not in the policy)");
  }
  if (user_it->second.role != Role::kAdmin && user_it->second.team != req.team) {
    return refuse(AcquireResult::Kind::kNotAllowed, "user: " + req.user + " is not a member of team " + req.team);
  }
  if (req.model.empty()) return refuse(AcquireResult::Kind::kInvalid, "model: required");
  if (req.imgsz < 32 || req.imgsz > policy_.max_imgsz) {
    return refuse(AcquireResult::Kind::kInvalid, "imgsz: must be within 32.." + std::to_string(policy_.max_imgsz));
  }
  if (req.batch < 0 || req.batch > policy_.max_batch) {
    return refuse(AcquireResult::Kind::kInvalid,
                  "batch: must be within 0.." + std::to_string(policy_.max_batch) + " (0 = auto)");
  }
  if (req.gpus < 0 || req.gpus > policy_.total_gpus()) {
    return refuse(AcquireResult::Kind::kInvalid,
                  "gpus: must be within 0.." + std::to_string(policy_.total_gpus()) + " (0 = default)");
  }
  if (req.max_gpus < 0 || req.max_gpus > policy_.total_gpus()) {
    return refuse(AcquireResult::Kind::kInvalid,
                  "max_gpus: must be within 0.." + std::to_string(policy_.total_gpus()) + " (0 = gpus)");
  }
  if (req.max_gpus > 0 && req.max_gpus < std::max(req.gpus, policy_.default_gpus)) {
    return refuse(AcquireResult::Kind::kInvalid, "max_gpus: must be at least gpus (the guaranteed part)");
  }
  if (req.max_gpus > 1 && req.shared) {
    return refuse(AcquireResult::Kind::kInvalid, "max_gpus: a shared lease holds one GPU and cannot burst");
  }
  if (!(req.memory_gib >= 0) || req.memory_gib > policy_.max_gpu_memory_gib()) {
    return refuse(AcquireResult::Kind::kInvalid,
                  "memory_gib: must be within 0.." + fixed_text(policy_.max_gpu_memory_gib()) + " GiB per GPU");
  }
  // in Kubernetes the pod already runs on its node with its GPUs: a request the inventory contradicts is a
  // configuration error to fix, not one to queue forever
  if (const std::string why = pin_refusal(req); !why.empty()) return refuse(AcquireResult::Kind::kInvalid, why);
  Lease lease;
  lease.req = req;
  lease.gpus = req.gpus > 0 ? req.gpus : policy_.default_gpus;
  // A shared lease the policy does not allow is refused, not silently turned into whole GPUs: the trainer sized
  // its plans (and its neighbours) to a share.
  if (req.shared) {
    const std::string why = policy_.shared_refusal(req.model, lease.gpus);
    if (!why.empty()) return refuse(AcquireResult::Kind::kNotAllowed, why);
  }
  lease.shared = req.shared;
  if (lease.shared) {
    auto it = policy_.default_memory_gib.find(req.model);
    lease.memory_gib = req.memory_gib > 0                       ? req.memory_gib
                       : it != policy_.default_memory_gib.end() ? it->second
                                                                : policy_.default_memory_fallback_gib;
  } else {
    lease.memory_gib = req.memory_gib;
  }
  const bool critical = req.priority == Priority::kCritical;
  if (const Team& team = policy_.teams.at(req.team);
      !critical && team.max_gpus_per_user > 0 && (lease.shared ? 1 : lease.gpus) > team.max_gpus_per_user) {
    return refuse(AcquireResult::Kind::kNotAllowed, "gpus: " + std::to_string(lease.gpus) + " is more than the " +
                                                        std::to_string(team.max_gpus_per_user) +
                                                        " GPUs one member of team " + req.team + " may hold (teams." +
                                                        req.team + ".max_gpus_per_user)");
  }
  // admission: the estimated memory must fit what a GPU (or the share) offers
  double admitted_gib = 0;
  const std::string memory_row = policy_.memory_table.describe_row(req.model);
  const Pin pin = pin_of(req);
  // the memory a pinned whole-GPU lease can get: the largest pinned GPU, or the smallest when it takes them all
  double pinned_gib = pin.devices.empty() ? policy_.max_gpu_memory_gib() : 0;
  for (int device : pin.devices) {
    const double gib = policy_.gpus[static_cast<size_t>(device)].memory_gib;
    pinned_gib = pinned_gib == 0               ? gib
                 : pin_spills(pin, lease.gpus) ? std::min(pinned_gib, gib)
                                               : std::max(pinned_gib, gib);
  }
  if (policy_.memory_table.has(req.model)) {
    const double avail = lease.shared ? lease.memory_gib : pinned_gib;
    const int per_gpu = req.batch > 0 ? (req.batch + lease.gpus - 1) / lease.gpus : 1;
    const double need = policy_.memory_table.estimate_gib(req.model, req.imgsz, per_gpu);
    // whole-GPU leases only go to GPUs big enough for the estimate
    if (!lease.shared) lease.memory_gib = std::max(lease.memory_gib, need);
    admitted_gib = need;
    if (need > avail + kEps) {
      result.max_batch = policy_.memory_table.max_batch(req.model, req.imgsz, avail) * lease.gpus;
      result.needed_gib = need;
      result.memory_row = memory_row;
      const std::string what = req.batch > 0 ? "batch " + std::to_string(req.batch) : "one image";
      return refuse(
          AcquireResult::Kind::kAdmissionRefused,
          what + " for " + req.model + " at " + std::to_string(req.imgsz) + " needs ~" + fixed_text(need) +
              " GiB per GPU (estimate), " + fixed_text(avail) + " GiB available; " +
              (result.max_batch > 0 ? "at most batch " + std::to_string(result.max_batch) + " fits, or use batch=auto"
                                    : "it does not fit even with batch 1: use a smaller imgsz or model") +
              "; from " + memory_row);
    }
  }
  if (!pin.devices.empty() && lease.memory_gib > pinned_gib + kEps) {
    return refuse(AcquireResult::Kind::kAdmissionRefused,
                  "memory_gib: " + fixed_text(lease.memory_gib) + " GiB per GPU, but the GPUs of " + pin.text +
                      " (where the trainer runs) have " + fixed_text(pinned_gib) + " GiB");
  }
  if (critical && req.justification.empty()) {
    return refuse(AcquireResult::Kind::kNotAllowed,
                  "justification: a critical (emergency) lease needs a justification");
  }
  const bool needs_approval = !critical && policy_.needs_approval(req.model);
  if (needs_approval && req.justification.empty()) {
    return refuse(AcquireResult::Kind::kNotAllowed,
                  "justification: model " + req.model +
                      " is in the approval tier; add a justification for a lead of team " + req.team);
  }
  if (policy_.monthly_gpu_hours > 0 && !critical) {
    const std::string month = month_key(now_ms);
    const double used = used_gpu_hours(req.user, month, now_ms);
    const double allowed = credit_allowance(req.user, month, now_ms);
    if (used + kEps >= allowed) {
      return refuse(AcquireResult::Kind::kCreditsSpent, "credits: " + req.user + " used " + fixed_text(used) + " of " +
                                                            fixed_text(allowed) + " GPU-hours in " + month +
                                                            (policy_.loan_gpu_hours > 0 ? " (loan included)" : ""));
    }
  }
  const auto waiting = std::count_if(leases_.begin(), leases_.end(), [&](const auto& entry) {
    return entry.second.req.user == req.user &&
           (entry.second.state == LeaseState::kQueued || entry.second.state == LeaseState::kPendingApproval);
  });
  if (waiting >= policy_.max_queued_per_user) {
    return refuse(AcquireResult::Kind::kTooManyQueued,
                  "queue: " + req.user + " already has " + std::to_string(waiting) +
                      " requests waiting (limits.max_queued_per_user); release or wait for some first");
  }
  lease.id = next_lease_++;
  lease.created_ms = now_ms;
  lease.last_seen_ms = now_ms;
  if (needs_approval) {
    Approval approval;
    approval.id = next_approval_++;
    approval.lease_id = lease.id;
    approval.team = req.team;
    approval.user = req.user;
    approval.model = req.model;
    approval.justification = req.justification;
    approval.created_ms = now_ms;
    approvals_[approval.id] = approval;
    changes_.approvals.insert(approval.id);
    lease.approval_id = approval.id;
    lease.state = LeaseState::kPendingApproval;
  } else {
    lease.state = LeaseState::kQueued;
  }
  auto& stored = leases_[lease.id] = lease;
  changes_.leases.insert(lease.id);
  if (!req.idempotency_key.empty()) idempotency_[{req.user, req.idempotency_key}] = lease.id;
  if (needs_approval) {
    log(now_ms, requester(req), "approval.requested", &stored,
        on_behalf(req) + "approval " + std::to_string(lease.approval_id) + " for " + req.model + ": " +
            req.justification);
  } else {
    schedule(now_ms);
    if (stored.state == LeaseState::kQueued) {
      log(now_ms, requester(req), "lease.queued", &stored, on_behalf(req) + queue_reason(stored, now_ms));
    }
  }
  AcquireResult answer = status_of(lease.id, now_ms);
  answer.memory_row = memory_row;
  answer.needed_gib = admitted_gib;
  return answer;
}

HeartbeatResult Engine::heartbeat(int64_t lease_id, const Telemetry& telemetry, int64_t now_ms) {
  HeartbeatResult result;
  auto it = leases_.find(lease_id);
  if (it == leases_.end()) return result;
  Lease& lease = it->second;
  result.found = true;
  result.state = lease.state;
  if (is_terminal(lease.state)) {
    result.reason = lease.reason;
    return result;
  }
  lease.last_seen_ms = now_ms;
  if (lease.state == LeaseState::kQueued) {
    result.position = queue_position(lease_id);
    result.reason = queue_reason(lease, now_ms);
    return result;
  }
  if (telemetry.step >= 0) lease.telemetry.step = telemetry.step;
  if (telemetry.epoch >= 0) lease.telemetry.epoch = telemetry.epoch;
  if (telemetry.gpu_util >= 0) lease.telemetry.gpu_util = telemetry.gpu_util;
  if (!telemetry.gpu_util_source.empty()) lease.telemetry.gpu_util_source = telemetry.gpu_util_source;
  if (telemetry.device_memory_used_gib >= 0) lease.telemetry.device_memory_used_gib = telemetry.device_memory_used_gib;
  if (telemetry.memory_used_gib >= 0) lease.telemetry.memory_used_gib = telemetry.memory_used_gib;
  if (telemetry.last_checkpoint_ms > 0) lease.telemetry.last_checkpoint_ms = telemetry.last_checkpoint_ms;
  merge_memory_context(lease.telemetry, telemetry);
  result.deadline_ms = lease.deadline_ms;
  result.reason = lease.reason;
  return result;
}

void Engine::touch(int64_t lease_id, const Telemetry& telemetry, int64_t seen_ms) {
  auto it = leases_.find(lease_id);
  if (it == leases_.end() || is_terminal(it->second.state)) return;
  Lease& lease = it->second;
  lease.last_seen_ms = std::max(lease.last_seen_ms, seen_ms);
  if (lease.state != LeaseState::kGranted && lease.state != LeaseState::kRevoking) return;
  if (telemetry.step >= 0) lease.telemetry.step = telemetry.step;
  if (telemetry.epoch >= 0) lease.telemetry.epoch = telemetry.epoch;
  if (telemetry.gpu_util >= 0) lease.telemetry.gpu_util = telemetry.gpu_util;
  if (!telemetry.gpu_util_source.empty()) lease.telemetry.gpu_util_source = telemetry.gpu_util_source;
  if (telemetry.device_memory_used_gib >= 0) lease.telemetry.device_memory_used_gib = telemetry.device_memory_used_gib;
  if (telemetry.memory_used_gib >= 0) lease.telemetry.memory_used_gib = telemetry.memory_used_gib;
  if (telemetry.last_checkpoint_ms > 0) lease.telemetry.last_checkpoint_ms = telemetry.last_checkpoint_ms;
  merge_memory_context(lease.telemetry, telemetry);
}

void Engine::credit_outage(int64_t from_ms, int64_t to_ms) {
  const int64_t gap = to_ms - from_ms;
  if (gap <= 0) return;
  int extended = 0;
  for (auto& [id, lease] : leases_) {
    const bool running = lease.state == LeaseState::kGranted || lease.state == LeaseState::kRevoking;
    if (!running && lease.state != LeaseState::kQueued) continue;
    if (lease.last_seen_ms < to_ms) lease.last_seen_ms = std::min(to_ms, lease.last_seen_ms + gap);
    if (lease.state == LeaseState::kRevoking) {
      lease.deadline_ms += gap;
      changes_.leases.insert(id);
    }
    ++extended;
  }
  log(to_ms, "quotad", "quotad.outage", nullptr,
      "quotad did not serve for " + std::to_string(gap / 1000) + " s; heartbeat clocks and deadlines of " +
          std::to_string(extended) + " lease(s) extended by it");
}

std::string Engine::waiting_reason(int64_t lease_id, int64_t now_ms) const {
  const Lease* lease = find(lease_id);
  return lease != nullptr && lease->state == LeaseState::kQueued ? queue_reason(*lease, now_ms) : "";
}

void Engine::charge(Lease& lease, int64_t until_ms) {
  if (lease.granted_ms == 0) return;
  const int64_t from = std::max(lease.charged_until_ms, lease.granted_ms);
  if (until_ms <= from) return;
  const double hours = static_cast<double>(until_ms - from) / 3.6e6 * lease.units(policy_);
  const auto key = std::make_pair(lease.req.user, month_key(until_ms));
  usage_[key] += hours;
  lease.gpu_hours += hours;
  lease.charged_until_ms = until_ms;
  add_fair_usage(lease, hours, until_ms);
  changes_.usage.insert(key);
  changes_.leases.insert(lease.id);
}

double Engine::used_gpu_hours(const std::string& user, const std::string& month, int64_t now_ms) const {
  auto it = usage_.find({user, month});
  double used = it == usage_.end() ? 0 : it->second;
  if (month == month_key(now_ms)) {
    for (const auto& [id, lease] : leases_) {
      if (lease.req.user == user && (lease.state == LeaseState::kGranted || lease.state == LeaseState::kRevoking)) {
        used += static_cast<double>(std::max<int64_t>(0, now_ms - std::max(lease.charged_until_ms, lease.granted_ms))) /
                3.6e6 * lease.units(policy_);
      }
    }
  }
  return used;
}

double Engine::credit_allowance(const std::string& user, const std::string& month, int64_t) const {
  return month_credit_of(user, month).allowance();
}

void Engine::end_lease(Lease& lease, LeaseState state, Outcome outcome, int64_t end_ms, int64_t free_at_ms,
                       const std::string& reason, const std::string& actor) {
  const bool held = lease.state == LeaseState::kGranted || lease.state == LeaseState::kRevoking;
  if (held) charge(lease, end_ms);
  const LeaseState before = lease.state;
  lease.state = state;
  lease.outcome = outcome;
  lease.ended_ms = end_ms;
  lease.free_at_ms = held ? free_at_ms : end_ms;
  if (!held) lease.devices.clear();
  if (!reason.empty()) lease.reason = reason;
  changes_.leases.insert(lease.id);
  // a cancelled waiter no longer needs its victims
  for (int64_t victim_id : lease.waiting_on) {
    auto it = leases_.find(victim_id);
    if (it != leases_.end() && it->second.state == LeaseState::kRevoking && it->second.preempted_for == lease.id) {
      it->second.state = LeaseState::kGranted;
      it->second.deadline_ms = 0;
      it->second.preempted_for = 0;
      it->second.reason.clear();
      changes_.leases.insert(victim_id);
      log(end_ms, "quotad", "preempt.cancelled", &it->second,
          "waiting lease " + std::to_string(lease.id) + " went away");
    }
  }
  lease.waiting_on.clear();
  const std::string action = state == LeaseState::kExpired ? "lease.expired" : "lease.released";
  std::string detail = "from " + to_string(before);
  if (outcome != Outcome::kNone) detail += ", outcome " + to_string(outcome);
  if (held) detail += ", " + fixed_text(lease.gpu_hours, 3) + " GPU-hours";
  if (!reason.empty()) detail += "; " + reason;
  log(end_ms, actor.empty() ? lease.req.user : actor, action, &lease, detail);
}

bool Engine::release(int64_t lease_id, Outcome outcome, int64_t now_ms, const std::string& actor) {
  auto it = leases_.find(lease_id);
  if (it == leases_.end() || is_terminal(it->second.state)) return false;
  Lease& lease = it->second;
  if (lease.state == LeaseState::kQueued || lease.state == LeaseState::kPendingApproval) outcome = Outcome::kCancelled;
  if (outcome == Outcome::kNone) outcome = Outcome::kCompleted;
  if (lease.state == LeaseState::kPendingApproval) {
    auto approval_it = approvals_.find(lease.approval_id);
    if (approval_it != approvals_.end() && approval_it->second.state == ApprovalState::kPending) {
      approval_it->second.state = ApprovalState::kCancelled;
      approval_it->second.decided_ms = now_ms;
      changes_.approvals.insert(approval_it->first);
    }
  }
  end_lease(lease, LeaseState::kReleased, outcome, now_ms, now_ms, "", actor);
  schedule(now_ms);
  return true;
}

void Engine::approve(int64_t approval_id, const std::string& by, int64_t now_ms, const std::string& note) {
  auto it = approvals_.find(approval_id);
  if (it == approvals_.end()) throw PolicyError("approval " + std::to_string(approval_id) + ": unknown");
  Approval& approval = it->second;
  if (approval.state != ApprovalState::kPending) {
    throw PolicyError("approval " + std::to_string(approval_id) + ": already " + to_string(approval.state));
  }
  approval.state = ApprovalState::kApproved;
  approval.decided_by = by;
  approval.decided_ms = now_ms;
  approval.note = note;
  changes_.approvals.insert(approval.id);
  Lease& lease = leases_.at(approval.lease_id);
  lease.state = LeaseState::kQueued;
  lease.last_seen_ms = now_ms;
  changes_.leases.insert(lease.id);
  log(now_ms, by, "approval.approved", &lease,
      "approval " + std::to_string(approval.id) + (note.empty() ? "" : ": " + note));
  schedule(now_ms);
}

void Engine::reject(int64_t approval_id, const std::string& by, int64_t now_ms, const std::string& note) {
  auto it = approvals_.find(approval_id);
  if (it == approvals_.end()) throw PolicyError("approval " + std::to_string(approval_id) + ": unknown");
  Approval& approval = it->second;
  if (approval.state != ApprovalState::kPending) {
    throw PolicyError("approval " + std::to_string(approval_id) + ": already " + to_string(approval.state));
  }
  approval.state = ApprovalState::kRejected;
  approval.decided_by = by;
  approval.decided_ms = now_ms;
  approval.note = note;
  changes_.approvals.insert(approval.id);
  Lease& lease = leases_.at(approval.lease_id);
  lease.state = LeaseState::kRejected;
  lease.ended_ms = now_ms;
  lease.reason = "rejected by " + by + (note.empty() ? "" : ": " + note);
  changes_.leases.insert(lease.id);
  log(now_ms, by, "approval.rejected", &lease,
      "approval " + std::to_string(approval.id) + (note.empty() ? "" : ": " + note));
}

void Engine::review_emergency(int64_t lease_id, const std::string& by, int64_t now_ms, const std::string& note) {
  auto it = leases_.find(lease_id);
  if (it == leases_.end() || !it->second.review_pending) {
    throw PolicyError("lease " + std::to_string(lease_id) + ": no emergency review pending");
  }
  it->second.review_pending = false;
  changes_.leases.insert(lease_id);
  log(now_ms, by, "emergency.reviewed", &it->second, note.empty() ? "reviewed" : note);
}

void Engine::tick(int64_t now_ms) {
  const int64_t ttl = static_cast<int64_t>(policy_.ttl_s) * 1000;
  const int64_t grace = static_cast<int64_t>(policy_.expiry_grace_s) * 1000;
  for (auto& [id, lease] : leases_) {
    if (lease.state == LeaseState::kRevoking && now_ms >= lease.deadline_ms) {
      end_lease(lease, LeaseState::kExpired, Outcome::kPreempted, now_ms, now_ms,
                "did not release by the preemption deadline", "quotad");
    } else if ((lease.state == LeaseState::kGranted || lease.state == LeaseState::kRevoking) &&
               now_ms - lease.last_seen_ms > ttl) {
      const int64_t end = lease.last_seen_ms + ttl;
      end_lease(lease, LeaseState::kExpired, Outcome::kNone, end, end + grace,
                "no heartbeat for " + std::to_string(policy_.ttl_s) + " s", "quotad");
    } else if (lease.state == LeaseState::kGranted || lease.state == LeaseState::kRevoking) {
      if (now_ms - std::max(lease.charged_until_ms, lease.granted_ms) >= kAccrueEveryMs) charge(lease, now_ms);
    } else if (lease.state == LeaseState::kQueued && now_ms - lease.last_seen_ms > ttl) {
      end_lease(lease, LeaseState::kExpired, Outcome::kCancelled, now_ms, now_ms,
                "queued request not polled for " + std::to_string(policy_.ttl_s) + " s", "quotad");
    }
  }
  settle_loans(now_ms);
  schedule(now_ms);
}

std::vector<TeamStatus> Engine::teams(int64_t now_ms) const {
  std::vector<TeamStatus> out;
  for (const auto& [name, team] : policy_.teams) {
    TeamStatus status;
    status.name = name;
    status.base = team.base;
    status.burst = team.burst;
    status.limit_now = team.limit_at(now_ms);
    status.in_burst_window = team.in_burst_window(now_ms);
    status.in_use = team_units(name, now_ms);
    for (const auto& [id, lease] : leases_) {
      if (lease.req.team != name) continue;
      if (lease.state == LeaseState::kGranted || lease.state == LeaseState::kRevoking) ++status.leases_active;
      if (lease.state == LeaseState::kQueued) ++status.queued;
      if (lease.state == LeaseState::kPendingApproval) ++status.pending_approval;
    }
    out.push_back(status);
  }
  return out;
}

std::vector<std::string> Engine::check_invariants(int64_t now_ms) const {
  std::vector<std::string> errors;
  const size_t gpu_count = policy_.gpus.size();
  std::vector<double> used(gpu_count, 0);
  std::vector<int> count(gpu_count, 0), whole(gpu_count, 0);
  std::vector<bool> non_critical(gpu_count, false);
  std::vector<const Lease*> owner(gpu_count, nullptr);  // one team (or the emergency pool) per GPU
  size_t queued = 0;
  for (const auto& [id, lease] : leases_) {
    if (lease.state == LeaseState::kQueued) {
      ++queued;
      if (queue_position(id) == 0) errors.push_back("queued lease " + std::to_string(id) + " is not in the queue");
    }
    if (lease.extra_gpus < 0 || (lease.extra_gpus > 0 && lease.gpus > std::max(lease.req.max_gpus, 1))) {
      errors.push_back("lease " + std::to_string(id) + " holds " + std::to_string(lease.gpus) +
                       " GPUs, beyond its max_gpus " + std::to_string(lease.req.max_gpus));
    }
    if (!lease.holds_gpus(now_ms)) continue;
    const size_t want = lease.shared ? 1 : static_cast<size_t>(lease.gpus);
    if (lease.devices.size() != want) {
      errors.push_back("lease " + std::to_string(id) + " holds " + std::to_string(lease.devices.size()) +
                       " devices, wants " + std::to_string(want));
    }
    // a pinned lease sits where its trainer runs: on the pinned GPUs, or (a multi-pod job) on all of them
    if (const Pin pin = pin_of(lease.req); !pin.devices.empty()) {
      const std::set<int> pinned(pin.devices.begin(), pin.devices.end());
      const std::set<int> held(lease.devices.begin(), lease.devices.end());
      const bool spills = pin_spills(pin, guaranteed_gpus(lease));
      const bool sits = spills ? std::includes(held.begin(), held.end(), pinned.begin(), pinned.end())
                               : std::includes(pinned.begin(), pinned.end(), held.begin(), held.end());
      if (!sits) {
        errors.push_back("lease " + std::to_string(id) + " is pinned to " + pin.text + " but holds GPUs " +
                         (spills ? "without all of them" : "elsewhere"));
      }
    }
    std::set<int> seen;
    for (int device : lease.devices) {
      if (device < 0 || static_cast<size_t>(device) >= gpu_count) {
        errors.push_back("lease " + std::to_string(id) + " names device " + std::to_string(device));
        continue;
      }
      if (!seen.insert(device).second) errors.push_back("lease " + std::to_string(id) + " lists a device twice");
      const Lease*& first = owner[static_cast<size_t>(device)];
      if (first != nullptr && !same_owner(*first, lease)) {
        errors.push_back("gpu " + policy_.gpus[static_cast<size_t>(device)].id() + ": leases " +
                         std::to_string(first->id) + " and " + std::to_string(id) + " of different teams share it");
      }
      if (first == nullptr) first = &lease;
      used[static_cast<size_t>(device)] +=
          lease.shared ? lease.memory_gib : policy_.gpus[static_cast<size_t>(device)].memory_gib;
      count[static_cast<size_t>(device)] += 1;
      whole[static_cast<size_t>(device)] += lease.shared ? 0 : 1;
      if (lease.req.priority != Priority::kCritical) non_critical[static_cast<size_t>(device)] = true;
    }
  }
  for (size_t device = 0; device < gpu_count; ++device) {
    const auto& gpu = policy_.gpus[device];
    if (used[device] > gpu.memory_gib + kEps) {
      errors.push_back("gpu " + gpu.id() + ": leases hold " + fixed_text(used[device]) + " GiB of " +
                       fixed_text(gpu.memory_gib));
    }
    if (whole[device] > 0 && count[device] > 1) errors.push_back("gpu " + gpu.id() + ": a whole-GPU lease shares it");
    if (count[device] > policy_.max_leases_per_gpu) errors.push_back("gpu " + gpu.id() + ": too many shared leases");
  }
  if (queued != queue_.size()) {
    errors.push_back("the queue lists " + std::to_string(queue_.size()) + " requests, " + std::to_string(queued) +
                     " are queued");
  }
  const long busy = std::count(non_critical.begin(), non_critical.end(), true);
  if (busy > policy_.total_gpus() - policy_.emergency_pool_gpus()) {
    errors.push_back("non-critical leases hold " + std::to_string(busy) + " GPUs, eating into the emergency pool");
  }
  check_ledger(errors);
  return errors;
}

Changes Engine::take_changes() { return std::exchange(changes_, Changes{}); }

void Engine::restore(std::vector<Lease> leases, std::vector<Approval> approvals, std::vector<AuditEntry> audit,
                     std::map<std::pair<std::string, std::string>, double> usage, int64_t next_audit_seq,
                     int64_t restart_now_ms) {
  leases_.clear();
  approvals_.clear();
  idempotency_.clear();
  next_lease_ = 1;
  next_approval_ = 1;
  std::map<std::string, int> index_of;
  for (size_t i = 0; i < policy_.gpus.size(); ++i) index_of[policy_.gpus[i].id()] = static_cast<int>(i);
  for (auto& lease : leases) {
    next_lease_ = std::max(next_lease_, lease.id + 1);
    if (!lease.device_ids.empty()) {
      // devices are stored by name so an edited inventory (reordered nodes) keeps leases on their GPUs
      std::vector<int> mapped;
      for (const auto& name : lease.device_ids) {
        auto it = index_of.find(name);
        if (it != index_of.end()) mapped.push_back(it->second);
      }
      lease.devices = mapped;
      lease.device_ids.clear();
    }
    if (restart_now_ms > 0) {
      if (lease.state == LeaseState::kGranted || lease.state == LeaseState::kRevoking ||
          lease.state == LeaseState::kQueued) {
        lease.last_seen_ms = std::max(lease.last_seen_ms, restart_now_ms);
      }
      if (lease.state == LeaseState::kRevoking) {
        lease.deadline_ms = std::max(lease.deadline_ms, restart_now_ms + static_cast<int64_t>(policy_.ttl_s) * 1000);
      }
    }
    if (!lease.req.idempotency_key.empty()) idempotency_[{lease.req.user, lease.req.idempotency_key}] = lease.id;
    leases_[lease.id] = std::move(lease);
  }
  for (auto& approval : approvals) {
    next_approval_ = std::max(next_approval_, approval.id + 1);
    approvals_[approval.id] = std::move(approval);
  }
  audit_ = std::move(audit);
  usage_ = std::move(usage);
  next_audit_seq_ = std::max<int64_t>(next_audit_seq, audit_.empty() ? 1 : audit_.back().seq + 1);
  changes_ = Changes{};
  // the decayed usage is not stored: it is derived again from the monthly ledger, each month's GPU-hours placed
  // in the middle of the time the month has had (an approximation of when they were used)
  fair_usage_.clear();
  int64_t latest = restart_now_ms;
  for (const auto& [id, lease] : leases_) latest = std::max({latest, lease.charged_until_ms, lease.ended_ms});
  for (const auto& [key, hours] : usage_) {
    const auto user_it = policy_.users.find(key.first);
    const std::optional<MonthSpan> month = month_span(key.second);
    if (user_it == policy_.users.end() || !month || !(hours > 0)) continue;
    const int64_t start = month->start_ms;
    const int64_t end = std::max(start, std::min(month->end_ms, latest));
    Lease owner;
    owner.req.user = key.first;
    owner.req.team = user_it->second.team;
    add_fair_usage(owner, hours, start + (end - start) / 2);
  }
  order_queue(latest);
}

void Engine::reserve_ids(int64_t next_lease_id, int64_t next_approval_id) {
  next_lease_ = std::max(next_lease_, next_lease_id);
  next_approval_ = std::max(next_approval_, next_approval_id);
}

void Engine::prune(int64_t now_ms, int64_t keep_ms) {
  for (auto it = leases_.begin(); it != leases_.end();) {
    const Lease& lease = it->second;
    // an emergency lease stays until an admin has reviewed it, however long ago it ended
    if (is_terminal(lease.state) && !lease.holds_gpus(now_ms) && lease.ended_ms < now_ms - keep_ms &&
        !lease.review_pending) {
      if (!lease.req.idempotency_key.empty()) idempotency_.erase({lease.req.user, lease.req.idempotency_key});
      it = leases_.erase(it);
    } else {
      ++it;
    }
  }
  constexpr size_t kAuditInMemory = 10000;
  if (audit_.size() > kAuditInMemory) audit_.erase(audit_.begin(), audit_.end() - static_cast<long>(kAuditInMemory));
}

}  // namespace yolo8::quota
