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
  ApiResponse response;
  response.status = status;
  response.body = json{{"error", status}, {"reason", reason}};
  return response;
}

std::vector<std::string> split_path(const std::string& path) {
  std::vector<std::string> parts;
  std::string current;
  for (char ch : path) {
    if (ch == '/') {
      if (!current.empty()) parts.push_back(current);
      current.clear();
    } else {
      current += ch;
    }
  }
  if (!current.empty()) parts.push_back(current);
  return parts;
}

// Digits only, so "12abc" or "-1" never name a lease.
bool parse_id(const std::string& text, int64_t& out) {
  if (text.empty() || text.size() > 15) return false;
  for (char ch : text) {
    if (ch < '0' || ch > '9') return false;
  }
  out = std::stoll(text);
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

// The optional free-text `note` of a decision or review body (at most 2000 characters kept).
std::string optional_note(const std::string& body) {
  const json body_json = parse_body(body);
  if (!body_json.is_object()) throw RequestError("body: must be a JSON object");
  if (!body_json.contains("note")) return "";
  if (!body_json["note"].is_string()) throw RequestError("note: has the wrong type");
  return body_json["note"].get<std::string>().substr(0, 2000);
}

}  // namespace

QuotaService::QuotaService(Policy policy, ServiceOptions options)
    : policy_(policy),
      options_(std::move(options)),
      engine_(std::move(policy)),
      tracker_(policy_.waste_gpu_util_below, static_cast<int64_t>(policy_.waste_after_s) * 1000) {
  clock_ = options_.clock ? options_.clock : system_now_ms;
  if (!options_.db_path.empty()) {
    store_ = std::make_unique<Store>(options_.db_path, options_.full_sync);
    if (!options_.reload_per_call) {
      const int64_t now = clock_();
      Snapshot snapshot = store_->load(now, options_.keep_ended_ms, 10000);
      engine_.restore(std::move(snapshot.leases), std::move(snapshot.approvals), std::move(snapshot.audit),
                      std::move(snapshot.usage), snapshot.next_audit_seq, now);
      replay_heartbeats(options_.db_path, engine_, tracker_);  // the waste list survives a restart
    }
  }
}

void QuotaService::reload_locked(int64_t now_ms) {
  Snapshot snapshot =
      store_->load(now_ms, static_cast<int64_t>(policy_.ttl_s + policy_.expiry_grace_s) * 1000 + 3600 * 1000, 0);
  engine_.restore(std::move(snapshot.leases), std::move(snapshot.approvals), {}, std::move(snapshot.usage),
                  snapshot.next_audit_seq, 0);
}

void QuotaService::persist_locked() {
  Changes changes = engine_.take_changes();
  for (const auto& entry : changes.audit) {
    if (entry.action == "preempt.revoke") ++preemptions_total_;
    if (entry.action == "emergency.granted") ++emergency_total_;
  }
  if (!store_) return;
  std::lock_guard<std::mutex> store_lock(store_mutex_);
  try {
    store_->write(engine_, changes);
  } catch (const StoreError&) {
    ++storage_write_errors_;
    throw;
  }
}

ApiResponse QuotaService::locked(const std::function<ApiResponse()>& op) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (store_ && options_.reload_per_call) {
    std::lock_guard<std::mutex> store_lock(store_mutex_);
    store_->begin_immediate();
    try {
      const int64_t now = clock_();
      reload_locked(now);
      engine_.tick(now);
      ApiResponse response = op();
      Changes changes = engine_.take_changes();
      store_->write(engine_, changes);
      store_->write_heartbeats(pending_heartbeats_);
      pending_heartbeats_.clear();
      store_->commit();
      return response;
    } catch (...) {
      pending_heartbeats_.clear();
      store_->rollback();
      throw;
    }
  }
  ApiResponse response = op();
  persist_locked();
  return response;
}

