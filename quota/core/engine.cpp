#include "quota/core/engine.h"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <tuple>
#include <utility>

namespace yolo8::quota {

namespace {
constexpr double kEps = 1e-6;
constexpr int64_t kAccrueEveryMs = 60000;

std::string fmt(double v, int digits = 1) {
  std::ostringstream os;
  os.setf(std::ios::fixed);
  os.precision(digits);
  os << v;
  return os.str();
}
}  // namespace

std::string to_string(LeaseState s) {
  switch (s) {
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

LeaseState parse_lease_state(const std::string& s) {
  for (auto st : {LeaseState::kPendingApproval, LeaseState::kQueued, LeaseState::kGranted, LeaseState::kRevoking,
                  LeaseState::kReleased, LeaseState::kExpired, LeaseState::kRejected}) {
    if (to_string(st) == s) return st;
  }
  throw PolicyError("unknown lease state '" + s + "'");
}

std::string to_string(Outcome o) {
  switch (o) {
    case Outcome::kNone: return "";
    case Outcome::kCompleted: return "completed";
    case Outcome::kPreempted: return "preempted";
    case Outcome::kFailed: return "failed";
    case Outcome::kCancelled: return "cancelled";
  }
  return "";
}

Outcome parse_outcome(const std::string& s) {
  for (auto o : {Outcome::kNone, Outcome::kCompleted, Outcome::kPreempted, Outcome::kFailed, Outcome::kCancelled}) {
    if (to_string(o) == s) return o;
  }
  throw PolicyError("outcome: '" + s + "' is not one of completed, preempted, failed, cancelled");
}

bool is_terminal(LeaseState s) {
  return s == LeaseState::kReleased || s == LeaseState::kExpired || s == LeaseState::kRejected;
}

double Lease::units(const Policy& p) const {
  if (!shared) return gpus;
  const bool known = !devices.empty() && devices[0] >= 0 && size_t(devices[0]) < p.gpus.size();
  const double gpu_mem = known ? p.gpus[size_t(devices[0])].memory_gib : p.max_gpu_memory_gib();
  return memory_gib / gpu_mem;
}

bool Lease::holds_gpus(int64_t now_ms) const {
  if (state == LeaseState::kGranted || state == LeaseState::kRevoking) return true;
  return state == LeaseState::kExpired && !devices.empty() && now_ms < free_at_ms;
}

Engine::Engine(Policy policy) : policy_(std::move(policy)) { policy_.validate(); }

void Engine::log(int64_t now_ms, const std::string& actor, const std::string& action, const Lease* l,
                 const std::string& detail) {
  AuditEntry e;
  e.seq = next_audit_seq_++;
  e.ts_ms = now_ms;
  e.actor = actor;
  e.action = action;
  if (l != nullptr) {
    e.lease_id = l->id;
    e.team = l->req.team;
  }
  e.detail = detail;
  audit_.push_back(e);
  changes_.audit.push_back(e);
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
  double sum = 0;
  for (const auto& [id, l] : leases_) {
    // emergency leases come out of the pool, not the team's quota
    if (l.req.team == team && !l.emergency && l.holds_gpus(now_ms)) sum += l.units(policy_);
  }
  return sum;
}

std::optional<Engine::Placement> Engine::place(const Lease& l, int64_t now_ms,
                                               const std::set<int64_t>& ignore) const {
  const size_t n = policy_.gpus.size();
  std::vector<double> used(n, 0);
  std::vector<int> count(n, 0);
  std::vector<bool> whole(n, false), non_critical(n, false);
  for (const auto& [id, h] : leases_) {
    if (id == l.id || !h.holds_gpus(now_ms) || ignore.count(id)) continue;
    for (int d : h.devices) {
      if (d < 0 || size_t(d) >= n) continue;
      used[size_t(d)] += h.shared ? h.memory_gib : policy_.gpus[size_t(d)].memory_gib;
      count[size_t(d)] += 1;
      whole[size_t(d)] = whole[size_t(d)] || !h.shared;
      non_critical[size_t(d)] = non_critical[size_t(d)] || h.req.priority != Priority::kCritical;
    }
  }
  Placement p;
  if (l.shared) {
    int best = -1;
    for (size_t d = 0; d < n; ++d) {
      const double free = policy_.gpus[d].memory_gib - used[d];
      if (whole[d] || count[d] >= policy_.max_leases_per_gpu || free + kEps < l.memory_gib) continue;
      // pack: prefer GPUs already shared, then the tightest fit
      auto key = [&](size_t g) { return std::make_pair(count[g] == 0, policy_.gpus[g].memory_gib - used[g]); };
      if (best < 0 || key(d) < key(size_t(best))) best = int(d);
    }
    if (best < 0) return std::nullopt;
    p.devices = {best};
  } else {
    std::map<std::string, std::vector<int>> free_by_node;
    std::vector<std::string> node_order;
    for (size_t d = 0; d < n; ++d) {
      const auto& g = policy_.gpus[d];
      if (!free_by_node.count(g.node)) node_order.push_back(g.node);
      auto& v = free_by_node[g.node];
      if (count[d] == 0 && g.memory_gib + kEps >= l.memory_gib) v.push_back(int(d));
    }
    const size_t need = size_t(l.gpus);
    // best fit: the node with the fewest free GPUs that still holds the whole lease
    const std::vector<int>* fit = nullptr;
    for (const auto& node : node_order) {
      const auto& v = free_by_node[node];
      if (v.size() >= need && (fit == nullptr || v.size() < fit->size())) fit = &v;
    }
    if (fit != nullptr) {
      p.devices.assign(fit->begin(), fit->begin() + long(need));
    } else {
      std::stable_sort(node_order.begin(), node_order.end(), [&](const std::string& a, const std::string& b) {
        return free_by_node[a].size() > free_by_node[b].size();
      });
      for (const auto& node : node_order) {
        for (int d : free_by_node[node]) {
          if (p.devices.size() < need) p.devices.push_back(d);
        }
      }
      if (p.devices.size() < need) return std::nullopt;
    }
  }
  if (l.req.priority != Priority::kCritical) {
    for (int d : p.devices) non_critical[size_t(d)] = true;
    const long busy = std::count(non_critical.begin(), non_critical.end(), true);
    if (busy > policy_.total_gpus() - policy_.emergency_pool_gpus()) return std::nullopt;
  }
  return p;
}

bool Engine::try_grant(Lease& l, int64_t now_ms) {
  auto team_it = policy_.teams.find(l.req.team);
  if (team_it == policy_.teams.end()) return false;  // the team left the policy since the request
  const Team& team = team_it->second;
  const bool critical = l.req.priority == Priority::kCritical;
  const double before = team_units(l.req.team, now_ms);
  if (!critical && before + l.units(policy_) > team.limit_at(now_ms) + kEps) return false;
  auto p = place(l, now_ms, {});
  if (!p) return false;
  l.devices = p->devices;
  l.state = LeaseState::kGranted;
  l.granted_ms = now_ms;
  l.last_seen_ms = now_ms;
  l.charged_until_ms = now_ms;
  l.emergency = critical;
  l.review_pending = critical;
  l.over_base = !critical && before + l.units(policy_) > team.base + kEps;
  l.waiting_on.clear();
  l.reason.clear();
  changes_.leases.insert(l.id);
  std::string devs;
  for (int d : l.devices) devs += (devs.empty() ? "" : ",") + policy_.gpus[size_t(d)].id();
  if (critical) {
    log(now_ms, l.req.user, "emergency.granted", &l,
        "critical lease on " + devs + "; justification: " + l.req.justification + "; review pending");
  } else {
    log(now_ms, l.req.user, "lease.granted", &l, devs + (l.over_base ? " (burst, over base)" : ""));
  }
  return true;
}

bool Engine::try_preempt(Lease& w, int64_t now_ms) {
  auto team_it = policy_.teams.find(w.req.team);
  if (team_it == policy_.teams.end()) return false;
  const Team& team = team_it->second;
  const bool critical = w.req.priority == Priority::kCritical;
  const double mine = team_units(w.req.team, now_ms) + w.units(policy_);
  // over its own team's limit, a request may only displace lower-priority work of its own team
  const bool over_own = !critical && mine > team.limit_at(now_ms) + kEps;
  const double must_free_own = over_own ? mine - team.limit_at(now_ms) : 0;
  const bool within_base = critical || mine <= team.base + kEps;
  std::map<std::string, bool> over_limit;
  for (const auto& [name, t] : policy_.teams) over_limit[name] = team_units(name, now_ms) > t.limit_at(now_ms) + kEps;

  std::vector<const Lease*> cands;
  for (const auto& [id, v] : leases_) {
    if (v.state != LeaseState::kGranted || !v.req.preemptible || v.req.priority == Priority::kCritical) continue;
    if (now_ms - v.granted_ms < int64_t(policy_.min_runtime_s) * 1000) continue;
    const bool lower = v.req.priority < w.req.priority;
    const bool reclaim = within_base && v.req.team != w.req.team && (v.over_base || over_limit[v.req.team]);
    if (over_own ? (lower && v.req.team == w.req.team) : (lower || reclaim)) cands.push_back(&v);
  }
  if (cands.empty()) return false;
  auto rank = [&](const Lease* v) {
    // teams past their current limit (burst window closed) first, then burst leases, then low priority,
    // then the freshest checkpoint (least work lost), then the youngest
    return std::make_tuple(!over_limit[v->req.team], !v->over_base, int(v->req.priority),
                           -v->telemetry.last_checkpoint_ms, -v->granted_ms, v->id);
  };
  std::stable_sort(cands.begin(), cands.end(), [&](const Lease* a, const Lease* b) { return rank(a) < rank(b); });
  std::set<int64_t> ignore;
  std::vector<const Lease*> victims;
  auto enough = [&]() {
    double freed_own = 0;
    for (const Lease* v : victims) {
      if (v->req.team == w.req.team && !v->emergency) freed_own += v->units(policy_);
    }
    return freed_own + kEps >= must_free_own && place(w, now_ms, ignore).has_value();
  };
  bool fits = false;
  for (const Lease* v : cands) {
    ignore.insert(v->id);
    victims.push_back(v);
    if (enough()) {
      fits = true;
      break;
    }
  }
  if (!fits) return false;
  // drop victims that turned out unnecessary
  for (size_t i = 0; i < victims.size();) {
    const Lease* v = victims[i];
    ignore.erase(v->id);
    victims.erase(victims.begin() + long(i));
    if (enough()) continue;
    ignore.insert(v->id);
    victims.insert(victims.begin() + long(i), v);
    ++i;
  }
  w.waiting_on.clear();
  for (const Lease* cv : victims) {
    Lease& v = leases_.at(cv->id);
    v.state = LeaseState::kRevoking;
    v.deadline_ms = now_ms + int64_t(policy_.preempt_grace_s) * 1000;
    v.preempted_for = w.id;
    v.reason = "preempted for lease " + std::to_string(w.id) + " (" + to_string(w.req.priority) + ", team " +
               w.req.team + ")";
    changes_.leases.insert(v.id);
    w.waiting_on.push_back(v.id);
    log(now_ms, "quotad", "preempt.revoke", &v,
        "revoking for lease " + std::to_string(w.id) + "; checkpoint and release within " +
            std::to_string(policy_.preempt_grace_s) + " s" + (v.over_base ? " (over base)" : ""));
  }
  changes_.leases.insert(w.id);
  return true;
}

std::vector<const Lease*> Engine::queue_order() const {
  std::vector<const Lease*> q;
  for (const auto& [id, l] : leases_) {
    if (l.state == LeaseState::kQueued) q.push_back(&l);
  }
  // requests already waiting on a preemption go first, so nobody else takes the GPUs they freed
  std::stable_sort(q.begin(), q.end(), [](const Lease* a, const Lease* b) {
    return std::make_tuple(a->waiting_on.empty(), -int(a->req.priority), a->created_ms, a->id) <
           std::make_tuple(b->waiting_on.empty(), -int(b->req.priority), b->created_ms, b->id);
  });
  return q;
}

int Engine::queue_position(int64_t lease_id) const {
  const auto q = queue_order();
  for (size_t i = 0; i < q.size(); ++i) {
    if (q[i]->id == lease_id) return int(i) + 1;
  }
  return 0;
}

void Engine::schedule(int64_t now_ms) {
  std::vector<int64_t> ids;
  for (const Lease* l : queue_order()) ids.push_back(l->id);
  for (int64_t id : ids) {
    Lease& l = leases_.at(id);
    if (l.state != LeaseState::kQueued) continue;
    if (try_grant(l, now_ms)) continue;
    bool still_waiting = false;
    for (int64_t v : l.waiting_on) {
      auto it = leases_.find(v);
      if (it != leases_.end() && it->second.holds_gpus(now_ms)) still_waiting = true;
    }
    if (still_waiting) continue;
    if (!l.waiting_on.empty()) {
      l.waiting_on.clear();  // victims are gone but it still does not fit: choose again
      changes_.leases.insert(l.id);
    }
    try_preempt(l, now_ms);
  }
}

std::string Engine::queue_reason(const Lease& l, int64_t now_ms) const {
  if (!l.waiting_on.empty()) {
    std::string ids;
    int64_t deadline = 0;
    for (int64_t v : l.waiting_on) {
      ids += (ids.empty() ? "" : ", ") + std::to_string(v);
      if (const Lease* vl = find(v)) deadline = std::max(deadline, vl->deadline_ms);
    }
    return "waiting for preempted lease(s) " + ids + " to release (deadline in " +
           std::to_string(std::max<int64_t>(0, (deadline - now_ms) / 1000)) + " s)";
  }
  auto team_it = policy_.teams.find(l.req.team);
  if (team_it == policy_.teams.end()) return "team " + l.req.team + " is no longer in the policy";
  const Team& team = team_it->second;
  const double used = team_units(l.req.team, now_ms);
  if (l.req.priority != Priority::kCritical && used + l.units(policy_) > team.limit_at(now_ms) + kEps) {
    return "team " + team.name + " uses " + fmt(used) + " of the " + fmt(team.limit_at(now_ms)) +
           " GPUs allowed now (base " + fmt(team.base) + ", burst " + fmt(team.burst) +
           (team.in_burst_window(now_ms) ? ", inside a burst window)" : " only inside burst windows)");
  }
  std::string r = "no free GPU fits " + (l.shared ? fmt(l.memory_gib) + " GiB (shared)" : std::to_string(l.gpus) +
                                                                                          " whole GPU(s)");
  if (policy_.emergency_pool_gpus() > 0 && l.req.priority != Priority::kCritical) {
    r += "; " + std::to_string(policy_.emergency_pool_gpus()) + " GPU(s) stay reserved for critical leases";
  }
  return r;
}

AcquireResult Engine::status_of(int64_t lease_id, int64_t now_ms) const {
  AcquireResult r;
  r.lease_id = lease_id;
  const Lease* l = find(lease_id);
  if (l == nullptr) {
    r.kind = AcquireResult::Kind::kInvalid;
    r.reason = "unknown lease " + std::to_string(lease_id);
    return r;
  }
  r.approval_id = l->approval_id;
  switch (l->state) {
    case LeaseState::kGranted:
    case LeaseState::kRevoking: r.kind = AcquireResult::Kind::kGranted; break;
    case LeaseState::kQueued:
      r.kind = AcquireResult::Kind::kQueued;
      r.position = queue_position(lease_id);
      r.reason = queue_reason(*l, now_ms);
      break;
    case LeaseState::kPendingApproval:
      r.kind = AcquireResult::Kind::kNeedsApproval;
      r.reason = "model " + l->req.model + " needs the approval of a lead of team " + l->req.team;
      break;
    default:
      r.kind = AcquireResult::Kind::kNotAllowed;
      r.reason = "lease " + std::to_string(lease_id) + " has ended (" + to_string(l->state) +
                 (l->reason.empty() ? "" : ": " + l->reason) + ")";
  }
  return r;
}

AcquireResult Engine::acquire(const LeaseRequest& req_in, int64_t now_ms) {
  if (!req_in.idempotency_key.empty()) {
    auto it = idempotency_.find({req_in.user, req_in.idempotency_key});
    if (it != idempotency_.end() && leases_.count(it->second)) {
      AcquireResult r = status_of(it->second, now_ms);
      r.replayed = true;
      return r;
    }
  }
  AcquireResult r;
  auto refuse = [&](AcquireResult::Kind k, const std::string& why) {
    r.kind = k;
    r.reason = why;
    return r;
  };
  LeaseRequest req = req_in;
  if (req.user.empty()) return refuse(AcquireResult::Kind::kInvalid, "user: required");
  if (!policy_.teams.count(req.team)) return refuse(AcquireResult::Kind::kInvalid, "team: unknown team '" + req.team + "'");
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
  if (!(req.memory_gib >= 0) || req.memory_gib > policy_.max_gpu_memory_gib()) {
    return refuse(AcquireResult::Kind::kInvalid,
                  "memory_gib: must be within 0.." + fmt(policy_.max_gpu_memory_gib()) + " GiB per GPU");
  }
  Lease l;
  l.req = req;
  l.gpus = req.gpus > 0 ? req.gpus : policy_.default_gpus;
  l.shared = req.shared && policy_.sharing_enabled && l.gpus == 1;
  if (l.shared) {
    auto it = policy_.default_memory_gib.find(req.model);
    l.memory_gib = req.memory_gib > 0 ? req.memory_gib
                   : it != policy_.default_memory_gib.end() ? it->second
                                                            : policy_.default_memory_fallback_gib;
  } else {
    l.memory_gib = req.memory_gib;
  }
  const bool critical = req.priority == Priority::kCritical;
  // admission: the estimated memory must fit what a GPU (or the share) offers
  if (policy_.memory_table.has(req.model)) {
    const double avail = l.shared ? l.memory_gib : policy_.max_gpu_memory_gib();
    const int per_gpu = req.batch > 0 ? (req.batch + l.gpus - 1) / l.gpus : 1;
    const double need = policy_.memory_table.estimate_gib(req.model, req.imgsz, per_gpu);
    // whole-GPU leases only go to GPUs big enough for the estimate
    if (!l.shared) l.memory_gib = std::max(l.memory_gib, need);
    if (need > avail + kEps) {
      r.max_batch = policy_.memory_table.max_batch(req.model, req.imgsz, avail) * l.gpus;
      r.needed_gib = need;
      const std::string what = req.batch > 0 ? "batch " + std::to_string(req.batch) : "one image";
      return refuse(AcquireResult::Kind::kAdmissionRefused,
                    what + " for " + req.model + " at " + std::to_string(req.imgsz) + " needs ~" + fmt(need) +
                        " GiB per GPU (estimate), " + fmt(avail) + " GiB available; " +
                        (r.max_batch > 0 ? "at most batch " + std::to_string(r.max_batch) + " fits, or use batch=auto"
                                         : "it does not fit even with batch 1: use a smaller imgsz or model"));
    }
  }
  if (critical && req.justification.empty()) {
    return refuse(AcquireResult::Kind::kNotAllowed, "justification: a critical (emergency) lease needs a justification");
  }
  const bool approval = !critical && policy_.needs_approval(req.model);
  if (approval && req.justification.empty()) {
    return refuse(AcquireResult::Kind::kNotAllowed, "justification: model " + req.model +
                                                        " is in the approval tier; add a justification for a lead of team " +
                                                        req.team);
  }
  if (policy_.monthly_gpu_hours > 0 && !critical) {
    const std::string month = month_key(now_ms);
    const double used = used_gpu_hours(req.user, month, now_ms);
    const double allowed = credit_allowance(req.user, month, now_ms);
    if (used + kEps >= allowed) {
      return refuse(AcquireResult::Kind::kCreditsSpent,
                    "credits: " + req.user + " used " + fmt(used) + " of " + fmt(allowed) + " GPU-hours in " + month +
                        (policy_.loan_gpu_hours > 0 ? " (loan included)" : ""));
    }
  }
  l.id = next_lease_++;
  l.created_ms = now_ms;
  l.last_seen_ms = now_ms;
  if (approval) {
    Approval a;
    a.id = next_approval_++;
    a.lease_id = l.id;
    a.team = req.team;
    a.user = req.user;
    a.model = req.model;
    a.justification = req.justification;
    a.created_ms = now_ms;
    approvals_[a.id] = a;
    changes_.approvals.insert(a.id);
    l.approval_id = a.id;
    l.state = LeaseState::kPendingApproval;
  } else {
    l.state = LeaseState::kQueued;
  }
  auto& stored = leases_[l.id] = l;
  changes_.leases.insert(l.id);
  if (!req.idempotency_key.empty()) idempotency_[{req.user, req.idempotency_key}] = l.id;
  if (approval) {
    log(now_ms, req.user, "approval.requested", &stored,
        "approval " + std::to_string(l.approval_id) + " for " + req.model + ": " + req.justification);
  } else {
    schedule(now_ms);
    if (stored.state == LeaseState::kQueued) {
      log(now_ms, req.user, "lease.queued", &stored, queue_reason(stored, now_ms));
    }
  }
  return status_of(l.id, now_ms);
}

HeartbeatResult Engine::heartbeat(int64_t lease_id, const Telemetry& t, int64_t now_ms) {
  HeartbeatResult r;
  auto it = leases_.find(lease_id);
  if (it == leases_.end()) return r;
  Lease& l = it->second;
  r.found = true;
  r.state = l.state;
  if (is_terminal(l.state)) {
    r.reason = l.reason;
    return r;
  }
  l.last_seen_ms = now_ms;
  if (l.state == LeaseState::kQueued) {
    r.position = queue_position(lease_id);
    r.reason = queue_reason(l, now_ms);
    return r;
  }
  if (t.step >= 0) l.telemetry.step = t.step;
  if (t.epoch >= 0) l.telemetry.epoch = t.epoch;
  if (t.gpu_util >= 0) l.telemetry.gpu_util = t.gpu_util;
  if (t.memory_used_gib >= 0) l.telemetry.memory_used_gib = t.memory_used_gib;
  if (t.last_checkpoint_ms > 0) l.telemetry.last_checkpoint_ms = t.last_checkpoint_ms;
  r.deadline_ms = l.deadline_ms;
  r.reason = l.reason;
  return r;
}

void Engine::charge(Lease& l, int64_t until_ms) {
  if (l.granted_ms == 0) return;
  const int64_t from = std::max(l.charged_until_ms, l.granted_ms);
  if (until_ms <= from) return;
  const double hours = double(until_ms - from) / 3.6e6 * l.units(policy_);
  const auto key = std::make_pair(l.req.user, month_key(until_ms));
  usage_[key] += hours;
  l.gpu_hours += hours;
  l.charged_until_ms = until_ms;
  changes_.usage.insert(key);
  changes_.leases.insert(l.id);
}

double Engine::used_gpu_hours(const std::string& user, const std::string& month, int64_t now_ms) const {
  auto it = usage_.find({user, month});
  double used = it == usage_.end() ? 0 : it->second;
  if (month == month_key(now_ms)) {
    for (const auto& [id, l] : leases_) {
      if (l.req.user == user && (l.state == LeaseState::kGranted || l.state == LeaseState::kRevoking)) {
        used += double(std::max<int64_t>(0, now_ms - std::max(l.charged_until_ms, l.granted_ms))) / 3.6e6 *
                l.units(policy_);
      }
    }
  }
  return used;
}

double Engine::credit_allowance(const std::string& user, const std::string& month, int64_t) const {
  auto it = usage_.find({user, previous_month_key(month)});
  const double prev = it == usage_.end() ? 0 : it->second;
  // last month's overrun was a loan against this month
  const double debt = std::max(0.0, prev - policy_.monthly_gpu_hours);
  return policy_.monthly_gpu_hours + policy_.loan_gpu_hours - debt;
}

void Engine::end_lease(Lease& l, LeaseState state, Outcome outcome, int64_t end_ms, int64_t free_at_ms,
                       const std::string& reason, const std::string& actor) {
  const bool held = l.state == LeaseState::kGranted || l.state == LeaseState::kRevoking;
  if (held) charge(l, end_ms);
  const LeaseState before = l.state;
  l.state = state;
  l.outcome = outcome;
  l.ended_ms = end_ms;
  l.free_at_ms = held ? free_at_ms : end_ms;
  if (!held) l.devices.clear();
  if (!reason.empty()) l.reason = reason;
  changes_.leases.insert(l.id);
  // a cancelled waiter no longer needs its victims
  for (int64_t v : l.waiting_on) {
    auto it = leases_.find(v);
    if (it != leases_.end() && it->second.state == LeaseState::kRevoking && it->second.preempted_for == l.id) {
      it->second.state = LeaseState::kGranted;
      it->second.deadline_ms = 0;
      it->second.preempted_for = 0;
      it->second.reason.clear();
      changes_.leases.insert(v);
      log(end_ms, "quotad", "preempt.cancelled", &it->second, "waiting lease " + std::to_string(l.id) + " went away");
    }
  }
  l.waiting_on.clear();
  const std::string action = state == LeaseState::kExpired ? "lease.expired" : "lease.released";
  std::string detail = "from " + to_string(before);
  if (outcome != Outcome::kNone) detail += ", outcome " + to_string(outcome);
  if (held) detail += ", " + fmt(l.gpu_hours, 3) + " GPU-hours";
  if (!reason.empty()) detail += "; " + reason;
  log(end_ms, actor.empty() ? l.req.user : actor, action, &l, detail);
}

bool Engine::release(int64_t lease_id, Outcome outcome, int64_t now_ms, const std::string& actor) {
  auto it = leases_.find(lease_id);
  if (it == leases_.end() || is_terminal(it->second.state)) return false;
  Lease& l = it->second;
  if (l.state == LeaseState::kQueued || l.state == LeaseState::kPendingApproval) outcome = Outcome::kCancelled;
  if (outcome == Outcome::kNone) outcome = Outcome::kCompleted;
  if (l.state == LeaseState::kPendingApproval) {
    auto a = approvals_.find(l.approval_id);
    if (a != approvals_.end() && a->second.state == "pending") {
      a->second.state = "cancelled";
      a->second.decided_ms = now_ms;
      changes_.approvals.insert(a->first);
    }
  }
  end_lease(l, LeaseState::kReleased, outcome, now_ms, now_ms, "", actor);
  schedule(now_ms);
  return true;
}

void Engine::approve(int64_t approval_id, const std::string& by, int64_t now_ms, const std::string& note) {
  auto it = approvals_.find(approval_id);
  if (it == approvals_.end()) throw PolicyError("approval " + std::to_string(approval_id) + ": unknown");
  Approval& a = it->second;
  if (a.state != "pending") throw PolicyError("approval " + std::to_string(approval_id) + ": already " + a.state);
  a.state = "approved";
  a.decided_by = by;
  a.decided_ms = now_ms;
  a.note = note;
  changes_.approvals.insert(a.id);
  Lease& l = leases_.at(a.lease_id);
  l.state = LeaseState::kQueued;
  l.last_seen_ms = now_ms;
  changes_.leases.insert(l.id);
  log(now_ms, by, "approval.approved", &l, "approval " + std::to_string(a.id) + (note.empty() ? "" : ": " + note));
  schedule(now_ms);
}

void Engine::reject(int64_t approval_id, const std::string& by, int64_t now_ms, const std::string& note) {
  auto it = approvals_.find(approval_id);
  if (it == approvals_.end()) throw PolicyError("approval " + std::to_string(approval_id) + ": unknown");
  Approval& a = it->second;
  if (a.state != "pending") throw PolicyError("approval " + std::to_string(approval_id) + ": already " + a.state);
  a.state = "rejected";
  a.decided_by = by;
  a.decided_ms = now_ms;
  a.note = note;
  changes_.approvals.insert(a.id);
  Lease& l = leases_.at(a.lease_id);
  l.state = LeaseState::kRejected;
  l.ended_ms = now_ms;
  l.reason = "rejected by " + by + (note.empty() ? "" : ": " + note);
  changes_.leases.insert(l.id);
  log(now_ms, by, "approval.rejected", &l, "approval " + std::to_string(a.id) + (note.empty() ? "" : ": " + note));
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
  const int64_t ttl = int64_t(policy_.ttl_s) * 1000;
  const int64_t grace = int64_t(policy_.expiry_grace_s) * 1000;
  for (auto& [id, l] : leases_) {
    if (l.state == LeaseState::kRevoking && now_ms >= l.deadline_ms) {
      end_lease(l, LeaseState::kExpired, Outcome::kPreempted, now_ms, now_ms,
                "did not release by the preemption deadline", "quotad");
    } else if ((l.state == LeaseState::kGranted || l.state == LeaseState::kRevoking) && now_ms - l.last_seen_ms > ttl) {
      const int64_t end = l.last_seen_ms + ttl;
      end_lease(l, LeaseState::kExpired, Outcome::kNone, end, end + grace,
                "no heartbeat for " + std::to_string(policy_.ttl_s) + " s", "quotad");
    } else if (l.state == LeaseState::kGranted || l.state == LeaseState::kRevoking) {
      if (now_ms - std::max(l.charged_until_ms, l.granted_ms) >= kAccrueEveryMs) charge(l, now_ms);
    } else if (l.state == LeaseState::kQueued && now_ms - l.last_seen_ms > ttl) {
      end_lease(l, LeaseState::kExpired, Outcome::kCancelled, now_ms, now_ms,
                "queued request not polled for " + std::to_string(policy_.ttl_s) + " s", "quotad");
    }
  }
  schedule(now_ms);
}

std::vector<TeamStatus> Engine::teams(int64_t now_ms) const {
  std::vector<TeamStatus> out;
  for (const auto& [name, t] : policy_.teams) {
    TeamStatus s;
    s.name = name;
    s.base = t.base;
    s.burst = t.burst;
    s.limit_now = t.limit_at(now_ms);
    s.in_burst_window = t.in_burst_window(now_ms);
    s.in_use = team_units(name, now_ms);
    for (const auto& [id, l] : leases_) {
      if (l.req.team != name) continue;
      if (l.state == LeaseState::kGranted || l.state == LeaseState::kRevoking) ++s.leases_active;
      if (l.state == LeaseState::kQueued) ++s.queued;
      if (l.state == LeaseState::kPendingApproval) ++s.pending_approval;
    }
    out.push_back(s);
  }
  return out;
}

std::vector<std::string> Engine::check_invariants(int64_t now_ms) const {
  std::vector<std::string> errors;
  const size_t n = policy_.gpus.size();
  std::vector<double> used(n, 0);
  std::vector<int> count(n, 0), whole(n, 0);
  std::vector<bool> non_critical(n, false);
  for (const auto& [id, l] : leases_) {
    if (!l.holds_gpus(now_ms)) continue;
    const size_t want = l.shared ? 1 : size_t(l.gpus);
    if (l.devices.size() != want) {
      errors.push_back("lease " + std::to_string(id) + " holds " + std::to_string(l.devices.size()) + " devices, wants " +
                       std::to_string(want));
    }
    std::set<int> seen;
    for (int d : l.devices) {
      if (d < 0 || size_t(d) >= n) {
        errors.push_back("lease " + std::to_string(id) + " names device " + std::to_string(d));
        continue;
      }
      if (!seen.insert(d).second) errors.push_back("lease " + std::to_string(id) + " lists a device twice");
      used[size_t(d)] += l.shared ? l.memory_gib : policy_.gpus[size_t(d)].memory_gib;
      count[size_t(d)] += 1;
      whole[size_t(d)] += l.shared ? 0 : 1;
      if (l.req.priority != Priority::kCritical) non_critical[size_t(d)] = true;
    }
  }
  for (size_t d = 0; d < n; ++d) {
    const auto& g = policy_.gpus[d];
    if (used[d] > g.memory_gib + kEps) {
      errors.push_back("gpu " + g.id() + ": leases hold " + fmt(used[d]) + " GiB of " + fmt(g.memory_gib));
    }
    if (whole[d] > 0 && count[d] > 1) errors.push_back("gpu " + g.id() + ": a whole-GPU lease shares it");
    if (count[d] > policy_.max_leases_per_gpu) errors.push_back("gpu " + g.id() + ": too many shared leases");
  }
  const long busy = std::count(non_critical.begin(), non_critical.end(), true);
  if (busy > policy_.total_gpus() - policy_.emergency_pool_gpus()) {
    errors.push_back("non-critical leases hold " + std::to_string(busy) + " GPUs, eating into the emergency pool");
  }
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
  for (size_t i = 0; i < policy_.gpus.size(); ++i) index_of[policy_.gpus[i].id()] = int(i);
  for (auto& l : leases) {
    next_lease_ = std::max(next_lease_, l.id + 1);
    if (!l.device_ids.empty()) {
      // devices are stored by name so an edited inventory (reordered nodes) keeps leases on their GPUs
      std::vector<int> mapped;
      for (const auto& name : l.device_ids) {
        auto it = index_of.find(name);
        if (it != index_of.end()) mapped.push_back(it->second);
      }
      l.devices = mapped;
      l.device_ids.clear();
    }
    if (restart_now_ms > 0) {
      if (l.state == LeaseState::kGranted || l.state == LeaseState::kRevoking || l.state == LeaseState::kQueued) {
        l.last_seen_ms = std::max(l.last_seen_ms, restart_now_ms);
      }
      if (l.state == LeaseState::kRevoking) {
        l.deadline_ms = std::max(l.deadline_ms, restart_now_ms + int64_t(policy_.ttl_s) * 1000);
      }
    }
    if (!l.req.idempotency_key.empty()) idempotency_[{l.req.user, l.req.idempotency_key}] = l.id;
    leases_[l.id] = std::move(l);
  }
  for (auto& a : approvals) {
    next_approval_ = std::max(next_approval_, a.id + 1);
    approvals_[a.id] = std::move(a);
  }
  audit_ = std::move(audit);
  usage_ = std::move(usage);
  next_audit_seq_ = std::max<int64_t>(next_audit_seq, audit_.empty() ? 1 : audit_.back().seq + 1);
  changes_ = Changes{};
}

void Engine::prune(int64_t now_ms, int64_t keep_ms) {
  for (auto it = leases_.begin(); it != leases_.end();) {
    const Lease& l = it->second;
    if (is_terminal(l.state) && !l.holds_gpus(now_ms) && l.ended_ms < now_ms - keep_ms) {
      if (!l.req.idempotency_key.empty()) idempotency_.erase({l.req.user, l.req.idempotency_key});
      it = leases_.erase(it);
    } else {
      ++it;
    }
  }
  constexpr size_t kAuditInMemory = 10000;
  if (audit_.size() > kAuditInMemory) audit_.erase(audit_.begin(), audit_.end() - long(kAuditInMemory));
}

}  // namespace yolo8::quota
