#include "quota/service/service.h"

#include <algorithm>
#include <cstdio>
#include <memory>
#include <utility>

#include "quota/core/codec.h"

namespace yolo8::quota {

using nlohmann::json;

namespace {

constexpr int kRetryAfterS = 2;

// The store the options name; none for a state in memory only.
std::unique_ptr<StateStore> open_service_store(const ServiceOptions& options) {
  if (options.db_path.empty()) return nullptr;
  return open_store(parse_db_target(options.db_path),
                    {options.full_sync, options.store_busy_timeout_ms, options.db_password_file});
}

// Replicas on PostgreSQL elect their leader; none on SQLite (one writer per file) or in memory.
std::unique_ptr<PostgresLeadership> open_service_leadership(const ServiceOptions& options) {
  if (options.db_path.empty() || options.reload_per_call) return nullptr;
  return open_leadership(parse_db_target(options.db_path),
                         {options.full_sync, options.store_busy_timeout_ms, options.db_password_file},
                         options.replica_address);
}

json parse_body(const std::string& body) { return parse_request_body(body); }

// The optional free-text `note` of a decision or review body (at most 2000 characters kept).
std::string optional_note(const std::string& body) {
  const json body_json = parse_body(body);
  if (!body_json.is_object()) throw RequestError("body: must be a JSON object");
  if (!body_json.contains("note")) return "";
  if (!body_json["note"].is_string()) throw RequestError("note: has the wrong type");
  std::string note = body_json["note"].get<std::string>();
  if (note.size() > 2000) throw RequestError("note: longer than 2000 characters");
  check_text("note", note, true);
  return note;
}

}  // namespace

QuotaService::QuotaService(Policy policy, ServiceOptions options)
    : policy_(policy),
      options_(std::move(options)),
      board_(options_.max_pending_heartbeats),
      host_(std::move(policy), options_, open_service_store(options_), board_, open_service_leadership(options_)) {}

void QuotaService::tick() {
  if (host_.mode() == EngineMode::kLocal) {
    host_.tick({});  // failed authentications are audited by quotad's tick, not by local mode's calls
    return;
  }
  const std::map<std::string, int> attempts = gate_.take_unreported();
  try {
    host_.tick(attempts);
  } catch (...) {
    gate_.put_back_unreported(attempts);  // not saved: reported with the next tick
    throw;
  }
}

void QuotaService::flush_heartbeats() { host_.flush_heartbeats(); }

std::vector<std::string> QuotaService::check_invariants() {
  std::vector<std::string> errors;
  read_locked([&] {
    errors = engine().check_invariants(now());
    return ApiResponse{};
  });
  return errors;
}

void QuotaService::inspect(const std::function<void(const Engine&)>& fn) {
  read_locked([&] {
    fn(engine());
    return ApiResponse{};
  });
}

bool QuotaService::can_read(const Caller& caller, const Lease& lease) const {
  return caller.role == Role::kAdmin || lease.req.team == caller.team;
}

bool QuotaService::can_act(const Caller& caller, const Lease& lease) const {
  return may_act(caller, lease.req.user, lease.req.team);
}

json QuotaService::lease_view(const Lease& lease, int64_t now_ms) {
  json view = to_json(lease, policy_);
  // the held GPUs' UUIDs where the inventory lists them: what the trainer can find its devices by
  json uuids = json::array();
  for (const int device : lease.devices) {
    if (device >= 0 && static_cast<size_t>(device) < policy_.gpus.size() &&
        !policy_.gpus[static_cast<size_t>(device)].uuid.empty()) {
      uuids.push_back(policy_.gpus[static_cast<size_t>(device)].uuid);
    }
  }
  if (!uuids.empty() && uuids.size() == lease.devices.size()) view["device_uuids"] = uuids;
  view["ttl_s"] = policy_.ttl_s;
  view["heartbeat_interval_s"] = policy_.heartbeat_interval_s;
  view["preempt_grace_s"] = policy_.preempt_grace_s;
  view["expiry_grace_s"] = policy_.expiry_grace_s;
  if (lease.state == LeaseState::kQueued) {
    // the position from the board (the queue is sorted once per change, not once per lease shown)
    const int position = board_.position(lease.id);
    view["position"] = position > 0 ? position : engine().queue_position(lease.id);
    view["reason"] = engine().waiting_reason(lease.id, now_ms);
  }
  if (lease.state == LeaseState::kRevoking) view["deadline_in_ms"] = std::max<int64_t>(0, lease.deadline_ms - now_ms);
  return view;
}

bool QuotaService::accepts_token(const std::string& token) const {
  std::shared_lock<std::shared_mutex> policy_lock(policy_mutex_);
  return policy_.find_user_by_token(token, now()) != nullptr;
}

std::string QuotaService::reload_policy(Policy next) {
  std::unique_lock<std::shared_mutex> policy_lock(policy_mutex_);
  std::string summary;
  try {
    locked([&] {
      summary = policy_change_summary(policy_, next);
      engine().replace_policy(next);  // throws before anything changed
      policy_ = std::move(next);
      engine().note(host_.now(), "quotad", "policy.reloaded",
                    policy_.source + ": " + (summary.empty() ? "no change to teams, users or limits" : summary));
      return ApiResponse{};
    });
  } catch (const Unavailable& error) {
    // the policy is in force; only its audit entry could not be stored
    std::fprintf(stderr, "quotad: %s: policy reloaded, its audit entry not stored: %s\n", policy_.source.c_str(),
                 error.what());
  }
  return summary;
}

void QuotaService::audit_note(const std::string& action, const std::string& detail) {
  try {
    locked([&] {
      engine().note(host_.now(), "quotad", action, detail);
      return ApiResponse{};
    });
  } catch (const std::exception& error) {
    std::fprintf(stderr, "quotad: audit entry %s not stored: %s\n", action.c_str(), error.what());
  }
}

ApiResponse QuotaService::handle(const ApiRequest& req_in) {
  // the whole request under one policy: a reload waits for the requests in flight
  std::shared_lock<std::shared_mutex> policy_lock(policy_mutex_);
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
    response = Router::dispatch(*this, req,
                                [&](const ApiRequest& request) { return gate_.authenticate(policy_, request, now()); });
  } catch (const RequestError& exception) {
    response = error_response(400, exception.what());
  } catch (const PolicyError& exception) {
    response = error_response(400, exception.what());
  } catch (const json::exception& exception) {
    response = error_response(400, std::string("body: ") + exception.what());
  } catch (const StoreError& exception) {
    response = error_response(503, std::string("storage: ") + exception.what());
    response.headers["Retry-After"] = std::to_string(kRetryAfterS);
  } catch (const Unavailable& exception) {
    response = error_response(503, exception.what());
    response.headers["Retry-After"] = std::to_string(kRetryAfterS);
    // a follower names the leader, so clients go there at once
    if (!serves_state(host_.mode())) {
      const std::string leader = host_.leader();
      response.body["error"] = exception.what();
      response.body["leader"] = leader.empty() ? json(nullptr) : json(leader);
    }
  } catch (const std::exception& exception) {
    response = error_response(500, exception.what());
  }
  if (response.status >= 0 && response.status < static_cast<int>(responses_by_status_.size())) {
    ++responses_by_status_[static_cast<size_t>(response.status)];
  }
  return response;
}