void QuotaService::tick() {
  if (store_ && options_.reload_per_call) {
    locked([] { return ApiResponse{}; });
    return;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  const int64_t now = clock_();
  engine_.tick(now);
  engine_.prune(now, options_.keep_ended_ms);
  sync_tracker(engine_, tracker_);  // ended runs closed, pruned leases dropped, even without scrapes
  persist_locked();
}

void QuotaService::flush_heartbeats() {
  std::vector<HeartbeatSample> batch;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    batch.swap(pending_heartbeats_);
  }
  if (!store_ || batch.empty()) return;
  std::lock_guard<std::mutex> store_lock(store_mutex_);
  try {
    store_->write_heartbeats(batch);
  } catch (const StoreError&) {
    ++storage_write_errors_;
    throw;
  }
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

bool QuotaService::can_read(const Caller& caller, const Lease& lease) const {
  return caller.role == Role::kAdmin || lease.req.team == caller.team;
}

bool QuotaService::can_act(const Caller& caller, const Lease& lease) const {
  return caller.role == Role::kAdmin || lease.req.user == caller.name ||
         (caller.role == Role::kLead && lease.req.team == caller.team);
}

json QuotaService::lease_view(const Lease& lease, int64_t now_ms) const {
  json view = to_json(lease, policy_);
  view["ttl_s"] = policy_.ttl_s;
  view["heartbeat_interval_s"] = policy_.heartbeat_interval_s;
  view["preempt_grace_s"] = policy_.preempt_grace_s;
  view["expiry_grace_s"] = policy_.expiry_grace_s;
  if (lease.state == LeaseState::kQueued) {
    const AcquireResult status = engine_.status_of(lease.id, now_ms);
    view["position"] = status.position;
    view["reason"] = status.reason;
  }
  if (lease.state == LeaseState::kRevoking) view["deadline_in_ms"] = std::max<int64_t>(0, lease.deadline_ms - now_ms);
  return view;
}

ApiResponse QuotaService::handle(const ApiRequest& req_in) {
  ApiResponse response;
  try {
    ApiRequest req = req_in;
    // in-process callers may pass "path?k=v&k2=v2"
    if (const auto query_start = req.path.find('?'); query_start != std::string::npos) {
      std::string rest = req.path.substr(query_start + 1);
      req.path.resize(query_start);
      size_t pos = 0;
      while (pos <= rest.size()) {
        const size_t amp = std::min(rest.find('&', pos), rest.size());
        const std::string pair = rest.substr(pos, amp - pos);
        const size_t equals = pair.find('=');
        if (!pair.empty()) {
          req.query[pair.substr(0, equals)] = equals == std::string::npos ? "" : pair.substr(equals + 1);
        }
        pos = amp + 1;
      }
    }
    response = route(req);
  } catch (const RequestError& exception) {
    response = error(400, exception.what());
  } catch (const PolicyError& exception) {
    response = error(400, exception.what());
  } catch (const json::exception& exception) {
    response = error(400, std::string("body: ") + exception.what());
  } catch (const StoreError& exception) {
    response = error(503, std::string("storage: ") + exception.what());
  } catch (const std::exception& exception) {
    response = error(500, exception.what());
  }
  if (response.status >= 0 && response.status < static_cast<int>(responses_by_status_.size())) {
    ++responses_by_status_[static_cast<size_t>(response.status)];
  }
  return response;
}

ApiResponse QuotaService::route(const ApiRequest& req) {
  const auto parts = split_path(req.path);
  const bool get = req.method == "GET";
  const bool post = req.method == "POST";
  if (parts.size() == 1 && parts[0] == "healthz") {
    ApiResponse response;
    response.body = json{{"status", "ok"}, {"time_ms", clock_()}};
    return response;
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
    const User* user = policy_.find_user_by_token(req.token);
    if (user == nullptr) return error(401, "authorization: unknown token");
    caller.name = user->name;
    caller.team = user->team;
    caller.role = user->role;
  }

  int64_t id = 0;
  const size_t part_count = parts.size();
  if (part_count >= 2 && parts[1] == "leases") {
    if (part_count == 2 && post) return acquire(caller, req);
    if (part_count == 2 && get) return list_leases(caller, req);
    if (part_count >= 3 && !parse_id(parts[2], id)) return error(404, "unknown lease '" + parts[2] + "'");
    if (part_count == 3 && get) return get_lease(caller, id);
    if (part_count == 4 && post && parts[3] == "heartbeat") return heartbeat(caller, id, req.body);
    if (part_count == 4 && post && parts[3] == "release") return release(caller, id, req.body);
    if (part_count == 4 && post && parts[3] == "review") return review(caller, id, req.body);
  } else if (part_count >= 2 && parts[1] == "approvals") {
    if (part_count == 2 && get) return list_approvals(caller);
    if (part_count >= 3 && !parse_id(parts[2], id)) return error(404, "unknown approval '" + parts[2] + "'");
    if (part_count == 4 && post && (parts[3] == "approve" || parts[3] == "reject")) {
      return decide(caller, id, parts[3] == "approve", req.body);
    }
  } else if (part_count == 2 && parts[1] == "teams" && get) {
    return teams(caller);
  } else if (part_count == 2 && parts[1] == "audit" && get) {
    return audit(caller, req);
  }
  return error(404, "no such endpoint: " + req.method + " " + req.path);
}

ApiResponse QuotaService::acquire(const Caller& caller, const ApiRequest& req) {
  LeaseRequest request = lease_request_from_json(parse_body(req.body));
  if (request.team.empty()) request.team = caller.team;
  if (request.user.empty()) request.user = caller.name;
  if (!req.idempotency_key.empty()) {
    if (req.idempotency_key.size() > 128) throw RequestError("Idempotency-Key: longer than 128 characters");
    request.idempotency_key = req.idempotency_key;
  }
  if (caller.role != Role::kAdmin) {
    if (request.team != caller.team) return error(403, "team: " + caller.name + " acts only for team " + caller.team);
    if (request.user != caller.name) {
      return error(403, "user: " + caller.name + " cannot request a lease for " + request.user);
    }
  }
  return locked([&] {
    const int64_t now = clock_();
    const AcquireResult result = engine_.acquire(request, now);
    ApiResponse response;
    json& body = response.body;
    body["lease_id"] = result.lease_id;
    body["replayed"] = result.replayed;
    if (!result.reason.empty()) body["reason"] = result.reason;
    body["status"] = to_string(result.kind);
    switch (result.kind) {
      case AcquireResult::Kind::kGranted:
        response.status = 201;
        body["lease"] = lease_view(*engine_.find(result.lease_id), now);
        break;
      case AcquireResult::Kind::kQueued:
        response.status = 202;
        body["position"] = result.position;
        body["poll"] = "/v1/leases/" + std::to_string(result.lease_id);
        break;
      case AcquireResult::Kind::kNeedsApproval:
        response.status = 403;
        body["approval_id"] = result.approval_id;
        body["poll"] = "/v1/leases/" + std::to_string(result.lease_id);
        break;
      case AcquireResult::Kind::kNotAllowed: response.status = 403; break;
      case AcquireResult::Kind::kAdmissionRefused:
        response.status = 422;
        body["max_batch"] = result.max_batch;
        body["needed_gib"] = result.needed_gib;
        break;
      case AcquireResult::Kind::kCreditsSpent: response.status = 429; break;
      case AcquireResult::Kind::kInvalid: response.status = 400; break;
    }
    if (result.lease_id == 0) body.erase("lease_id");
    return response;
  });
}

ApiResponse QuotaService::get_lease(const Caller& caller, int64_t id) {
  return locked([&] {
    const int64_t now = clock_();
    const Lease* lease = engine_.find(id);
    if (lease == nullptr) return error(404, "unknown lease " + std::to_string(id));
    if (!can_read(caller, *lease)) {
      return error(403, "lease " + std::to_string(id) + " belongs to team " + lease->req.team);
    }
    // polling keeps a queued request alive
    if (can_act(caller, *lease) &&
        (lease->state == LeaseState::kQueued || lease->state == LeaseState::kPendingApproval)) {
      engine_.heartbeat(id, {}, now);
    }
    ApiResponse response;
    response.body = lease_view(*engine_.find(id), now);
    return response;
  });
}

ApiResponse QuotaService::list_leases(const Caller& caller, const ApiRequest& req) {
  auto state = req.query.find("state");
  return locked([&] {
    const int64_t now = clock_();
    json items = json::array();
    for (const auto& [id, lease] : engine_.leases()) {
      if (!can_read(caller, lease)) continue;
      if (state != req.query.end() && to_string(lease.state) != state->second) continue;
      if (state == req.query.end() && is_terminal(lease.state)) continue;
      items.push_back(lease_view(lease, now));
    }
    ApiResponse response;
    response.body = json{{"leases", items}};
    return response;
  });
}

ApiResponse QuotaService::heartbeat(const Caller& caller, int64_t id, const std::string& body) {
  const Telemetry telemetry = telemetry_from_json(parse_body(body));
  auto fill = [&](const HeartbeatResult& beat, int64_t now) {
    ApiResponse response;
    response.body = json{{"lease_id", id},
                         {"state", to_string(beat.state)},
                         {"heartbeat_interval_s", policy_.heartbeat_interval_s},
                         {"ttl_s", policy_.ttl_s}};
    if (beat.state == LeaseState::kRevoking) {
      response.body["deadline_ms"] = beat.deadline_ms;
      response.body["deadline_in_ms"] = std::max<int64_t>(0, beat.deadline_ms - now);
    }
    if (beat.state == LeaseState::kQueued) response.body["position"] = beat.position;
    if (!beat.reason.empty()) response.body["reason"] = beat.reason;
    return response;
  };
  if (!store_ || !options_.reload_per_call) {
    // hot path: memory only; the sample reaches the database with the next batched flush
    ApiResponse response;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      const Lease* lease = engine_.find(id);
      if (lease == nullptr) return error(404, "unknown lease " + std::to_string(id));
      if (!can_act(caller, *lease)) return error(403, caller.name + " may not heartbeat lease " + std::to_string(id));
      const int64_t now = clock_();
      const HeartbeatResult beat = engine_.heartbeat(id, telemetry, now);
      ++heartbeats_total_;
      if (beat.state == LeaseState::kGranted || beat.state == LeaseState::kRevoking) {
        tracker_.observe(id, now, telemetry.gpu_util);
      }
      if (store_ && (beat.state == LeaseState::kGranted || beat.state == LeaseState::kRevoking)) {
        pending_heartbeats_.push_back(HeartbeatSample{id, now, lease->telemetry});
      }
      response = fill(beat, now);
    }
    if (options_.write_each_heartbeat) flush_heartbeats();
    return response;
  }
  return locked([&] {
    const Lease* lease = engine_.find(id);
    if (lease == nullptr) return error(404, "unknown lease " + std::to_string(id));
    if (!can_act(caller, *lease)) return error(403, caller.name + " may not heartbeat lease " + std::to_string(id));
    const int64_t now = clock_();
    const HeartbeatResult beat = engine_.heartbeat(id, telemetry, now);
    ++heartbeats_total_;
    if (beat.state == LeaseState::kGranted || beat.state == LeaseState::kRevoking) {
      tracker_.observe(id, now, telemetry.gpu_util);
      pending_heartbeats_.push_back(HeartbeatSample{id, now, lease->telemetry});
    }
    return fill(beat, now);
  });
}

