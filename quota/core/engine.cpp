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

void merge_telemetry(Telemetry& into, const Telemetry& from) {
  if (from.step >= 0) into.step = from.step;
  if (from.epoch >= 0) into.epoch = from.epoch;
  if (from.gpu_util >= 0) into.gpu_util = from.gpu_util;
  if (!from.gpu_util_source.empty()) into.gpu_util_source = from.gpu_util_source;
  if (from.device_memory_used_gib >= 0) into.device_memory_used_gib = from.device_memory_used_gib;
  if (from.process_memory_used_gib >= 0) into.process_memory_used_gib = from.process_memory_used_gib;
  if (from.memory_used_gib >= 0) into.memory_used_gib = from.memory_used_gib;
  if (from.last_checkpoint_ms > 0) into.last_checkpoint_ms = from.last_checkpoint_ms;
  merge_memory_context(into, from);
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

AuditLog::AuditLog(std::vector<AuditEntry> entries) {
  for (AuditEntry& entry : entries) push_back(std::move(entry));
}

void AuditLog::push_back(AuditEntry entry) {
  tail_.push_back(std::move(entry));
  ++size_;
  if (tail_.size() < kBlock) return;
  blocks_.push_back(std::make_shared<const std::vector<AuditEntry>>(std::move(tail_)));
  tail_ = {};
}

void AuditLog::keep_last(size_t count) {
  if (size_ <= count) return;
  skip_ += size_ - count;
  size_ = count;
  size_t whole = std::min(skip_ / kBlock, blocks_.size());
  blocks_.erase(blocks_.begin(), blocks_.begin() + static_cast<long>(whole));
  skip_ -= whole * kBlock;
  if (blocks_.empty() && skip_ > 0) {
    tail_.erase(tail_.begin(), tail_.begin() + static_cast<long>(skip_));
    skip_ = 0;
  }
}

const AuditEntry& AuditLog::operator[](size_t index) const {
  const size_t at = index + skip_;
  const size_t in_blocks = blocks_.size() * kBlock;
  return at < in_blocks ? (*blocks_[at / kBlock])[at % kBlock] : tail_[at - in_blocks];
}

Engine::Engine(Policy policy) : policy_(std::move(policy)), inventory_(policy_) { policy_.validate(); }

void Engine::replace_policy(Policy policy) {
  policy.validate();
  if (const std::string refusal = reload_refusal(policy_, policy); !refusal.empty()) throw PolicyError(refusal);
  for (const auto& [id, lease] : state_.leases) {
    if (is_terminal(lease.state)) continue;
    if (!policy.teams.count(lease.req.team)) {
      throw PolicyError("teams." + lease.req.team + ": removed, but lease " + std::to_string(id) +
                        " of the team is live; remove the team once its leases have ended");
    }
  }
  policy_ = std::move(policy);
  inventory_ = Inventory(policy_);
}

Engine::Pin Engine::pin_of(const LeaseRequest& req) const { return quota::pin_of(policy_, inventory_, req); }

bool Engine::pin_spills(const Pin& pin, int lease_gpus) { return quota::pin_spills(pin, lease_gpus); }

ClusterState Engine::cluster_state(int64_t now_ms) const {
  return ClusterState{policy_, inventory_, state_.leases, state_.fair_usage, now_ms};
}

std::string Engine::pin_refusal(const LeaseRequest& req) const {
  if (!req.node.empty() && !inventory_.node_devices.count(req.node)) {
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
    const std::vector<int>& on_node = inventory_.node_devices.at(req.node);
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
    for (int device : inventory_.node_devices.at(req.node))
      listed = listed || !policy_.gpus[static_cast<size_t>(device)].uuid.empty();
  }
  if (!listed) return "";
  for (const auto& uuid : req.visible_devices) {
    auto it = inventory_.uuid_index.find(lower_case(uuid));
    if (it == inventory_.uuid_index.end()) {
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

int Engine::guaranteed_gpus(const Lease& lease) const { return quota::guaranteed_gpus(policy_, lease); }

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
  entry.seq = state_.next_audit_seq++;
  entry.ts_ms = now_ms;
  entry.actor = actor;
  entry.action = action;
  if (lease != nullptr) {
    entry.lease_id = lease->id;
    entry.team = lease->req.team;
  }
  entry.detail = detail;
  state_.audit.push_back(entry);
  state_.changes.audit.push_back(entry);
}

const Lease* Engine::find(int64_t lease_id) const {
  auto it = state_.leases.find(lease_id);
  return it == state_.leases.end() ? nullptr : &it->second;
}

const Approval* Engine::find_approval(int64_t approval_id) const {
  auto it = state_.approvals.find(approval_id);
  return it == state_.approvals.end() ? nullptr : &it->second;
}

double Engine::team_units(const std::string& team, int64_t now_ms) const {
  return quota::team_units(cluster_state(now_ms), team);
}

void Engine::set_queue(const std::vector<QueueEntry>& order) {
  state_.queue.clear();
  state_.queue_index.clear();
  for (const QueueEntry& entry : order) {
    state_.queue_index[entry.lease_id] = static_cast<int>(state_.queue.size());
    state_.queue.push_back(entry.lease_id);
  }
}

void Engine::order_queue(int64_t now_ms) { set_queue(quota::order_queue(cluster_state(now_ms))); }

int Engine::queue_position(int64_t lease_id) const {
  auto it = state_.queue_index.find(lease_id);
  return it == state_.queue_index.end() ? 0 : it->second + 1;
}

FairShare Engine::fair_share(const std::string& team, const std::string& user, int64_t now_ms) const {
  return quota::fair_share(cluster_state(now_ms), team, user);
}

void Engine::schedule(int64_t now_ms) {
  const Decision decision = quota::schedule(cluster_state(now_ms));
  for (const Decision::Step& step : decision.steps) {
    apply_step(state_.leases, step, policy_, now_ms);
    const Lease& lease = state_.leases.at(step.lease_id);
    state_.changes.leases.insert(lease.id);
    if (step.kind == Decision::Step::Kind::kGrant) {
      const std::string devs = describe_devices(lease);
      const int extra = lease.extra_gpus;
      if (lease.emergency) {
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
    }
    for (int64_t victim_id : step.preemption.victims) {
      const Lease& victim = state_.leases.at(victim_id);
      state_.changes.leases.insert(victim.id);
      log(now_ms, "quotad", "preempt.revoke", &victim,
          "revoking for lease " + std::to_string(lease.id) + "; checkpoint and release within " +
              std::to_string(policy_.preempt_grace_s) + " s" + (victim.over_base ? " (over base)" : ""));
    }
  }
  set_queue(decision.queue);
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
  const ClusterState state = cluster_state(now_ms);
  const Ask ask = ask_of(state, lease);
  const double used = quota::team_units(state, lease.req.team);
  const auto placement = place(state, ask, lease.id);
  const double added = placement ? added_gpus(state, ask, lease.id, *placement) : (lease.shared ? 1.0 : lease.gpus);
  if (lease.req.priority != Priority::kCritical && used + added > team.limit_at(now_ms) + kEps) {
    return "team " + team.name + " uses " + fixed_text(used) + " of the " + fixed_text(team.limit_at(now_ms)) +
           " GPUs allowed now (base " + fixed_text(team.base) + ", burst " + fixed_text(team.burst) +
           (team.in_burst_window(now_ms) ? ", inside a burst window)" : " only inside burst windows)") +
           fair_share_text(lease, now_ms);
  }
  std::string reason = lease.req.priority != Priority::kCritical
                           ? user_cap_reason(state, ask, lease.id, placement ? &*placement : nullptr)
                           : "";
  if (reason.empty()) {
    reason = "no free GPU fits " +
             (lease.shared ? fixed_text(lease.memory_gib) + " GiB (shared, plus " +
                                 fixed_text(policy_.shared_overhead_gib(), 2) + " GiB per-process overhead)"
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
    auto it = state_.idempotency.find({req_in.user, req_in.idempotency_key});
    if (it != state_.idempotency.end() && state_.leases.count(it->second)) {
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
  std::string memory_row = policy_.memory_table.describe_row(req.model);
  // a shared lease is placed by its share plus the per-process overhead: the answer says which figure was used
  if (lease.shared && !memory_row.empty()) {
    memory_row += "; a shared GPU also holds " + policy_.describe_shared_overhead() + " beyond the share";
  }
  const Pin pin = pin_of(req);
  // the memory a pinned whole-GPU lease can get: the largest pinned GPU, or the smallest when it takes them all
  double pinned_gib = pin.devices.empty() ? policy_.max_gpu_memory_gib() : 0;
  for (int device : pin.devices) {
    const double gib = policy_.gpus[static_cast<size_t>(device)].memory_gib;
    pinned_gib = pinned_gib == 0               ? gib
                 : pin_spills(pin, lease.gpus) ? std::min(pinned_gib, gib)
                                               : std::max(pinned_gib, gib);
  }
  // a share that does not fit any GPU it may go on once the overhead is added would wait forever: refused now
  if (const double room = pinned_gib - policy_.shared_overhead_gib(); lease.shared && lease.memory_gib > room + kEps) {
    return refuse(AcquireResult::Kind::kAdmissionRefused,
                  "memory_gib: a shared lease of " + fixed_text(lease.memory_gib) + " GiB plus " +
                      policy_.describe_shared_overhead() + " does not fit the " + fixed_text(pinned_gib) +
                      " GiB of the largest GPU" + (pin.devices.empty() ? "" : " of " + pin.text) +
                      "; ask for at most " + fixed_text(std::max(0.0, std::floor(room * 100) / 100), 2) +
                      " GiB, or a whole GPU");
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
  // the privileged channel is sized by policy: a member's emergency may take the pool's worth of GPUs (and revoke
  // that many), not the cluster; an admin asking (or acting for the member) is the approval for more
  if (const int asked = std::max(lease.gpus, req.max_gpus); critical && asked > policy_.critical_gpus_cap()) {
    const auto by = policy_.users.find(requester(req));
    if (by == policy_.users.end() || by->second.role != Role::kAdmin) {
      return refuse(AcquireResult::Kind::kNotAllowed,
                    "gpus: a critical request by " + requester(req) + " may take at most " +
                        std::to_string(policy_.critical_gpus_cap()) + " GPUs (emergency.max_gpus_per_request), " +
                        std::to_string(asked) + " asked; more needs an admin to make the request");
    }
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
  const auto waiting = std::count_if(state_.leases.begin(), state_.leases.end(), [&](const auto& entry) {
    return entry.second.req.user == req.user &&
           (entry.second.state == LeaseState::kQueued || entry.second.state == LeaseState::kPendingApproval);
  });
  if (waiting >= policy_.max_queued_per_user) {
    return refuse(AcquireResult::Kind::kTooManyQueued,
                  "queue: " + req.user + " already has " + std::to_string(waiting) +
                      " requests waiting (limits.max_queued_per_user); release or wait for some first");
  }
  lease.id = state_.next_lease++;
  lease.created_ms = now_ms;
  lease.last_seen_ms = now_ms;
  if (needs_approval) {
    Approval approval;
    approval.id = state_.next_approval++;
    approval.lease_id = lease.id;
    approval.team = req.team;
    approval.user = req.user;
    approval.model = req.model;
    approval.justification = req.justification;
    approval.created_ms = now_ms;
    state_.approvals[approval.id] = approval;
    state_.changes.approvals.insert(approval.id);
    lease.approval_id = approval.id;
    lease.state = LeaseState::kPendingApproval;
  } else {
    lease.state = LeaseState::kQueued;
  }
  auto& stored = state_.leases[lease.id] = lease;
  state_.changes.leases.insert(lease.id);
  if (!req.idempotency_key.empty()) state_.idempotency[{req.user, req.idempotency_key}] = lease.id;
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
  auto it = state_.leases.find(lease_id);
  if (it == state_.leases.end()) return result;
  Lease& lease = it->second;
  result.found = true;
  result.state = lease.state;
  if (is_terminal(lease.state)) {
    result.reason = lease.reason;
    return result;
  }
  seen(lease, now_ms);
  if (lease.state == LeaseState::kQueued) {
    result.position = queue_position(lease_id);
    result.reason = queue_reason(lease, now_ms);
    return result;
  }
  state_.changes.leases.insert(lease_id);  // the row keeps its last heartbeat (local mode reloads it at every call)
  merge_telemetry(lease.telemetry, telemetry);
  result.deadline_ms = lease.deadline_ms;
  result.reason = lease.reason;
  return result;
}

ReattachResult Engine::reattach(const LeaseReceipt& receipt, const std::string& key, const std::string& caller,
                                bool recorded, int64_t now_ms) {
  ReattachResult result;
  auto refuse = [&](ReattachResult::Kind kind, const std::string& why) {
    result.kind = kind;
    result.reason = why;
    return result;
  };
  const std::string id = std::to_string(receipt.lease_id);
  if (!receipt_verifies(receipt, key)) {
    return refuse(ReattachResult::Kind::kBadSignature, "receipt: the signature does not match lease " + id +
                                                           "'s facts (altered, forged, or signed by another database)");
  }
  if (caller != receipt.user) {
    return refuse(ReattachResult::Kind::kWrongUser,
                  "user: lease " + id + " was granted to " + receipt.user + ", not to " + caller);
  }
  if (const Lease* held = find(receipt.lease_id)) {
    return refuse(ReattachResult::Kind::kHeld,
                  "lease " + id + " is known here (" + to_string(held->state) + "): nothing to re-attach");
  }
  if (recorded) {
    return refuse(ReattachResult::Kind::kHeld,
                  "lease " + id + " is recorded in the database (it ended): nothing to re-attach");
  }
  const int64_t epoch_first = state_.next_lease / kIdEpochSpan * kIdEpochSpan;
  if (receipt.lease_id <= 0 || receipt.lease_id >= epoch_first) {
    return refuse(ReattachResult::Kind::kCurrentEpoch,
                  "lease " + id + " belongs to the current id epoch (ids from " + std::to_string(epoch_first) +
                      "): it was not lost with a restore, so it cannot be re-attached");
  }
  const auto team_it = policy_.teams.find(receipt.team);
  const auto user_it = policy_.users.find(receipt.user);
  if (team_it == policy_.teams.end() || user_it == policy_.users.end()) {
    return refuse(ReattachResult::Kind::kNotAdmitted,
                  "policy: team " + receipt.team + " or user " + receipt.user + " is no longer in the policy");
  }
  Priority priority = Priority::kNormal;
  try {
    priority = parse_priority(receipt.priority);
  } catch (const PolicyError& error) {
    return refuse(ReattachResult::Kind::kNotAdmitted, std::string("receipt.priority: ") + error.what());
  }
  std::vector<int> devices;
  for (const std::string& name : receipt.devices) {
    auto gpu = std::find_if(policy_.gpus.begin(), policy_.gpus.end(), [&](const Gpu& g) { return g.id() == name; });
    if (gpu == policy_.gpus.end()) {
      return refuse(ReattachResult::Kind::kNotAdmitted, "devices: GPU " + name + " is no longer in the inventory");
    }
    devices.push_back(static_cast<int>(gpu - policy_.gpus.begin()));
  }
  if (devices.empty()) return refuse(ReattachResult::Kind::kNotAdmitted, "devices: the receipt names no GPU");
  for (const auto& [other_id, other] : state_.leases) {
    if (!other.holds_gpus(now_ms)) continue;
    for (const int device : devices) {
      if (std::find(other.devices.begin(), other.devices.end(), device) == other.devices.end()) continue;
      if (!receipt.shared || !other.shared) {
        return refuse(ReattachResult::Kind::kDevicesTaken,
                      "devices: GPU " + policy_.gpus[static_cast<size_t>(device)].id() + " is held by lease " +
                          std::to_string(other_id) + " (" + other.req.user + ", team " + other.req.team + ") now");
      }
    }
  }
  Lease lease;
  lease.id = receipt.lease_id;
  lease.req.team = receipt.team;
  lease.req.user = receipt.user;
  lease.req.job = receipt.job;
  lease.req.model = receipt.model;
  lease.req.priority = priority;
  lease.req.preemptible = receipt.preemptible;
  lease.req.shared = receipt.shared;
  lease.req.gpus = receipt.shared ? 1 : static_cast<int>(devices.size());
  lease.req.memory_gib = receipt.memory_gib;
  lease.state = LeaseState::kGranted;
  lease.gpus = static_cast<int>(devices.size());
  lease.shared = receipt.shared;
  lease.memory_gib = receipt.memory_gib;
  lease.devices = devices;
  lease.emergency = priority == Priority::kCritical;
  lease.created_ms = receipt.granted_ms;
  lease.granted_ms = std::min(receipt.granted_ms, now_ms);
  // billed from the grant: this database holds none of the lease's time (charged_until stays at the grant)
  lease.charged_until_ms = lease.granted_ms;
  lease.last_seen_ms = now_ms;
  const Team& team = team_it->second;
  const double used = team_units(receipt.team, now_ms);
  const double units = lease.units(policy_);
  if (priority != Priority::kCritical && used + units > team.limit_at(now_ms) + kEps) {
    return refuse(ReattachResult::Kind::kNotAdmitted,
                  "team " + team.name + " uses " + fixed_text(used) + " of the " + fixed_text(team.limit_at(now_ms)) +
                      " GPUs allowed now; lease " + id + " needs " + fixed_text(units, 2) + " more");
  }
  lease.over_base = priority != Priority::kCritical && used + units > team.base + kEps;
  // what the scheduler checks of a grant (shares within a GPU's memory, leases per GPU) on the state with it
  const std::vector<std::string> before = check_invariants(now_ms);
  state_.leases[lease.id] = lease;
  for (const std::string& error : check_invariants(now_ms)) {
    if (std::find(before.begin(), before.end(), error) != before.end()) continue;
    state_.leases.erase(lease.id);
    return refuse(ReattachResult::Kind::kDevicesTaken, "devices: " + error);
  }
  state_.changes.leases.insert(lease.id);
  const Lease& stored = state_.leases.at(lease.id);
  log(now_ms, caller, "lease.reattach", &stored,
      "re-admitted from its grant receipt (lost with a restore): job " + receipt.job + ", model " + receipt.model +
          ", " + describe_devices(stored) +
          (receipt.shared ? " (shared " + fixed_text(receipt.memory_gib) + " GiB)" : "") + ", priority " +
          receipt.priority + ", granted " + utc_text(receipt.granted_ms, "%Y-%m-%d %H:%M:%S UTC") + " under a ttl of " +
          std::to_string(receipt.ttl_s) + " s; billed from the grant (" +
          std::to_string(std::max<int64_t>(0, now_ms - lease.granted_ms) / 1000) + " s ago)");
  order_queue(now_ms);
  result.kind = ReattachResult::Kind::kReattached;
  return result;
}

void Engine::touch(int64_t lease_id, const Telemetry& telemetry, int64_t seen_ms) {
  auto it = state_.leases.find(lease_id);
  if (it == state_.leases.end() || is_terminal(it->second.state)) return;
  Lease& lease = it->second;
  if (seen_ms > lease.last_seen_ms) seen(lease, seen_ms);
  if (lease.state != LeaseState::kGranted && lease.state != LeaseState::kRevoking) return;
  merge_telemetry(lease.telemetry, telemetry);
}

void Engine::credit_outage(int64_t from_ms, int64_t to_ms) {
  const int64_t gap = to_ms - from_ms;
  if (gap <= 0) return;
  int extended = 0;
  for (auto& [id, lease] : state_.leases) {
    const bool running = lease.state == LeaseState::kGranted || lease.state == LeaseState::kRevoking;
    if (!running && lease.state != LeaseState::kQueued) continue;
    const int64_t clock = expiry_clock(lease);
    if (clock < to_ms) lease.heartbeat_clock_ms = std::min(to_ms, clock + gap);
    if (lease.state == LeaseState::kRevoking) lease.deadline_ms += gap;
    state_.changes.leases.insert(id);
    ++extended;
  }
  log(to_ms, "quotad", "quotad.outage", nullptr,
      "quotad did not serve for " + std::to_string(gap / 1000) + " s; heartbeat clocks and deadlines of " +
          std::to_string(extended) + " lease(s) extended by it");
}

void Engine::clock_stepped(int64_t step_ms, int64_t now_ms) {
  if (step_ms == 0) return;
  const int64_t before_ms = now_ms - step_ms;  // the time now as the clock read before the step
  auto moved = [&](int64_t t) { return t == 0 ? 0 : std::min(now_ms, t + step_ms); };
  int count = 0;
  for (auto& [id, lease] : state_.leases) {
    const bool running = lease.state == LeaseState::kGranted || lease.state == LeaseState::kRevoking;
    const bool waiting = lease.state == LeaseState::kQueued || lease.state == LeaseState::kPendingApproval;
    const bool draining = lease.holds_gpus(before_ms) && !running;  // expired, its GPUs not returned yet
    if (!running && !waiting && !draining) {
      // expired, its GPUs returned before the step (another lease may hold them now): a step back must not hand
      // them to it again
      if (lease.holds_gpus(now_ms)) {
        lease.free_at_ms = now_ms;
        state_.changes.leases.insert(id);
      }
      continue;
    }
    if (draining) {
      lease.free_at_ms += step_ms;
    } else {
      lease.last_seen_ms = moved(lease.last_seen_ms);
      lease.heartbeat_clock_ms = moved(lease.heartbeat_clock_ms);
    }
    if (running) {
      lease.granted_ms = moved(lease.granted_ms);
      lease.charged_until_ms = moved(lease.charged_until_ms);
      if (lease.state == LeaseState::kRevoking) lease.deadline_ms += step_ms;
    }
    state_.changes.leases.insert(id);
    ++count;
  }
  for (auto& [key, decayed] : state_.fair_usage) decayed.as_of_ms = moved(decayed.as_of_ms);
  log(now_ms, "quotad", "clock.step", nullptr,
      "the wall clock stepped by " + std::to_string(step_ms / 1000) + " s against the monotonic clock; the clocks of " +
          std::to_string(count) + " live lease(s) moved with it");
}

std::string Engine::waiting_reason(int64_t lease_id, int64_t now_ms) const {
  const Lease* lease = find(lease_id);
  return lease != nullptr && lease->state == LeaseState::kQueued ? queue_reason(*lease, now_ms) : "";
}

int64_t Engine::expiry_clock(const Lease& lease) { return std::max(lease.last_seen_ms, lease.heartbeat_clock_ms); }

int64_t Engine::billable_until(const Lease& lease, int64_t until_ms) const {
  return std::min(until_ms, std::max(lease.last_seen_ms, lease.granted_ms) +
                                static_cast<int64_t>(policy_.heartbeat_interval_s) * 1000);
}

void Engine::seen(Lease& lease, int64_t seen_ms) {
  const bool running = lease.state == LeaseState::kGranted || lease.state == LeaseState::kRevoking;
  if (running && seen_ms > expiry_clock(lease) + static_cast<int64_t>(policy_.ttl_s) * 1000) {
    charge(lease, seen_ms);
    lease.charged_until_ms = std::max(lease.charged_until_ms, seen_ms);
    state_.changes.leases.insert(lease.id);
  }
  lease.last_seen_ms = seen_ms;
}

void Engine::charge(Lease& lease, int64_t until_ms) {
  if (lease.granted_ms == 0) return;
  const int64_t from = std::max(lease.charged_until_ms, lease.granted_ms);
  const int64_t billed_until = billable_until(lease, until_ms);
  if (billed_until <= from) return;
  const double hours = static_cast<double>(billed_until - from) / 3.6e6 * lease.units(policy_);
  const auto key = std::make_pair(lease.req.user, month_key(until_ms));
  state_.usage[key] += hours;
  lease.gpu_hours += hours;
  lease.charged_until_ms = billed_until;
  add_fair_usage(policy_, state_.fair_usage, lease.req.team, lease.req.user, hours, until_ms);
  state_.changes.usage.insert(key);
  state_.changes.leases.insert(lease.id);
}

double Engine::used_gpu_hours(const std::string& user, const std::string& month, int64_t now_ms) const {
  auto it = state_.usage.find({user, month});
  double used = it == state_.usage.end() ? 0 : it->second;
  if (month == month_key(now_ms)) {
    for (const auto& [id, lease] : state_.leases) {
      if (lease.req.user == user && (lease.state == LeaseState::kGranted || lease.state == LeaseState::kRevoking)) {
        const int64_t from = std::max(lease.charged_until_ms, lease.granted_ms);
        used += static_cast<double>(std::max<int64_t>(0, billable_until(lease, now_ms) - from)) / 3.6e6 *
                lease.units(policy_);
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
  state_.changes.leases.insert(lease.id);
  // a cancelled waiter no longer needs its victims
  for (int64_t victim_id : lease.waiting_on) {
    auto it = state_.leases.find(victim_id);
    if (it != state_.leases.end() && it->second.state == LeaseState::kRevoking &&
        it->second.preempted_for == lease.id) {
      it->second.state = LeaseState::kGranted;
      it->second.deadline_ms = 0;
      it->second.preempted_for = 0;
      it->second.reason.clear();
      state_.changes.leases.insert(victim_id);
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
  auto it = state_.leases.find(lease_id);
  if (it == state_.leases.end() || is_terminal(it->second.state)) return false;
  Lease& lease = it->second;
  if (lease.state == LeaseState::kQueued || lease.state == LeaseState::kPendingApproval) outcome = Outcome::kCancelled;
  if (outcome == Outcome::kNone) outcome = Outcome::kCompleted;
  if (lease.state == LeaseState::kPendingApproval) {
    auto approval_it = state_.approvals.find(lease.approval_id);
    if (approval_it != state_.approvals.end() && approval_it->second.state == ApprovalState::kPending) {
      approval_it->second.state = ApprovalState::kCancelled;
      approval_it->second.decided_ms = now_ms;
      state_.changes.approvals.insert(approval_it->first);
    }
  }
  end_lease(lease, LeaseState::kReleased, outcome, now_ms, now_ms, "", actor);
  schedule(now_ms);
  return true;
}

void Engine::approve(int64_t approval_id, const std::string& by, int64_t now_ms, const std::string& note) {
  auto it = state_.approvals.find(approval_id);
  if (it == state_.approvals.end()) throw PolicyError("approval " + std::to_string(approval_id) + ": unknown");
  Approval& approval = it->second;
  if (approval.state != ApprovalState::kPending) {
    throw PolicyError("approval " + std::to_string(approval_id) + ": already " + to_string(approval.state));
  }
  approval.state = ApprovalState::kApproved;
  approval.decided_by = by;
  approval.decided_ms = now_ms;
  approval.note = note;
  state_.changes.approvals.insert(approval.id);
  Lease& lease = state_.leases.at(approval.lease_id);
  lease.state = LeaseState::kQueued;
  lease.last_seen_ms = now_ms;
  state_.changes.leases.insert(lease.id);
  log(now_ms, by, "approval.approved", &lease,
      "approval " + std::to_string(approval.id) + (note.empty() ? "" : ": " + note));
  schedule(now_ms);
}

void Engine::reject(int64_t approval_id, const std::string& by, int64_t now_ms, const std::string& note) {
  auto it = state_.approvals.find(approval_id);
  if (it == state_.approvals.end()) throw PolicyError("approval " + std::to_string(approval_id) + ": unknown");
  Approval& approval = it->second;
  if (approval.state != ApprovalState::kPending) {
    throw PolicyError("approval " + std::to_string(approval_id) + ": already " + to_string(approval.state));
  }
  approval.state = ApprovalState::kRejected;
  approval.decided_by = by;
  approval.decided_ms = now_ms;
  approval.note = note;
  state_.changes.approvals.insert(approval.id);
  Lease& lease = state_.leases.at(approval.lease_id);
  lease.state = LeaseState::kRejected;
  lease.ended_ms = now_ms;
  lease.reason = "rejected by " + by + (note.empty() ? "" : ": " + note);
  state_.changes.leases.insert(lease.id);
  log(now_ms, by, "approval.rejected", &lease,
      "approval " + std::to_string(approval.id) + (note.empty() ? "" : ": " + note));
}

void Engine::review_emergency(int64_t lease_id, const std::string& by, int64_t now_ms, const std::string& note) {
  auto it = state_.leases.find(lease_id);
  if (it == state_.leases.end() || !it->second.review_pending) {
    throw PolicyError("lease " + std::to_string(lease_id) + ": no emergency review pending");
  }
  it->second.review_pending = false;
  state_.changes.leases.insert(lease_id);
  log(now_ms, by, "emergency.reviewed", &it->second, note.empty() ? "reviewed" : note);
}

void Engine::tick(int64_t now_ms) {
  const int64_t ttl = static_cast<int64_t>(policy_.ttl_s) * 1000;
  const int64_t grace = static_cast<int64_t>(policy_.expiry_grace_s) * 1000;
  for (auto& [id, lease] : state_.leases) {
    if (lease.state == LeaseState::kRevoking && now_ms >= lease.deadline_ms) {
      end_lease(lease, LeaseState::kExpired, Outcome::kPreempted, now_ms, now_ms,
                "did not release by the preemption deadline", "quotad");
    } else if ((lease.state == LeaseState::kGranted || lease.state == LeaseState::kRevoking) &&
               now_ms - expiry_clock(lease) > ttl) {
      const int64_t end = expiry_clock(lease) + ttl;
      end_lease(lease, LeaseState::kExpired, Outcome::kNone, end, end + grace,
                "no heartbeat for " + std::to_string(policy_.ttl_s) + " s", "quotad");
    } else if (lease.state == LeaseState::kGranted || lease.state == LeaseState::kRevoking) {
      if (now_ms - std::max(lease.charged_until_ms, lease.granted_ms) >= kAccrueEveryMs) charge(lease, now_ms);
    } else if (lease.state == LeaseState::kQueued && now_ms - expiry_clock(lease) > ttl) {
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
    for (const auto& [id, lease] : state_.leases) {
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
  for (const auto& [id, lease] : state_.leases) {
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
      used[static_cast<size_t>(device)] += lease.shared ? lease.memory_gib + policy_.shared_overhead_gib()
                                                        : policy_.gpus[static_cast<size_t>(device)].memory_gib;
      count[static_cast<size_t>(device)] += 1;
      whole[static_cast<size_t>(device)] += lease.shared ? 0 : 1;
      if (lease.req.priority != Priority::kCritical) non_critical[static_cast<size_t>(device)] = true;
    }
  }
  for (size_t device = 0; device < gpu_count; ++device) {
    const auto& gpu = policy_.gpus[device];
    if (used[device] > gpu.memory_gib + kEps) {
      errors.push_back("gpu " + gpu.id() + ": leases hold " + fixed_text(used[device]) + " GiB of " +
                       fixed_text(gpu.memory_gib) + " (shared leases counted with their per-process overhead)");
    }
    if (whole[device] > 0 && count[device] > 1) errors.push_back("gpu " + gpu.id() + ": a whole-GPU lease shares it");
    if (count[device] > policy_.max_leases_per_gpu) errors.push_back("gpu " + gpu.id() + ": too many shared leases");
  }
  if (queued != state_.queue.size()) {
    errors.push_back("the queue lists " + std::to_string(state_.queue.size()) + " requests, " + std::to_string(queued) +
                     " are queued");
  }
  const long busy = std::count(non_critical.begin(), non_critical.end(), true);
  if (busy > policy_.total_gpus() - policy_.emergency_pool_gpus()) {
    errors.push_back("non-critical leases hold " + std::to_string(busy) + " GPUs, eating into the emergency pool");
  }
  check_ledger(errors);
  return errors;
}

Changes Engine::take_changes() { return std::exchange(state_.changes, Changes{}); }

void Engine::restore(std::vector<Lease> leases, std::vector<Approval> approvals, std::vector<AuditEntry> audit,
                     std::map<std::pair<std::string, std::string>, double> usage, int64_t next_audit_seq,
                     int64_t restart_now_ms) {
  state_.leases.clear();
  state_.approvals.clear();
  state_.idempotency.clear();
  state_.next_lease = 1;
  state_.next_approval = 1;
  std::map<std::string, int> index_of;
  for (size_t i = 0; i < policy_.gpus.size(); ++i) index_of[policy_.gpus[i].id()] = static_cast<int>(i);
  std::map<int64_t, std::vector<std::string>> missing;
  for (auto& lease : leases) {
    state_.next_lease = std::max(state_.next_lease, lease.id + 1);
    if (!lease.device_ids.empty()) {
      // devices are stored by name so an edited inventory (reordered nodes) keeps leases on their GPUs
      std::vector<int> mapped;
      for (const auto& name : lease.device_ids) {
        auto it = index_of.find(name);
        if (it != index_of.end()) {
          mapped.push_back(it->second);
        } else {
          missing[lease.id].push_back(name);
        }
      }
      lease.devices = mapped;
      lease.device_ids.clear();
    }
    if (restart_now_ms > 0) {
      if (lease.state == LeaseState::kGranted || lease.state == LeaseState::kRevoking ||
          lease.state == LeaseState::kQueued) {
        lease.heartbeat_clock_ms = std::max(lease.heartbeat_clock_ms, restart_now_ms);
      }
      if (lease.state == LeaseState::kRevoking) {
        lease.deadline_ms = std::max(lease.deadline_ms, restart_now_ms + static_cast<int64_t>(policy_.ttl_s) * 1000);
      }
    }
    if (!lease.req.idempotency_key.empty()) state_.idempotency[{lease.req.user, lease.req.idempotency_key}] = lease.id;
    state_.leases[lease.id] = std::move(lease);
  }
  for (auto& approval : approvals) {
    state_.next_approval = std::max(state_.next_approval, approval.id + 1);
    state_.approvals[approval.id] = std::move(approval);
  }
  state_.audit = AuditLog(std::move(audit));
  state_.usage = std::move(usage);
  state_.next_audit_seq = std::max<int64_t>(next_audit_seq, state_.audit.empty() ? 1 : state_.audit.back().seq + 1);
  state_.changes = Changes{};
  // the decayed usage is not stored: it is derived again from the monthly ledger, each month's GPU-hours placed
  // in the middle of the time the month has had (an approximation of when they were used)
  state_.fair_usage.clear();
  int64_t latest = restart_now_ms;
  for (const auto& [id, lease] : state_.leases) latest = std::max({latest, lease.charged_until_ms, lease.ended_ms});
  check_loaded(latest, std::move(missing));
  for (const auto& [key, hours] : state_.usage) {
    const auto user_it = policy_.users.find(key.first);
    const std::optional<MonthSpan> month = month_span(key.second);
    if (user_it == policy_.users.end() || !month || !(hours > 0)) continue;
    const int64_t start = month->start_ms;
    const int64_t end = std::max(start, std::min(month->end_ms, latest));
    add_fair_usage(policy_, state_.fair_usage, user_it->second.team, key.first, hours, start + (end - start) / 2);
  }
  order_queue(latest);
}

void Engine::check_loaded(int64_t now_ms, std::map<int64_t, std::vector<std::string>> missing) {
  // rows of an older quotad kept only indices: one beyond the inventory is a GPU it no longer has
  for (auto& [id, lease] : state_.leases) {
    auto beyond = std::remove_if(lease.devices.begin(), lease.devices.end(), [&](int device) {
      if (device >= 0 && static_cast<size_t>(device) < policy_.gpus.size()) return false;
      missing[id].push_back("gpu index " + std::to_string(device));
      return true;
    });
    lease.devices.erase(beyond, lease.devices.end());
  }
  std::vector<const Lease*> holder(policy_.gpus.size(), nullptr);  // the first loaded lease on each GPU
  auto conflict = [&](const Lease& lease) -> std::string {
    for (int device : lease.devices) {
      const Lease* first = holder[static_cast<size_t>(device)];
      if (first != nullptr && (!first->shared || !lease.shared || !same_owner(*first, lease))) {
        return "gpu " + policy_.gpus[static_cast<size_t>(device)].id() + " is already held by lease " +
               std::to_string(first->id);
      }
    }
    return "";
  };
  auto hold = [&](const Lease& lease) {
    for (int device : lease.devices) {
      if (holder[static_cast<size_t>(device)] == nullptr) holder[static_cast<size_t>(device)] = &lease;
    }
  };
  std::vector<int64_t> orphans;
  for (auto it = state_.leases.begin(); it != state_.leases.end();) {
    Lease& lease = it->second;
    const bool holds = lease.holds_gpus(now_ms);
    const size_t want = lease.shared ? 1 : static_cast<size_t>(std::max(lease.gpus, 0));
    std::string why;
    if (lease.gpus < 1 || lease.gpus > policy_.total_gpus()) {
      why = "gpus " + std::to_string(lease.gpus) + " is outside 1.." + std::to_string(policy_.total_gpus()) +
            " (the inventory)";
    } else if (holds && missing.count(lease.id) > 0) {
      orphans.push_back(lease.id);  // after every sound lease has claimed its GPUs
      ++it;
      continue;
    } else if (holds && lease.devices.size() != want) {
      why = "holds " + std::to_string(lease.devices.size()) + " GPUs for gpus " + std::to_string(lease.gpus);
    } else if (holds) {
      why = conflict(lease);
    }
    if (why.empty()) {
      if (holds) hold(lease);
      ++it;
      continue;
    }
    log(now_ms, "quotad", "lease.quarantined", &lease,
        "lease row " + std::to_string(lease.id) + " (" + to_string(lease.state) + ") breaks an invariant: " + why +
            "; moved to the quarantine table");
    state_.changes.quarantined[lease.id] = Changes::Quarantined{why, now_ms};
    if (!lease.req.idempotency_key.empty()) state_.idempotency.erase({lease.req.user, lease.req.idempotency_key});
    it = state_.leases.erase(it);
  }
  for (int64_t id : orphans) {
    Lease& lease = state_.leases.at(id);
    const std::vector<std::string>& gone = missing.at(id);
    std::set<std::string> nodes;
    for (const auto& name : gone) {
      if (const size_t colon = name.rfind(':'); colon != std::string::npos) nodes.insert(name.substr(0, colon));
    }
    std::string gone_text, nodes_text;
    for (const auto& name : gone) gone_text += (gone_text.empty() ? "" : ",") + name;
    for (const auto& node : nodes) nodes_text += (nodes_text.empty() ? "" : ",") + node;
    nodes_text = nodes_text.empty() ? "its node" : "node " + nodes_text;
    // a renamed node: the UUIDs its trainer sees lead to the same GPUs under the new name, unless another lease
    // already holds them (then both would be granted the same physical GPUs)
    const Pin pin = pin_of(lease.req);
    const size_t want = lease.shared ? 1 : static_cast<size_t>(lease.gpus);
    Lease moved = lease;
    moved.devices = pin.devices;
    if (lease.state != LeaseState::kExpired && pin.by_uuid && pin.devices.size() == want && conflict(moved).empty()) {
      lease.devices = pin.devices;
      hold(lease);
      state_.changes.leases.insert(id);
      log(now_ms, "quotad", "lease.remapped", &lease,
          "GPUs " + gone_text + " are no longer in the inventory (" + nodes_text + " removed or renamed); " +
              "moved by the trainer's GPU UUIDs to " + describe_devices(lease));
      continue;
    }
    const std::string reason = "GPUs " + gone_text + " are no longer in the inventory (" + nodes_text +
                               " removed or renamed); the lease ended at load";
    lease.devices.clear();  // none of its GPUs is counted any more
    if (lease.state == LeaseState::kExpired) {
      lease.free_at_ms = now_ms;
      state_.changes.leases.insert(id);
      log(now_ms, "quotad", "lease.orphaned", &lease, reason);
    } else {
      end_lease(lease, LeaseState::kExpired, Outcome::kNone, now_ms, now_ms, reason, "quotad");
    }
  }
}

void Engine::reserve_ids(int64_t next_lease_id, int64_t next_approval_id) {
  state_.next_lease = std::max(state_.next_lease, next_lease_id);
  state_.next_approval = std::max(state_.next_approval, next_approval_id);
}

void Engine::prune(int64_t now_ms, int64_t keep_ms) {
  for (auto it = state_.leases.begin(); it != state_.leases.end();) {
    const Lease& lease = it->second;
    // an emergency lease stays until an admin has reviewed it, however long ago it ended
    if (is_terminal(lease.state) && !lease.holds_gpus(now_ms) && lease.ended_ms < now_ms - keep_ms &&
        !lease.review_pending) {
      if (!lease.req.idempotency_key.empty()) state_.idempotency.erase({lease.req.user, lease.req.idempotency_key});
      it = state_.leases.erase(it);
    } else {
      ++it;
    }
  }
  constexpr size_t kAuditInMemory = 10000;
  state_.audit.keep_last(kAuditInMemory);
}

}  // namespace yolo8::quota