ApiResponse QuotaService::healthz() {
  ApiResponse response;
  response.body = json{{"status", "ok"}, {"time_ms", now()}};
  return response;
}

ApiResponse readiness_answer(bool serves, const std::string& role, const std::string& leader) {
  ApiResponse response;
  response.body = json{{"ready", serves}, {"role", role}};
  if (!serves) {
    response.status = 503;
    response.headers["Retry-After"] = std::to_string(kRetryAfterS);
    response.body["leader"] = leader.empty() ? json(nullptr) : json(leader);
  }
  return response;
}

ApiResponse QuotaService::readyz() {
  const EngineMode mode = host_.mode();
  return readiness_answer(serves_state(mode), to_string(mode), host_.leader());
}

ApiResponse QuotaService::acquire(const Caller& caller, const ApiRequest& req) {
  LeaseRequest request = lease_request_from_json(parse_body(req.body));
  if (request.team.empty()) request.team = caller.team;
  if (request.user.empty()) request.user = caller.name;
  if (!req.idempotency_key.empty()) {
    if (req.idempotency_key.size() > 128) throw RequestError("Idempotency-Key: longer than 128 characters");
    request.idempotency_key = req.idempotency_key;
  }
  request.requested_by = request.user == caller.name ? "" : caller.name;  // never from the body
  if (caller.role != Role::kAdmin) {
    if (request.team != caller.team)
      return error_response(403, "team: " + caller.name + " acts only for team " + caller.team);
    if (request.user != caller.name) {
      return error_response(403, "user: " + caller.name + " cannot request a lease for " + request.user);
    }
  }
  return locked([&] {
    const int64_t now = host_.now();
    const AcquireResult result = engine().acquire(request, now);
    ApiResponse response;
    json& body = response.body;
    body["lease_id"] = result.lease_id;
    body["replayed"] = result.replayed;
    if (!result.reason.empty()) body["reason"] = result.reason;
    // which memory table row admission used, so a surprising answer can be traced to its figures
    if (!result.memory_row.empty()) body["memory_row"] = result.memory_row;
    body["status"] = to_string(result.kind);
    switch (result.kind) {
      case AcquireResult::Kind::kGranted: {
        response.status = 201;
        const Lease& lease = *engine().find(result.lease_id);
        body["lease"] = lease_view(lease, now);
        // signed: kept by the client, presented should a restored database lack the lease (reattach)
        body["lease"]["receipt"] = to_json(receipt_of(lease, policy_, host_.receipt_key()));
        break;
      }
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
      case AcquireResult::Kind::kCreditsSpent:
      case AcquireResult::Kind::kTooManyQueued: response.status = 429; break;
      case AcquireResult::Kind::kInvalid: response.status = 400; break;
    }
    if (result.lease_id == 0) body.erase("lease_id");
    return response;
  });
}