ApiResponse QuotaService::release(const Caller& caller, int64_t id, const std::string& body) {
  const json body_json = parse_body(body);
  if (!body_json.is_object()) throw RequestError("body: must be a JSON object");
  Outcome outcome = Outcome::kCompleted;
  if (body_json.contains("outcome")) {
    if (!body_json["outcome"].is_string()) throw RequestError("outcome: has the wrong type");
    outcome = parse_outcome(body_json["outcome"].get<std::string>());
    if (outcome == Outcome::kNone) throw RequestError("outcome: must not be empty");
  }
  return locked([&] {
    const Lease* lease = engine_.find(id);
    if (lease == nullptr) return error(404, "unknown lease " + std::to_string(id));
    if (!can_act(caller, *lease)) return error(403, caller.name + " may not release lease " + std::to_string(id));
    const int64_t now = clock_();
    const bool changed = engine_.release(id, outcome, now, caller.name);
    ApiResponse response;
    response.body = lease_view(*engine_.find(id), now);
    response.body["released_now"] = changed;
    return response;
  });
}

ApiResponse QuotaService::decide(const Caller& caller, int64_t approval_id, bool approve, const std::string& body) {
  const std::string note = optional_note(body);
  return locked([&] {
    const Approval* approval = engine_.find_approval(approval_id);
    if (approval == nullptr) return error(404, "unknown approval " + std::to_string(approval_id));
    if (!(caller.role == Role::kAdmin || (caller.role == Role::kLead && caller.team == approval->team))) {
      return error(403, "role: only a lead of team " + approval->team + " (or an admin) decides approval " +
                            std::to_string(approval_id));
    }
    if (approval->state != ApprovalState::kPending) {
      return error(409, "approval " + std::to_string(approval_id) + " is already " + to_string(approval->state));
    }
    const int64_t now = clock_();
    if (approve) {
      engine_.approve(approval_id, caller.name, now, note);
    } else {
      engine_.reject(approval_id, caller.name, now, note);
    }
    ApiResponse response;
    response.body = to_json(*engine_.find_approval(approval_id));
    response.body["lease"] = lease_view(*engine_.find(approval->lease_id), now);
    return response;
  });
}

