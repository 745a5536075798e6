#include "quota/service/service.h"

#include <chrono>
#include <cmath>
#include <set>
#include <sstream>

#include "quota/core/codec.h"

namespace yolo8::quota {

using nlohmann::json;

namespace {

ApiResponse error(int status, const std::string& reason) {
  ApiResponse r;
  r.status = status;
  r.body = json{{"error", status}, {"reason", reason}};
  return r;
}

std::vector<std::string> split_path(const std::string& path) {
  std::vector<std::string> parts;
  std::string cur;
  for (char ch : path) {
    if (ch == '/') {
      if (!cur.empty()) parts.push_back(cur);
      cur.clear();
    } else {
      cur += ch;
    }
  }
  if (!cur.empty()) parts.push_back(cur);
  return parts;
}

// Digits only, so "12abc" or "-1" never name a lease.
bool parse_id(const std::string& s, int64_t& out) {
  if (s.empty() || s.size() > 15) return false;
  for (char ch : s) {
    if (ch < '0' || ch > '9') return false;
  }
  out = std::stoll(s);
  return out > 0;
}

json parse_body(const std::string& body) {
  if (body.empty()) return json::object();
  try {
    return json::parse(body);
  } catch (const json::parse_error&) {
    throw RequestError("body: malformed JSON");
  }
}

}  // namespace

QuotaService::QuotaService(Policy policy, ServiceOptions options)
    : policy_(policy),
      options_(std::move(options)),
      engine_(std::move(policy)),
      tracker_(policy_.waste_gpu_util_below, int64_t(policy_.waste_after_s) * 1000) {
  clock_ = options_.clock ? options_.clock : system_now_ms;
  if (!options_.db_path.empty()) {
    store_ = std::make_unique<Store>(options_.db_path, options_.full_sync);
    if (!options_.reload_per_call) {
      const int64_t now = clock_();
      Snapshot s = store_->load(now, options_.keep_ended_ms, 10000);
      engine_.restore(std::move(s.leases), std::move(s.approvals), std::move(s.audit), std::move(s.usage),
                      s.next_audit_seq, now);
      replay_heartbeats(options_.db_path, engine_, tracker_);  // the waste list survives a restart
    }
  }
}

void QuotaService::reload_locked(int64_t now_ms) {
  Snapshot s = store_->load(now_ms, int64_t(policy_.ttl_s + policy_.expiry_grace_s) * 1000 + 3600 * 1000, 0);
  engine_.restore(std::move(s.leases), std::move(s.approvals), {}, std::move(s.usage), s.next_audit_seq, 0);
}

void QuotaService::persist_locked() {
  Changes c = engine_.take_changes();
  for (const auto& a : c.audit) {
    if (a.action == "preempt.revoke") ++preemptions_total_;
    if (a.action == "emergency.granted") ++emergency_total_;
  }
  if (!store_) return;
  std::lock_guard<std::mutex> db(db_mu_);
  store_->write(engine_, c);
}

ApiResponse QuotaService::locked(const std::function<ApiResponse()>& op) {
  std::lock_guard<std::mutex> lk(mu_);
  if (store_ && options_.reload_per_call) {
    std::lock_guard<std::mutex> db(db_mu_);
    store_->begin_immediate();
    try {
      const int64_t now = clock_();
      reload_locked(now);
      engine_.tick(now);
      ApiResponse r = op();
      Changes c = engine_.take_changes();
      store_->write(engine_, c);
      store_->write_heartbeats(pending_heartbeats_);
      pending_heartbeats_.clear();
      store_->commit();
      return r;
    } catch (...) {
      pending_heartbeats_.clear();
      store_->rollback();
      throw;
    }
  }
  ApiResponse r = op();
  persist_locked();
  return r;
}

void QuotaService::tick() {
  if (store_ && options_.reload_per_call) {
    locked([] { return ApiResponse{}; });
    return;
  }
  std::lock_guard<std::mutex> lk(mu_);
  const int64_t now = clock_();
  engine_.tick(now);
  engine_.prune(now, options_.keep_ended_ms);
  sync_tracker(engine_, tracker_);  // ended runs closed, pruned leases dropped, even without scrapes
  persist_locked();
}

void QuotaService::flush_heartbeats() {
  std::vector<HeartbeatSample> batch;
  {
    std::lock_guard<std::mutex> lk(mu_);
    batch.swap(pending_heartbeats_);
  }
  if (!store_ || batch.empty()) return;
  std::lock_guard<std::mutex> db(db_mu_);
  store_->write_heartbeats(batch);
}

std::vector<std::string> QuotaService::check_invariants() {
  std::vector<std::string> errors;
  locked([&] {
    errors = engine_.check_invariants(clock_());
    return ApiResponse{};
  });
  return errors;
}

void QuotaService::inspect(const std::function<void(const Engine&)>& fn) {
  locked([&] {
    fn(engine_);
    return ApiResponse{};
  });
}

bool QuotaService::can_read(const Caller& c, const Lease& l) const {
  return c.role == Role::kAdmin || l.req.team == c.team;
}

bool QuotaService::can_act(const Caller& c, const Lease& l) const {
  return c.role == Role::kAdmin || l.req.user == c.name || (c.role == Role::kLead && l.req.team == c.team);
}

json QuotaService::lease_view(const Lease& l, int64_t now_ms) const {
  json j = to_json(l, policy_);
  j["ttl_s"] = policy_.ttl_s;
  j["heartbeat_interval_s"] = policy_.heartbeat_interval_s;
  j["preempt_grace_s"] = policy_.preempt_grace_s;
  j["expiry_grace_s"] = policy_.expiry_grace_s;
  if (l.state == LeaseState::kQueued) {
    const AcquireResult s = engine_.status_of(l.id, now_ms);
    j["position"] = s.position;
    j["reason"] = s.reason;
  }
  if (l.state == LeaseState::kRevoking) j["deadline_in_ms"] = std::max<int64_t>(0, l.deadline_ms - now_ms);
  return j;
}

ApiResponse QuotaService::handle(const ApiRequest& req_in) {
  ApiResponse r;
  try {
    ApiRequest req = req_in;
    // in-process callers may pass "path?k=v&k2=v2"
    if (const auto q = req.path.find('?'); q != std::string::npos) {
      std::string rest = req.path.substr(q + 1);
      req.path.resize(q);
      size_t pos = 0;
      while (pos <= rest.size()) {
        const size_t amp = std::min(rest.find('&', pos), rest.size());
        const std::string kv = rest.substr(pos, amp - pos);
        const size_t eq = kv.find('=');
        if (!kv.empty()) req.query[kv.substr(0, eq)] = eq == std::string::npos ? "" : kv.substr(eq + 1);
        pos = amp + 1;
      }
    }
    r = route(req);
  } catch (const RequestError& e) {
    r = error(400, e.what());
  } catch (const PolicyError& e) {
    r = error(400, e.what());
  } catch (const json::exception& e) {
    r = error(400, std::string("body: ") + e.what());
  } catch (const StoreError& e) {
    r = error(503, std::string("storage: ") + e.what());
  } catch (const std::exception& e) {
    r = error(500, e.what());
  }
  if (r.status >= 0 && r.status < int(responses_by_status_.size())) ++responses_by_status_[size_t(r.status)];
  return r;
}

ApiResponse QuotaService::route(const ApiRequest& req) {
  const auto parts = split_path(req.path);
  const bool get = req.method == "GET";
  const bool post = req.method == "POST";
  if (parts.size() == 1 && parts[0] == "healthz") {
    ApiResponse r;
    r.body = json{{"status", "ok"}, {"time_ms", clock_()}};
    return r;
  }
  if (parts.empty() || parts[0] != "v1") return error(404, "no such endpoint: " + req.path);

  Caller caller;
  if (!req.trusted_user.empty()) {
    auto it = policy_.users.find(req.trusted_user);
    caller.name = req.trusted_user;
    if (it != policy_.users.end()) {
      caller.team = it->second.team;
      caller.role = it->second.role;
    } else {
      caller.role = Role::kAdmin;
    }
  } else {
    if (req.token.empty()) return error(401, "authorization: a bearer token is required");
    const User* u = policy_.find_user_by_token(req.token);
    if (u == nullptr) return error(401, "authorization: unknown token");
    caller.name = u->name;
    caller.team = u->team;
    caller.role = u->role;
  }

  int64_t id = 0;
  const size_t n = parts.size();
  if (n >= 2 && parts[1] == "leases") {
    if (n == 2 && post) return acquire(caller, req);
    if (n == 2 && get) return list_leases(caller, req);
    if (n >= 3 && !parse_id(parts[2], id)) return error(404, "unknown lease '" + parts[2] + "'");
    if (n == 3 && get) return get_lease(caller, id);
    if (n == 4 && post && parts[3] == "heartbeat") return heartbeat(caller, id, req.body);
    if (n == 4 && post && parts[3] == "release") return release(caller, id, req.body);
    if (n == 4 && post && parts[3] == "review") return review(caller, id, req.body);
  } else if (n >= 2 && parts[1] == "approvals") {
    if (n == 2 && get) return list_approvals(caller);
    if (n >= 3 && !parse_id(parts[2], id)) return error(404, "unknown approval '" + parts[2] + "'");
    if (n == 4 && post && (parts[3] == "approve" || parts[3] == "reject")) {
      return decide(caller, id, parts[3] == "approve", req.body);
    }
  } else if (n == 2 && parts[1] == "teams" && get) {
    return teams(caller);
  } else if (n == 2 && parts[1] == "audit" && get) {
    return audit(caller, req);
  }
  return error(404, "no such endpoint: " + req.method + " " + req.path);
}

ApiResponse QuotaService::acquire(const Caller& c, const ApiRequest& req) {
  LeaseRequest lr = lease_request_from_json(parse_body(req.body));
  if (lr.team.empty()) lr.team = c.team;
  if (lr.user.empty()) lr.user = c.name;
  if (!req.idempotency_key.empty()) {
    if (req.idempotency_key.size() > 128) throw RequestError("Idempotency-Key: longer than 128 characters");
    lr.idempotency_key = req.idempotency_key;
  }
  if (c.role != Role::kAdmin) {
    if (lr.team != c.team) return error(403, "team: " + c.name + " acts only for team " + c.team);
    if (lr.user != c.name) return error(403, "user: " + c.name + " cannot request a lease for " + lr.user);
  }
  return locked([&] {
    const int64_t now = clock_();
    const AcquireResult a = engine_.acquire(lr, now);
    ApiResponse r;
    json& b = r.body;
    b["lease_id"] = a.lease_id;
    b["replayed"] = a.replayed;
    if (!a.reason.empty()) b["reason"] = a.reason;
    switch (a.kind) {
      case AcquireResult::Kind::kGranted:
        r.status = 201;
        b["status"] = "granted";
        b["lease"] = lease_view(*engine_.find(a.lease_id), now);
        break;
      case AcquireResult::Kind::kQueued:
        r.status = 202;
        b["status"] = "queued";
        b["position"] = a.position;
        b["poll"] = "/v1/leases/" + std::to_string(a.lease_id);
        break;
      case AcquireResult::Kind::kNeedsApproval:
        r.status = 403;
        b["status"] = "needs_approval";
        b["approval_id"] = a.approval_id;
        b["poll"] = "/v1/leases/" + std::to_string(a.lease_id);
        break;
      case AcquireResult::Kind::kNotAllowed:
        r.status = 403;
        b["status"] = "not_allowed";
        break;
      case AcquireResult::Kind::kAdmissionRefused:
        r.status = 422;
        b["status"] = "refused";
        b["max_batch"] = a.max_batch;
        b["needed_gib"] = a.needed_gib;
        break;
      case AcquireResult::Kind::kCreditsSpent:
        r.status = 429;
        b["status"] = "credits_spent";
        break;
      case AcquireResult::Kind::kInvalid:
        r.status = 400;
        b["status"] = "invalid";
        break;
    }
    if (a.lease_id == 0) b.erase("lease_id");
    return r;
  });
}

ApiResponse QuotaService::get_lease(const Caller& c, int64_t id) {
  return locked([&] {
    const int64_t now = clock_();
    const Lease* l = engine_.find(id);
    if (l == nullptr) return error(404, "unknown lease " + std::to_string(id));
    if (!can_read(c, *l)) return error(403, "lease " + std::to_string(id) + " belongs to team " + l->req.team);
    // polling keeps a queued request alive
    if (can_act(c, *l) && (l->state == LeaseState::kQueued || l->state == LeaseState::kPendingApproval)) {
      engine_.heartbeat(id, {}, now);
    }
    ApiResponse r;
    r.body = lease_view(*engine_.find(id), now);
    return r;
  });
}

ApiResponse QuotaService::list_leases(const Caller& c, const ApiRequest& req) {
  auto state = req.query.find("state");
  return locked([&] {
    const int64_t now = clock_();
    json arr = json::array();
    for (const auto& [id, l] : engine_.leases()) {
      if (!can_read(c, l)) continue;
      if (state != req.query.end() && to_string(l.state) != state->second) continue;
      if (state == req.query.end() && is_terminal(l.state)) continue;
      arr.push_back(lease_view(l, now));
    }
    ApiResponse r;
    r.body = json{{"leases", arr}};
    return r;
  });
}

ApiResponse QuotaService::heartbeat(const Caller& c, int64_t id, const std::string& body) {
  const Telemetry t = telemetry_from_json(parse_body(body));
  auto fill = [&](const HeartbeatResult& h, int64_t now) {
    ApiResponse r;
    r.body = json{{"lease_id", id},
                  {"state", to_string(h.state)},
                  {"heartbeat_interval_s", policy_.heartbeat_interval_s},
                  {"ttl_s", policy_.ttl_s}};
    if (h.state == LeaseState::kRevoking) {
      r.body["deadline_ms"] = h.deadline_ms;
      r.body["deadline_in_ms"] = std::max<int64_t>(0, h.deadline_ms - now);
    }
    if (h.state == LeaseState::kQueued) r.body["position"] = h.position;
    if (!h.reason.empty()) r.body["reason"] = h.reason;
    return r;
  };
  if (!store_ || !options_.reload_per_call) {
    // hot path: memory only; the sample reaches the database with the next batched flush
    ApiResponse r;
    {
      std::lock_guard<std::mutex> lk(mu_);
      const Lease* l = engine_.find(id);
      if (l == nullptr) return error(404, "unknown lease " + std::to_string(id));
      if (!can_act(c, *l)) return error(403, c.name + " may not heartbeat lease " + std::to_string(id));
      const int64_t now = clock_();
      const HeartbeatResult h = engine_.heartbeat(id, t, now);
      ++heartbeats_total_;
      if (h.state == LeaseState::kGranted || h.state == LeaseState::kRevoking) tracker_.observe(id, now, t.gpu_util);
      if (store_ && (h.state == LeaseState::kGranted || h.state == LeaseState::kRevoking)) {
        pending_heartbeats_.push_back(HeartbeatSample{id, now, l->telemetry});
      }
      r = fill(h, now);
    }
    if (options_.write_each_heartbeat) flush_heartbeats();
    return r;
  }
  return locked([&] {
    const Lease* l = engine_.find(id);
    if (l == nullptr) return error(404, "unknown lease " + std::to_string(id));
    if (!can_act(c, *l)) return error(403, c.name + " may not heartbeat lease " + std::to_string(id));
    const int64_t now = clock_();
    const HeartbeatResult h = engine_.heartbeat(id, t, now);
    ++heartbeats_total_;
    if (h.state == LeaseState::kGranted || h.state == LeaseState::kRevoking) {
      tracker_.observe(id, now, t.gpu_util);
      pending_heartbeats_.push_back(HeartbeatSample{id, now, l->telemetry});
    }
    return fill(h, now);
  });
}

ApiResponse QuotaService::release(const Caller& c, int64_t id, const std::string& body) {
  const json j = parse_body(body);
  if (!j.is_object()) throw RequestError("body: must be a JSON object");
  Outcome outcome = Outcome::kCompleted;
  if (j.contains("outcome")) {
    if (!j["outcome"].is_string()) throw RequestError("outcome: has the wrong type");
    outcome = parse_outcome(j["outcome"].get<std::string>());
    if (outcome == Outcome::kNone) throw RequestError("outcome: must not be empty");
  }
  return locked([&] {
    const Lease* l = engine_.find(id);
    if (l == nullptr) return error(404, "unknown lease " + std::to_string(id));
    if (!can_act(c, *l)) return error(403, c.name + " may not release lease " + std::to_string(id));
    const int64_t now = clock_();
    const bool changed = engine_.release(id, outcome, now, c.name);
    ApiResponse r;
    r.body = lease_view(*engine_.find(id), now);
    r.body["released_now"] = changed;
    return r;
  });
}

ApiResponse QuotaService::decide(const Caller& c, int64_t approval_id, bool approve, const std::string& body) {
  const json j = parse_body(body);
  if (!j.is_object()) throw RequestError("body: must be a JSON object");
  std::string note;
  if (j.contains("note")) {
    if (!j["note"].is_string()) throw RequestError("note: has the wrong type");
    note = j["note"].get<std::string>().substr(0, 2000);
  }
  return locked([&] {
    const Approval* a = engine_.find_approval(approval_id);
    if (a == nullptr) return error(404, "unknown approval " + std::to_string(approval_id));
    if (!(c.role == Role::kAdmin || (c.role == Role::kLead && c.team == a->team))) {
      return error(403, "role: only a lead of team " + a->team + " (or an admin) decides approval " +
                            std::to_string(approval_id));
    }
    if (a->state != "pending") return error(409, "approval " + std::to_string(approval_id) + " is already " + a->state);
    const int64_t now = clock_();
    if (approve) {
      engine_.approve(approval_id, c.name, now, note);
    } else {
      engine_.reject(approval_id, c.name, now, note);
    }
    ApiResponse r;
    r.body = to_json(*engine_.find_approval(approval_id));
    r.body["lease"] = lease_view(*engine_.find(a->lease_id), now);
    return r;
  });
}

ApiResponse QuotaService::review(const Caller& c, int64_t id, const std::string& body) {
  if (c.role != Role::kAdmin) return error(403, "role: emergency reviews are for admins");
  const json j = parse_body(body);
  if (!j.is_object()) throw RequestError("body: must be a JSON object");
  std::string note;
  if (j.contains("note")) {
    if (!j["note"].is_string()) throw RequestError("note: has the wrong type");
    note = j["note"].get<std::string>().substr(0, 2000);
  }
  return locked([&] {
    const Lease* l = engine_.find(id);
    if (l == nullptr) return error(404, "unknown lease " + std::to_string(id));
    if (!l->review_pending) return error(409, "lease " + std::to_string(id) + " has no emergency review pending");
    engine_.review_emergency(id, c.name, clock_(), note);
    ApiResponse r;
    r.body = lease_view(*engine_.find(id), clock_());
    return r;
  });
}

ApiResponse QuotaService::list_approvals(const Caller& c) {
  if (c.role == Role::kMember) return error(403, "role: approvals are for team leads and admins");
  return locked([&] {
    json arr = json::array();
    for (const auto& [id, a] : engine_.approvals()) {
      if (c.role == Role::kAdmin || a.team == c.team) arr.push_back(to_json(a));
    }
    ApiResponse r;
    r.body = json{{"approvals", arr}};
    return r;
  });
}

ApiResponse QuotaService::teams(const Caller&) {
  return locked([&] {
    const int64_t now = clock_();
    json arr = json::array();
    for (const auto& t : engine_.teams(now)) {
      arr.push_back(json{{"name", t.name},
                         {"base", t.base},
                         {"burst", t.burst},
                         {"limit_now", t.limit_now},
                         {"in_burst_window", t.in_burst_window},
                         {"gpus_in_use", t.in_use},
                         {"leases_active", t.leases_active},
                         {"queued", t.queued},
                         {"pending_approval", t.pending_approval}});
    }
    ApiResponse r;
    r.body = json{{"teams", arr},
                  {"total_gpus", policy_.total_gpus()},
                  {"emergency_pool_gpus", policy_.emergency_pool_gpus()}};
    return r;
  });
}

ApiResponse QuotaService::audit(const Caller& c, const ApiRequest& req) {
  if (c.role == Role::kMember) return error(403, "role: the audit log is for team leads and admins");
  int64_t after = 0;
  size_t limit = 200;
  if (auto it = req.query.find("after"); it != req.query.end() && !parse_id(it->second, after) && it->second != "0") {
    throw RequestError("after: must be a sequence number");
  }
  if (auto it = req.query.find("limit"); it != req.query.end()) {
    int64_t v = 0;
    if (!parse_id(it->second, v)) throw RequestError("limit: must be a positive number");
    limit = size_t(std::min<int64_t>(v, 1000));
  }
  const std::string team = c.role == Role::kAdmin ? "" : c.team;
  std::vector<AuditEntry> entries;
  if (store_) {
    // flush pending state first so the log is complete
    locked([] { return ApiResponse{}; });
    std::lock_guard<std::mutex> db(db_mu_);
    entries = store_->audit(after, limit, team);
  } else {
    std::lock_guard<std::mutex> lk(mu_);
    for (const auto& a : engine_.audit()) {
      if (a.seq > after && (team.empty() || a.team == team) && entries.size() < limit) entries.push_back(a);
    }
  }
  json arr = json::array();
  for (const auto& a : entries) arr.push_back(to_json(a));
  ApiResponse r;
  r.body = json{{"audit", arr}};
  return r;
}

void QuotaService::observe(const std::function<void(const ServiceView&)>& fn) {
  std::lock_guard<std::mutex> lock(mu_);
  sync_tracker(engine_, tracker_);
  ServiceCounters counters;
  counters.heartbeats = heartbeats_total_.load();
  counters.preemptions = preemptions_total_.load();
  counters.emergency_grants = emergency_total_.load();
  for (size_t code = 0; code < responses_by_status_.size(); ++code) {
    if (const uint64_t count = responses_by_status_[code].load(); count > 0) counters.responses[int(code)] = count;
  }
  const ServiceView view{policy_, engine_, tracker_, counters, clock_()};
  fn(view);
}

}  // namespace yolo8::quota