ApiResponse QuotaService::get_lease(const Caller& caller, int64_t id) {
  return read_locked([&] {
    const int64_t now = host_.now();
    const Lease* lease = engine().find(id);
    if (lease == nullptr) return error_response(404, "unknown lease " + std::to_string(id));
    if (!can_read(caller, *lease)) {
      return error_response(403, "lease " + std::to_string(id) + " belongs to team " + lease->req.team);
    }
    // polling keeps a queued request alive
    if (can_act(caller, *lease) &&
        (lease->state == LeaseState::kQueued || lease->state == LeaseState::kPendingApproval)) {
      engine().heartbeat(id, {}, now);
    }
    ApiResponse response;
    response.body = lease_view(*engine().find(id), now);
    // a request that waited gets its receipt when it polls the grant
    if (const Lease& held = *engine().find(id);
        can_act(caller, held) && (held.state == LeaseState::kGranted || held.state == LeaseState::kRevoking)) {
      response.body["receipt"] = to_json(receipt_of(held, policy_, host_.receipt_key()));
    }
    return response;
  });
}

ApiResponse QuotaService::list_leases(const Caller& caller, const ApiRequest& req) {
  auto state = req.query.find("state");
  return read_locked([&] {
    const int64_t now = host_.now();
    json items = json::array();
    for (const auto& [id, lease] : engine().leases()) {
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
  // a follower's board is not the state: heartbeats go to the leader
  if (!serves_state(host_.mode())) throw Unavailable(host_.follower_refusal());
  if (host_.mode() != EngineMode::kLocal) {
    // hot path: answered from the board, never waiting for the engine lock or the database; the report
    // reaches the engine at the next locked call (or tick) and the database with the next batch
    const int64_t now = host_.now();
    HeartbeatResult result;
    switch (board_.beat(caller, id, telemetry, now, host_.monotonic_now(), host_.has_store(), result)) {
      case HeartbeatBoard::Answer::kUnknownLease: return error_response(404, "unknown lease " + std::to_string(id));
      case HeartbeatBoard::Answer::kForbidden:
        return error_response(403, caller.name + " may not heartbeat lease " + std::to_string(id));
      case HeartbeatBoard::Answer::kAnswered: break;
    }
    ++heartbeats_total_;
    ApiResponse response = fill(result, now);
    if (options_.write_each_heartbeat) flush_heartbeats();
    return response;
  }
  return locked([&] {
    const Lease* lease = engine().find(id);
    if (lease == nullptr) return error_response(404, "unknown lease " + std::to_string(id));
    if (!can_act(caller, *lease))
      return error_response(403, caller.name + " may not heartbeat lease " + std::to_string(id));
    const int64_t now = host_.now();
    const HeartbeatResult beat = engine().heartbeat(id, telemetry, now);
    ++heartbeats_total_;
    if (beat.state == LeaseState::kGranted || beat.state == LeaseState::kRevoking) {
      host_.tracker().observe(id, now, telemetry.gpu_util);
      board_.add_sample(HeartbeatSample{id, now, lease->telemetry});
    }
    return fill(beat, now);
  });
}

ApiResponse QuotaService::reattach(const Caller& caller, int64_t id, const std::string& body) {
  const json body_json = parse_body(body);
  if (!body_json.is_object()) throw RequestError("body: must be a JSON object");
  if (!body_json.contains("receipt")) throw RequestError("receipt: required (the grant receipt quotad signed)");
  const LeaseReceipt receipt = receipt_from_json(body_json["receipt"]);
  if (receipt.lease_id != id) {
    return error_response(
        400, "receipt: it is lease " + std::to_string(receipt.lease_id) + "'s, not lease " + std::to_string(id) + "'s");
  }
  return locked([&] {
    const int64_t now = host_.now();
    const bool recorded = engine().find(id) == nullptr && host_.lease_recorded(id);
    const ReattachResult result = engine().reattach(receipt, host_.receipt_key(), caller.name, recorded, now);
    switch (result.kind) {
      case ReattachResult::Kind::kReattached: break;
      case ReattachResult::Kind::kBadSignature: return error_response(400, result.reason);
      case ReattachResult::Kind::kWrongUser: return error_response(403, result.reason);
      case ReattachResult::Kind::kHeld:
      case ReattachResult::Kind::kCurrentEpoch:
      case ReattachResult::Kind::kDevicesTaken:
      case ReattachResult::Kind::kNotAdmitted: return error_response(409, result.reason);
    }
    ApiResponse response;
    response.body = json{{"lease_id", id},
                         {"state", to_string(LeaseState::kGranted)},
                         {"heartbeat_interval_s", policy_.heartbeat_interval_s},
                         {"ttl_s", policy_.ttl_s},
                         {"reattached", true}};
    return response;
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
    const Lease* lease = engine().find(id);
    if (lease == nullptr) return error_response(404, "unknown lease " + std::to_string(id));
    if (!can_act(caller, *lease))
      return error_response(403, caller.name + " may not release lease " + std::to_string(id));
    const int64_t now = host_.now();
    const bool changed = engine().release(id, outcome, now, caller.name);
    ApiResponse response;
    response.body = lease_view(*engine().find(id), now);
    response.body["released_now"] = changed;
    return response;
  });
}

ApiResponse QuotaService::decide(const Caller& caller, int64_t approval_id, bool approve, const std::string& body) {
  const std::string note = optional_note(body);
  return locked([&] {
    const Approval* approval = engine().find_approval(approval_id);
    if (approval == nullptr) return error_response(404, "unknown approval " + std::to_string(approval_id));
    if (!(caller.role == Role::kAdmin || (caller.role == Role::kLead && caller.team == approval->team))) {
      return error_response(403, "role: only a lead of team " + approval->team + " (or an admin) decides approval " +
                                     std::to_string(approval_id));
    }
    if (approval->user == caller.name) {
      return error_response(403, "role: " + caller.name + " cannot decide their own request (approval " +
                                     std::to_string(approval_id) + "); another lead of team " + approval->team +
                                     " or an admin does");
    }
    if (approval->state != ApprovalState::kPending) {
      return error_response(409,
                            "approval " + std::to_string(approval_id) + " is already " + to_string(approval->state));
    }
    const int64_t now = host_.now();
    if (approve) {
      engine().approve(approval_id, caller.name, now, note);
    } else {
      engine().reject(approval_id, caller.name, now, note);
    }
    ApiResponse response;
    response.body = to_json(*engine().find_approval(approval_id));
    response.body["lease"] = lease_view(*engine().find(approval->lease_id), now);
    return response;
  });
}

ApiResponse QuotaService::review(const Caller& caller, int64_t id, const std::string& body) {
  if (caller.role != Role::kAdmin) return error_response(403, "role: emergency reviews are for admins");
  const std::string note = optional_note(body);
  return locked([&] {
    const Lease* lease = engine().find(id);
    if (lease == nullptr) return error_response(404, "unknown lease " + std::to_string(id));
    if (!lease->review_pending)
      return error_response(409, "lease " + std::to_string(id) + " has no emergency review pending");
    engine().review_emergency(id, caller.name, host_.now(), note);
    ApiResponse response;
    response.body = lease_view(*engine().find(id), host_.now());
    return response;
  });
}

ApiResponse QuotaService::list_approvals(const Caller& caller) {
  if (caller.role == Role::kMember) return error_response(403, "role: approvals are for team leads and admins");
  return read_locked([&] {
    json items = json::array();
    for (const auto& [id, approval] : engine().approvals()) {
      if (caller.role == Role::kAdmin || approval.team == caller.team) items.push_back(to_json(approval));
    }
    ApiResponse response;
    response.body = json{{"approvals", items}};
    return response;
  });
}

ApiResponse QuotaService::teams(const Caller&) {
  return read_locked([&] {
    const int64_t now = host_.now();
    json items = json::array();
    for (const auto& team : engine().teams(now)) {
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

// The queue in order with each request's reason and fair-share standing; the same names and figures
// the status page shows, so any authenticated caller may read it (never justifications).
ApiResponse QuotaService::queue(const Caller&) {
  return read_locked([&] {
    const int64_t now = host_.now();
    json items = json::array();
    int position = 0;
    for (int64_t id : engine().queue_ids()) {
      const Lease* lease = engine().find(id);
      ++position;
      if (lease == nullptr) continue;
      const FairShare share = engine().fair_share(lease->req.team, lease->req.user, now);
      json item{{"position", position},
                {"lease_id", id},
                {"team", lease->req.team},
                {"user", lease->req.user},
                {"job", lease->req.job},
                {"gpus", lease->gpus},
                {"max_gpus", lease->req.max_gpus},
                {"shared", lease->shared},
                {"priority", to_string(lease->req.priority)},
                {"waited_s", std::max<int64_t>(0, now - lease->created_ms) / 1000},
                {"reason", engine().waiting_reason(id, now)}};
      if (policy_.fair_share_half_life_h > 0) {
        item["fair_share"] = json{{"factor", share.factor},
                                  {"team_gpu_hours", share.team_gpu_hours},
                                  {"team_usage", share.team_usage},
                                  {"team_share", share.team_share},
                                  {"user_gpu_hours", share.user_gpu_hours},
                                  {"user_usage", share.user_usage},
                                  {"user_share", share.user_share}};
      }
      items.push_back(item);
    }
    ApiResponse response;
    response.body = json{{"queue", items}, {"fair_share_half_life_h", policy_.fair_share_half_life_h}};
    return response;
  });
}

ApiResponse QuotaService::audit(const Caller& caller, const ApiRequest& req) {
  if (caller.role == Role::kMember) return error_response(403, "role: the audit log is for team leads and admins");
  int64_t after = 0;
  size_t limit = 200;
  if (auto it = req.query.find("after");
      it != req.query.end() && !Router::parse_id(it->second, after) && it->second != "0") {
    throw RequestError("after: must be a sequence number");
  }
  if (auto it = req.query.find("limit"); it != req.query.end()) {
    int64_t number = 0;
    if (!Router::parse_id(it->second, number)) throw RequestError("limit: must be a positive number");
    limit = static_cast<size_t>(std::min<int64_t>(number, 1000));
  }
  const std::string team = caller.role == Role::kAdmin ? "" : caller.team;
  const std::vector<AuditEntry> entries = host_.audit(after, limit, team);
  json items = json::array();
  for (const auto& entry : entries) items.push_back(to_json(entry));
  ApiResponse response;
  response.body = json{{"audit", items}};
  return response;
}

void QuotaService::observe(const std::function<void(const ServiceView&)>& fn) {
  // a snapshot taken under the lock, rendered outside it: a slow page never delays a state change
  std::optional<Engine> engine;
  std::optional<UtilTracker> tracker;
  std::string audit_head;
  host_.copy_for_view(engine, tracker, audit_head);
  ServiceCounters counters;
  counters.audit_chain_head = audit_head;
  counters.heartbeats = heartbeats_total_.load();
  counters.preemptions = host_.preemptions();
  counters.emergency_grants = host_.emergency_grants();
  counters.storage_write_errors = host_.storage_write_errors();
  for (size_t code = 0; code < responses_by_status_.size(); ++code) {
    if (const uint64_t count = responses_by_status_[code].load(); count > 0) {
      counters.responses[static_cast<int>(code)] = count;
    }
  }
  // the snapshot's own policy: a reload may replace the service's meanwhile
  const ServiceView view{engine->policy(), *engine, *tracker, counters, host_.now()};
  fn(view);
}

}  // namespace yolo8::quota