ApiResponse QuotaService::review(const Caller& caller, int64_t id, const std::string& body) {
  if (caller.role != Role::kAdmin) return error(403, "role: emergency reviews are for admins");
  const std::string note = optional_note(body);
  return locked([&] {
    const Lease* lease = engine_.find(id);
    if (lease == nullptr) return error(404, "unknown lease " + std::to_string(id));
    if (!lease->review_pending) return error(409, "lease " + std::to_string(id) + " has no emergency review pending");
    engine_.review_emergency(id, caller.name, clock_(), note);
    ApiResponse response;
    response.body = lease_view(*engine_.find(id), clock_());
    return response;
  });
}

ApiResponse QuotaService::list_approvals(const Caller& caller) {
  if (caller.role == Role::kMember) return error(403, "role: approvals are for team leads and admins");
  return locked([&] {
    json items = json::array();
    for (const auto& [id, approval] : engine_.approvals()) {
      if (caller.role == Role::kAdmin || approval.team == caller.team) items.push_back(to_json(approval));
    }
    ApiResponse response;
    response.body = json{{"approvals", items}};
    return response;
  });
}

ApiResponse QuotaService::teams(const Caller&) {
  return locked([&] {
    const int64_t now = clock_();
    json items = json::array();
    for (const auto& team : engine_.teams(now)) {
      items.push_back(json{{"name", team.name},
                           {"base", team.base},
                           {"burst", team.burst},
                           {"limit_now", team.limit_now},
                           {"in_burst_window", team.in_burst_window},
                           {"gpus_in_use", team.in_use},
                           {"leases_active", team.leases_active},
                           {"queued", team.queued},
                           {"pending_approval", team.pending_approval}});
    }
    ApiResponse response;
    response.body = json{
        {"teams", items}, {"total_gpus", policy_.total_gpus()}, {"emergency_pool_gpus", policy_.emergency_pool_gpus()}};
    return response;
  });
}

ApiResponse QuotaService::audit(const Caller& caller, const ApiRequest& req) {
  if (caller.role == Role::kMember) return error(403, "role: the audit log is for team leads and admins");
  int64_t after = 0;
  size_t limit = 200;
  if (auto it = req.query.find("after"); it != req.query.end() && !parse_id(it->second, after) && it->second != "0") {
    throw RequestError("after: must be a sequence number");
  }
  if (auto it = req.query.find("limit"); it != req.query.end()) {
    int64_t number = 0;
    if (!parse_id(it->second, number)) throw RequestError("limit: must be a positive number");
    limit = static_cast<size_t>(std::min<int64_t>(number, 1000));
  }
  const std::string team = caller.role == Role::kAdmin ? "" : caller.team;
  std::vector<AuditEntry> entries;
  if (store_) {
    // flush pending state first so the log is complete
    locked([] { return ApiResponse{}; });
    std::lock_guard<std::mutex> store_lock(store_mutex_);
    entries = store_->audit(after, limit, team);
  } else {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& entry : engine_.audit()) {
      if (entry.seq > after && (team.empty() || entry.team == team) && entries.size() < limit) entries.push_back(entry);
    }
  }
  json items = json::array();
  for (const auto& entry : entries) items.push_back(to_json(entry));
  ApiResponse response;
  response.body = json{{"audit", items}};
  return response;
}

void QuotaService::observe(const std::function<void(const ServiceView&)>& fn) {
  std::lock_guard<std::mutex> lock(mutex_);
  sync_tracker(engine_, tracker_);
  ServiceCounters counters;
  counters.heartbeats = heartbeats_total_.load();
  counters.preemptions = preemptions_total_.load();
  counters.emergency_grants = emergency_total_.load();
  counters.storage_write_errors = storage_write_errors_.load();
  for (size_t code = 0; code < responses_by_status_.size(); ++code) {
    if (const uint64_t count = responses_by_status_[code].load(); count > 0) {
      counters.responses[static_cast<int>(code)] = count;
    }
  }
  const ServiceView view{policy_, engine_, tracker_, counters, clock_()};
  fn(view);
}

}  // namespace yolo8::quota
