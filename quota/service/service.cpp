#include "quota/service/service.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>

#include "quota/core/codec.h"
#include "quota/core/sha256.h"

namespace yolo8::quota {

using nlohmann::json;

namespace {

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

namespace {
int64_t steady_now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// The store could not take a write in time (another process holds its lock, a slow disk): nothing changed.
class Unavailable : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
constexpr int kRetryAfterS = 2;

// Which monotonic clock a local-mode process reads: steady_clock is CLOCK_MONOTONIC, one clock for every process
// of the machine until it reboots (then it starts afresh: the boot id tells); an injected clock is its own.
std::string monotonic_clock_id(bool injected) {
  if (injected) return "injected";
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(in, id);
  return "boot:" + id;
}
constexpr const char* kClockReferenceKey = "local_clock_reference";
}  // namespace

QuotaService::QuotaService(Policy policy, ServiceOptions options)
    : policy_(policy),
      options_(std::move(options)),
      engine_(std::move(policy)),
      tracker_(policy_.waste_gpu_util_below, static_cast<int64_t>(policy_.waste_after_s) * 1000) {
  clock_ = options_.clock ? options_.clock : system_now_ms;
  monotonic_ = options_.monotonic_clock ? options_.monotonic_clock : options_.clock ? options_.clock : steady_now_ms;
  // After a restart the monotonic clock starts afresh: the stored leases' wall times are taken as they are
  // (restore() gives running leases a fresh heartbeat clock); only a step back shows, below.
  clock_offset_ms_ = clock_() - monotonic_();
  local_clock_id_ = monotonic_clock_id(options_.monotonic_clock || options_.clock);
  if (!options_.db_path.empty()) {
    store_ = open_store(parse_db_target(options_.db_path),
                        {options_.full_sync, options_.store_busy_timeout_ms, options_.db_password_file});
    if (!options_.reload_per_call) {
      const int64_t now = clock_();
      Snapshot snapshot = store_->load(now, options_.keep_ended_ms, 10000);
      engine_.restore(std::move(snapshot.leases), std::move(snapshot.approvals), std::move(snapshot.audit),
                      std::move(snapshot.usage), snapshot.next_audit_seq, now);
      engine_.reserve_ids(snapshot.next_lease_id, snapshot.next_approval_id);
      engine_.restore_ledger(std::move(snapshot.loans), std::move(snapshot.grants), snapshot.next_loan_id,
                             snapshot.next_grant_id);
      // what restore() found against the inventory (leases ended, remapped or quarantined) is audited and stored
      // before anything is served. What check_invariants still finds comes from a policy edit the held leases
      // predate (a bigger pool, a lower max_leases_per_gpu): new grants respect the policy and the held leases
      // end in time, so it is audited rather than keeping quotad down.
      for (const std::string& error : engine_.check_invariants(now)) {
        engine_.note(now, "quotad", "state.unsound", "at load: " + error);
      }
      store_->write(engine_, engine_.take_changes());
      store_->replay_heartbeats(engine_, tracker_);  // the waste list survives a restart
      // A wall clock set back while quotad was down leaves live leases seen "in the future": the step was at
      // least that, and their clocks move back by it (else a dead job would keep its GPUs until then).
      int64_t latest = now;
      for (const auto& [id, lease] : engine_.leases()) {
        if (!is_terminal(lease.state)) latest = std::max(latest, lease.last_seen_ms);
      }
      if (latest - now > options_.clock_step_after_ms) {
        std::fprintf(stderr, "quotad: stored leases were seen %lld ms after the wall clock's now: it was set back\n",
                     static_cast<long long>(latest - now));
        engine_.clock_stepped(now - latest, now);
        tracker_.clock_stepped(now - latest, now);
      }
    }
  }
  last_tick_ms_ = monotonic_();
  publish_locked(Changes{}, true);
}

void QuotaService::follow_clock_locked() {
  const int64_t wall = clock_();
  const int64_t offset = wall - monotonic_();
  const int64_t step = offset - std::exchange(clock_offset_ms_, offset);
  if (std::abs(step) <= options_.clock_step_after_ms) return;  // drift and slewing are followed silently
  std::fprintf(stderr, "quotad: the wall clock stepped by %lld ms against the monotonic clock\n",
               static_cast<long long>(step));
  engine_.clock_stepped(step, wall);
  tracker_.clock_stepped(step, wall);
}

void QuotaService::follow_shared_clock_locked(int64_t now_ms) {
  // Local mode's processes share one monotonic clock and the database: the offset of the wall clock against it
  // is kept in meta, so a step is seen by whichever process calls first, and applied to the stored leases once.
  const int64_t offset = now_ms - monotonic_();
  std::istringstream stored(store_->meta(kClockReferenceKey));
  std::string stored_id;
  int64_t stored_offset = 0;
  if (stored >> stored_id >> stored_offset && stored_id == local_clock_id_) {
    const int64_t step = offset - stored_offset;
    if (std::abs(step) > options_.clock_step_after_ms) {
      std::fprintf(stderr, "quota: the wall clock stepped by %lld ms against the monotonic clock\n",
                   static_cast<long long>(step));
      engine_.clock_stepped(step, now_ms);
    }
  }
  store_->set_meta(kClockReferenceKey, local_clock_id_ + " " + std::to_string(offset));
}

void QuotaService::reload_locked(int64_t now_ms) {
  Snapshot snapshot =
      store_->load(now_ms, static_cast<int64_t>(policy_.ttl_s + policy_.expiry_grace_s) * 1000 + 3600 * 1000, 0);
  engine_.restore(std::move(snapshot.leases), std::move(snapshot.approvals), {}, std::move(snapshot.usage),
                  snapshot.next_audit_seq, 0);
  engine_.reserve_ids(snapshot.next_lease_id, snapshot.next_approval_id);
  engine_.restore_ledger(std::move(snapshot.loans), std::move(snapshot.grants), snapshot.next_loan_id,
                         snapshot.next_grant_id);
}

void QuotaService::count_committed(const Changes& changes) {
  for (const auto& entry : changes.audit) {
    if (entry.action == "preempt.revoke") ++preemptions_total_;
    if (entry.action == "emergency.granted") ++emergency_total_;
  }
}

void QuotaService::merge_beats_locked() {
  std::vector<HeartbeatSample> beats;
  {
    std::lock_guard<std::mutex> beat_lock(beat_mutex_);
    beats.swap(unmerged_beats_);
  }
  for (const auto& beat : beats) {
    // received at a monotonic time: in the engine's frame, the wall time as of the last clock check (a step since
    // is followed after the merge, moving these with the rest)
    const int64_t seen_ms = beat.ts_ms + clock_offset_ms_;
    engine_.touch(beat.lease_id, beat.telemetry, seen_ms);
    const Lease* lease = engine_.find(beat.lease_id);
    if (lease != nullptr && (lease->state == LeaseState::kGranted || lease->state == LeaseState::kRevoking)) {
      tracker_.observe(beat.lease_id, seen_ms, beat.telemetry.gpu_util);
    }
  }
}

void QuotaService::publish_locked(const Changes& changes, bool all) {
  const std::vector<int64_t> queue = engine_.queue_ids();  // computed once per change
  const int64_t now = clock_();
  std::lock_guard<std::mutex> beat_lock(beat_mutex_);
  auto refresh = [&](const Lease& lease) {
    auto [it, fresh] = board_.try_emplace(lease.id);
    Beat& beat = it->second;
    if (fresh) beat.telemetry = lease.telemetry;
    beat.team = lease.req.team;
    beat.user = lease.req.user;
    beat.state = lease.state;
    beat.deadline_ms = lease.deadline_ms;
    beat.reason = lease.state == LeaseState::kQueued ? engine_.waiting_reason(lease.id, now) : lease.reason;
  };
  if (all) {
    board_.clear();
    for (const auto& [id, lease] : engine_.leases()) refresh(lease);
  } else {
    for (int64_t id : changes.leases) {
      if (const Lease* lease = engine_.find(id)) refresh(*lease);
    }
  }
  for (size_t i = 0; i < queue.size(); ++i) {
    if (auto it = board_.find(queue[i]); it != board_.end()) it->second.position = static_cast<int>(i) + 1;
  }
  if (board_.size() > engine_.leases().size()) {  // prune() dropped ended leases
    for (auto it = board_.begin(); it != board_.end();) {
      it = engine_.find(it->first) == nullptr ? board_.erase(it) : std::next(it);
    }
  }
}

ApiResponse QuotaService::locked_local(const std::function<ApiResponse()>& op) {
  std::unique_lock<std::mutex> lock(mutex_);
  std::lock_guard<std::mutex> store_lock(store_mutex_);
  store_->begin_immediate();
  try {
    const int64_t now = clock_();
    reload_locked(now);
    follow_shared_clock_locked(now);  // before the tick: a step forward must not expire every lease
    engine_.tick(now);
    ApiResponse response = op();
    Changes changes = engine_.take_changes();
    store_->write(engine_, changes);
    std::vector<HeartbeatSample> beats;
    {
      std::lock_guard<std::mutex> beat_lock(beat_mutex_);
      beats.swap(pending_heartbeats_);
    }
    store_->write_heartbeats(beats);
    store_->commit();
    count_committed(changes);
    return response;
  } catch (...) {
    {
      std::lock_guard<std::mutex> beat_lock(beat_mutex_);
      pending_heartbeats_.clear();
    }
    store_->rollback();
    throw;
  }
}

ApiResponse QuotaService::locked(const std::function<ApiResponse()>& op, bool writes) {
  if (store_ && options_.reload_per_call) return locked_local(op);
  // After a failed write, changes fail fast for a moment instead of queueing behind the stalled store (each
  // would hold the engine lock for the whole busy timeout in turn).
  auto store_down = [&] {
    return writes && store_ && std::chrono::steady_clock::now().time_since_epoch().count() < store_down_until_.load();
  };
  if (store_down()) throw Unavailable("storage: unavailable (the last write failed just now); retry shortly");
  std::unique_lock<std::mutex> lock(mutex_);
  if (store_down()) throw Unavailable("storage: unavailable (the last write failed just now); retry shortly");
  merge_beats_locked();
  // before the checkpoint: a step is a fact, kept (and stored with the next write) even if this change fails
  if (writes) follow_clock_locked();
  // Persist, then apply: the engine is kept as it was until the change is durable. A read-only call copies
  // nothing; should it change state after all, the change is still written before the answer. A write copies
  // the engine's records, not its policy and audit log.
  std::optional<Engine::Checkpoint> before;
  if (writes && store_) before.emplace(engine_.checkpoint());
  ApiResponse response = op();
  Changes changes = engine_.take_changes();
  if (!changes.empty() && store_) {
    try {
      std::lock_guard<std::mutex> store_lock(store_mutex_);
      store_->write(engine_, changes);
    } catch (const StoreError& error) {
      ++storage_write_errors_;
      store_down_until_ = (std::chrono::steady_clock::now() + std::chrono::milliseconds(options_.store_backoff_ms))
                              .time_since_epoch()
                              .count();
      if (before) {
        engine_.roll_back(std::move(*before));
      } else {
        // cannot happen for the read-only calls (they change nothing); never answer success on lost state
        throw;
      }
      throw Unavailable(std::string("storage: the change was not saved and not applied: ") + error.what());
    }
  }
  count_committed(changes);
  if (!changes.empty()) publish_locked(changes, false);
  return response;
}

void QuotaService::tick() {
  if (store_ && options_.reload_per_call) {
    locked_local([] { return ApiResponse{}; });
    return;
  }
  int64_t now = 0;
  int64_t now_monotonic = 0;
  std::vector<std::pair<std::string, int>> failures;
  {
    std::lock_guard<std::mutex> lock(auth_mutex_);
    failures.assign(auth_unreported_.begin(), auth_unreported_.end());
    auth_unreported_.clear();
  }
  try {
    locked(
        [&] {
          now = clock_();
          now_monotonic = monotonic_();
          // failed authentications, one entry per address and tick rather than one per guess
          for (const auto& [address, count] : failures) {
            engine_.note(now, "quotad", "auth.failed",
                         std::to_string(count) + " failed or refused authentication(s) from " +
                             (address.empty() ? "(in process)" : address));
          }
          const int64_t gap = now_monotonic - last_tick_ms_.load();
          if (options_.outage_after_ms > 0 && gap > options_.outage_after_ms) engine_.credit_outage(now - gap, now);
          engine_.tick(now);
          engine_.prune(now, options_.keep_ended_ms);
          sync_tracker(engine_, tracker_);  // ended runs closed, pruned leases dropped, even without scrapes
          return ApiResponse{};
        },
        true);
  } catch (...) {
    std::lock_guard<std::mutex> lock(auth_mutex_);  // not saved: report them with the next tick
    for (const auto& [address, count] : failures) auth_unreported_[address] += count;
    throw;
  }
  // only a tick that was saved moves the clock: a stalled store is quotad's outage too
  last_tick_ms_ = now_monotonic;
}

void QuotaService::flush_heartbeats() {
  std::vector<HeartbeatSample> batch;
  {
    std::lock_guard<std::mutex> beat_lock(beat_mutex_);
    batch.swap(pending_heartbeats_);
  }
  if (!store_ || batch.empty()) return;
  try {
    std::lock_guard<std::mutex> store_lock(store_mutex_);
    store_->write_heartbeats(batch);
  } catch (const StoreError&) {
    ++storage_write_errors_;
    // keep the samples for the next round (bounded: the oldest go first)
    std::lock_guard<std::mutex> beat_lock(beat_mutex_);
    batch.insert(batch.end(), pending_heartbeats_.begin(), pending_heartbeats_.end());
    if (batch.size() > options_.max_pending_heartbeats) {
      batch.erase(batch.begin(), batch.end() - static_cast<long>(options_.max_pending_heartbeats));
    }
    pending_heartbeats_.swap(batch);
    throw;
  }
}

std::vector<std::string> QuotaService::check_invariants() {
  std::vector<std::string> errors;
  locked(
      [&] {
        errors = engine_.check_invariants(clock_());
        return ApiResponse{};
      },
      false);
  return errors;
}

void QuotaService::inspect(const std::function<void(const Engine&)>& fn) {
  locked(
      [&] {
        fn(engine_);
        return ApiResponse{};
      },
      false);
}

bool QuotaService::can_read(const Caller& caller, const Lease& lease) const {
  return caller.role == Role::kAdmin || lease.req.team == caller.team;
}

bool QuotaService::may_act(const Caller& caller, const std::string& user, const std::string& team) {
  return caller.role == Role::kAdmin || user == caller.name || (caller.role == Role::kLead && team == caller.team);
}

bool QuotaService::can_act(const Caller& caller, const Lease& lease) const {
  return may_act(caller, lease.req.user, lease.req.team);
}

json QuotaService::lease_view(const Lease& lease, int64_t now_ms) const {
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
    int position = 0;
    {
      std::lock_guard<std::mutex> beat_lock(beat_mutex_);
      if (auto it = board_.find(lease.id); it != board_.end()) position = it->second.position;
    }
    view["position"] = position > 0 ? position : engine_.queue_position(lease.id);
    view["reason"] = engine_.waiting_reason(lease.id, now_ms);
  }
  if (lease.state == LeaseState::kRevoking) view["deadline_in_ms"] = std::max<int64_t>(0, lease.deadline_ms - now_ms);
  return view;
}

bool QuotaService::accepts_token(const std::string& token) const {
  std::shared_lock<std::shared_mutex> policy_lock(policy_mutex_);
  return policy_.find_user_by_token(token, clock_()) != nullptr;
}

std::string QuotaService::reload_policy(Policy next) {
  std::unique_lock<std::shared_mutex> policy_lock(policy_mutex_);
  std::string summary;
  try {
    locked([&] {
      summary = policy_change_summary(policy_, next);
      engine_.replace_policy(next);  // throws before anything changed
      policy_ = std::move(next);
      engine_.note(clock_(), "quotad", "policy.reloaded",
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
      engine_.note(clock_(), "quotad", action, detail);
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
    response = route(req);
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
  } catch (const std::exception& exception) {
    response = error_response(500, exception.what());
  }
  if (response.status >= 0 && response.status < static_cast<int>(responses_by_status_.size())) {
    ++responses_by_status_[static_cast<size_t>(response.status)];
  }
  return response;
}

const char* to_string(RouteAccess access) {
  switch (access) {
    case RouteAccess::kOpen: return "open";
    case RouteAccess::kToken: return "token";
    case RouteAccess::kPage: return "page";
  }
  return "?";
}

const char* to_string(RouteLane lane) { return lane == RouteLane::kFast ? "fast" : "api"; }

const std::vector<QuotaService::Route>& QuotaService::route_table() {
  using S = QuotaService;
  using P = std::vector<std::string>;
  constexpr auto kOpen = RouteAccess::kOpen;
  constexpr auto kToken = RouteAccess::kToken;
  constexpr auto kPage = RouteAccess::kPage;
  constexpr auto kApi = RouteLane::kApi;
  constexpr auto kFast = RouteLane::kFast;
  // the ledger's calls dispatch further on the path in ledger_api.cpp
  const Handler ledger = [](S& s, const Caller& c, const ApiRequest& r, const P& p, int64_t) {
    return s.ledger_route(c, r, p);
  };
  static const std::vector<Route> table = {
      {{"GET", "/v1/leases", kToken, kApi},
       [](S& s, const Caller& c, const ApiRequest& r, const P&, int64_t) { return s.list_leases(c, r); }},
      {{"POST", "/v1/leases", kToken, kApi},
       [](S& s, const Caller& c, const ApiRequest& r, const P&, int64_t) { return s.acquire(c, r); }},
      {{"GET", "/v1/leases/{id}", kToken, kApi},
       [](S& s, const Caller& c, const ApiRequest&, const P&, int64_t id) { return s.get_lease(c, id); }},
      {{"POST", "/v1/leases/{id}/heartbeat", kToken, kFast},
       [](S& s, const Caller& c, const ApiRequest& r, const P&, int64_t id) { return s.heartbeat(c, id, r.body); }},
      {{"POST", "/v1/leases/{id}/release", kToken, kApi},
       [](S& s, const Caller& c, const ApiRequest& r, const P&, int64_t id) { return s.release(c, id, r.body); }},
      {{"POST", "/v1/leases/{id}/review", kToken, kApi},
       [](S& s, const Caller& c, const ApiRequest& r, const P&, int64_t id) { return s.review(c, id, r.body); }},
      {{"GET", "/v1/approvals", kToken, kApi},
       [](S& s, const Caller& c, const ApiRequest&, const P&, int64_t) { return s.list_approvals(c); }},
      {{"POST", "/v1/approvals/{id}/approve", kToken, kApi},
       [](S& s, const Caller& c, const ApiRequest& r, const P&, int64_t id) { return s.decide(c, id, true, r.body); }},
      {{"POST", "/v1/approvals/{id}/reject", kToken, kApi},
       [](S& s, const Caller& c, const ApiRequest& r, const P&, int64_t id) { return s.decide(c, id, false, r.body); }},
      {{"GET", "/v1/teams", kToken, kApi},
       [](S& s, const Caller& c, const ApiRequest&, const P&, int64_t) { return s.teams(c); }},
      {{"GET", "/v1/queue", kToken, kApi},
       [](S& s, const Caller& c, const ApiRequest&, const P&, int64_t) { return s.queue(c); }},
      {{"GET", "/v1/audit", kToken, kApi},
       [](S& s, const Caller& c, const ApiRequest& r, const P&, int64_t) { return s.audit(c, r); }},
      {{"GET", "/v1/loans", kToken, kApi}, ledger},
      {{"POST", "/v1/loans", kToken, kApi}, ledger},
      {{"GET", "/v1/loans/{id}", kToken, kApi}, ledger},
      {{"POST", "/v1/loans/{id}/approve", kToken, kApi}, ledger},
      {{"POST", "/v1/loans/{id}/reject", kToken, kApi}, ledger},
      {{"GET", "/v1/credits", kToken, kApi}, ledger},
      {{"POST", "/v1/credits", kToken, kApi}, ledger},
      {{"GET", "/v1/balance", kToken, kApi}, ledger},
      {{"GET", "/healthz", kOpen, kFast}, nullptr},
      {{"GET", "/metrics", kPage, kApi}, nullptr},
      {{"GET", "/", kPage, kApi}, nullptr},
      {{"GET", "/status", kPage, kApi}, nullptr},
      {{"GET", "/favicon.ico", kPage, kApi}, nullptr},
  };
  return table;
}

const std::vector<RouteSpec>& QuotaService::routes() {
  static const std::vector<RouteSpec> specs = [] {
    std::vector<RouteSpec> out;
    for (const Route& route : route_table()) out.push_back(route.spec);
    return out;
  }();
  return specs;
}

namespace {

// Segment by segment; "{id}" takes any one segment (a malformed id is the handler's 404, after authorization).
bool pattern_matches(const std::vector<std::string>& pattern, const std::vector<std::string>& parts) {
  if (pattern.size() != parts.size()) return false;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (pattern[i] != "{id}" && pattern[i] != parts[i]) return false;
  }
  return true;
}

}  // namespace

RouteMatch QuotaService::match_route(const std::string& method, const std::string& path) {
  const auto parts = split_path(path);
  RouteMatch match;
  const auto& table = route_table();
  for (size_t i = 0; i < table.size(); ++i) {
    if (!pattern_matches(split_path(table[i].spec.pattern), parts)) continue;
    const std::string& route_method = table[i].spec.method;
    if (match.allowed.find(route_method) == std::string::npos) {
      match.allowed += (match.allowed.empty() ? "" : ", ") + route_method;
    }
    if (route_method == method && match.index < 0) match.index = static_cast<int>(i);
  }
  return match;
}

RouteLane RouteMatch::lane() const {
  return found() ? QuotaService::routes()[static_cast<size_t>(index)].lane : RouteLane::kApi;
}

std::string QuotaService::auth_key(const std::string& address, const std::string& token) {
  return address + " " + sha256_hex(token);
}

bool QuotaService::auth_blocked(const std::string& key, const std::string& address, int64_t now_ms,
                                int64_t& retry_after_ms) {
  std::lock_guard<std::mutex> lock(auth_mutex_);
  auto it = auth_failures_.find(key);
  if (it == auth_failures_.end() || now_ms >= it->second.blocked_until_ms) return false;
  retry_after_ms = it->second.blocked_until_ms - now_ms;
  ++auth_unreported_[address];  // refused without a look at the users: still an attempt
  return true;
}

void QuotaService::auth_failed(const std::string& key, const std::string& address, int64_t now_ms) {
  std::lock_guard<std::mutex> lock(auth_mutex_);
  ++auth_unreported_[address];
  if (auth_failures_.size() >= kMaxTrackedFailures && !auth_failures_.count(key)) {
    // bounded memory: forget every record not blocking now (one sweep, not one scan per failure); if all
    // are blocking, the one whose block ends first
    for (auto it = auth_failures_.begin(); it != auth_failures_.end();) {
      it = it->second.blocked_until_ms <= now_ms ? auth_failures_.erase(it) : std::next(it);
    }
    if (auth_failures_.size() >= kMaxTrackedFailures) {
      auth_failures_.erase(std::min_element(
          auth_failures_.begin(), auth_failures_.end(),
          [](const auto& a, const auto& b) { return a.second.blocked_until_ms < b.second.blocked_until_ms; }));
    }
  }
  AuthFailures& failures = auth_failures_[key];
  ++failures.count;
  // a few typos are free; then 250 ms, doubling with every failure, at most a minute
  if (failures.count >= kFreeAuthFailures) {
    const int doublings = std::min(failures.count - kFreeAuthFailures, 8);
    failures.blocked_until_ms = now_ms + std::min<int64_t>(60000, int64_t{250} << doublings);
  }
  if (address_failures_.size() >= kMaxTrackedAddresses && !address_failures_.count(address)) {
    // bounded memory as above: every address not blocking now goes, else the one that failed longest ago
    for (auto it = address_failures_.begin(); it != address_failures_.end();) {
      it = it->second.blocked_until_ms <= now_ms ? address_failures_.erase(it) : std::next(it);
    }
    if (address_failures_.size() >= kMaxTrackedAddresses) {
      address_failures_.erase(std::min_element(
          address_failures_.begin(), address_failures_.end(),
          [](const auto& a, const auto& b) { return a.second.last_failure_ms < b.second.last_failure_ms; }));
    }
  }
  AddressFailures& from = address_failures_[address];
  if (now_ms - from.last_failure_ms > kAddressFailuresForgottenAfterMs) from.count = 0;
  from.last_failure_ms = now_ms;
  ++from.count;
  if (from.count >= kFreeAddressAuthFailures) {
    const int doublings = std::min(from.count - kFreeAddressAuthFailures, 8);
    from.blocked_until_ms = now_ms + std::min<int64_t>(60000, int64_t{250} << doublings);
  }
}

bool QuotaService::address_blocked(const std::string& address, int64_t now_ms, int64_t& retry_after_ms) {
  std::lock_guard<std::mutex> lock(auth_mutex_);
  auto it = address_failures_.find(address);
  if (it == address_failures_.end() || now_ms >= it->second.blocked_until_ms) return false;
  retry_after_ms = it->second.blocked_until_ms - now_ms;
  ++auth_unreported_[address];
  return true;
}

ApiResponse QuotaService::route(const ApiRequest& req) {
  const RouteMatch match = match_route(req.method, req.path);
  const Route* route = match.found() ? &route_table()[static_cast<size_t>(match.index)] : nullptr;
  if (match.allowed.empty() || (route != nullptr && route->spec.access == RouteAccess::kPage)) {
    // the caller's path and method are not echoed: answers stay small whatever was sent
    return error_response(404, "no such endpoint (the routes are listed in quota/README.md)");
  }
  if (route == nullptr) {
    ApiResponse response = error_response(405, "method not allowed on this path (allowed: " + match.allowed + ")");
    response.headers["Allow"] = match.allowed;
    return response;
  }
  if (route->spec.access == RouteAccess::kOpen) {  // /healthz
    ApiResponse response;
    response.body = json{{"status", "ok"}, {"time_ms", clock_()}};
    return response;
  }

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
    if (req.token.empty()) return error_response(401, "authorization: a bearer token is required");
    // Throttled per (address, token): a wrong token repeated from an address shared with trainers (a TLS
    // proxy, a NAT) blocks only that token there. A blocked token was already found wrong (the policy does
    // not change while serving), so it is refused before the users' hashes are computed. Failures are also
    // throttled per address (distinct wrong tokens), but only once the token is found wrong.
    const int64_t now = clock_();
    const std::string key = auth_key(req.client_address, req.token);
    int64_t retry_after_ms = 0;
    if (auth_blocked(key, req.client_address, now, retry_after_ms)) {
      const std::string seconds = std::to_string((retry_after_ms + 999) / 1000);
      ApiResponse response = error_response(
          429, "authorization: this token failed too often from this address; retry in " + seconds + " s");
      response.headers["Retry-After"] = seconds;
      return response;
    }
    // the token is checked before the address's record: a valid token is served whatever its address did
    const User* user = policy_.find_user_by_token(req.token, now);
    if (user == nullptr) {
      if (address_blocked(req.client_address, now, retry_after_ms)) {
        const std::string seconds = std::to_string((retry_after_ms + 999) / 1000);
        ApiResponse response = error_response(
            429, "authorization: unknown token, and too many failed authentications from this address; retry in " +
                     seconds + " s");
        response.headers["Retry-After"] = seconds;
        return response;
      }
      auth_failed(key, req.client_address, now);
      return error_response(401, "authorization: unknown token");
    }
    caller.name = user->name;
    caller.team = user->team;
    caller.role = user->role;
  }

  const auto parts = split_path(req.path);
  int64_t id = 0;
  if (route->spec.pattern.find("{id}") != std::string::npos && !parse_id(parts[2], id)) {
    // "leases" -> "unknown lease 'x'"
    return error_response(404, "unknown " + parts[1].substr(0, parts[1].size() - 1) + ": ids are positive numbers");
  }
  return route->handler(*this, caller, req, parts, id);
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
    const int64_t now = clock_();
    const AcquireResult result = engine_.acquire(request, now);
    ApiResponse response;
    json& body = response.body;
    body["lease_id"] = result.lease_id;
    body["replayed"] = result.replayed;
    if (!result.reason.empty()) body["reason"] = result.reason;
    // which memory table row admission used, so a surprising answer can be traced to its figures
    if (!result.memory_row.empty()) body["memory_row"] = result.memory_row;
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
    const int64_t now = clock_();
    const Lease* lease = engine_.find(id);
    if (lease == nullptr) return error_response(404, "unknown lease " + std::to_string(id));
    if (!can_read(caller, *lease)) {
      return error_response(403, "lease " + std::to_string(id) + " belongs to team " + lease->req.team);
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
  return read_locked([&] {
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
    // hot path: answered from the board, never waiting for the engine lock or the database; the report
    // reaches the engine at the next locked call (or tick) and the database with the next batch
    ApiResponse response;
    {
      std::lock_guard<std::mutex> beat_lock(beat_mutex_);
      auto it = board_.find(id);
      if (it == board_.end()) return error_response(404, "unknown lease " + std::to_string(id));
      Beat& beat = it->second;
      if (!may_act(caller, beat.user, beat.team)) {
        return error_response(403, caller.name + " may not heartbeat lease " + std::to_string(id));
      }
      const int64_t now = clock_();
      ++heartbeats_total_;
      HeartbeatResult result;
      result.found = true;
      result.state = beat.state;
      result.deadline_ms = beat.deadline_ms;
      result.position = beat.position;
      result.reason = beat.reason;
      if (!is_terminal(beat.state)) {
        if (beat.state == LeaseState::kGranted || beat.state == LeaseState::kRevoking) {
          merge_telemetry(beat.telemetry, telemetry);
          if (store_) {
            if (pending_heartbeats_.size() >= options_.max_pending_heartbeats) {
              pending_heartbeats_.erase(pending_heartbeats_.begin());  // the store is far behind: telemetry only
            }
            pending_heartbeats_.push_back(HeartbeatSample{id, now, beat.telemetry});
          }
        }
        if (unmerged_beats_.size() >= options_.max_pending_heartbeats) {
          unmerged_beats_.erase(unmerged_beats_.begin());  // the engine lock is held for long: keep the newest
        }
        unmerged_beats_.push_back(HeartbeatSample{id, monotonic_(), telemetry});
      }
      response = fill(result, now);
    }
    if (options_.write_each_heartbeat) flush_heartbeats();
    return response;
  }
  return locked([&] {
    const Lease* lease = engine_.find(id);
    if (lease == nullptr) return error_response(404, "unknown lease " + std::to_string(id));
    if (!can_act(caller, *lease))
      return error_response(403, caller.name + " may not heartbeat lease " + std::to_string(id));
    const int64_t now = clock_();
    const HeartbeatResult beat = engine_.heartbeat(id, telemetry, now);
    ++heartbeats_total_;
    if (beat.state == LeaseState::kGranted || beat.state == LeaseState::kRevoking) {
      tracker_.observe(id, now, telemetry.gpu_util);
      std::lock_guard<std::mutex> beat_lock(beat_mutex_);
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
    if (lease == nullptr) return error_response(404, "unknown lease " + std::to_string(id));
    if (!can_act(caller, *lease))
      return error_response(403, caller.name + " may not release lease " + std::to_string(id));
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
  if (caller.role != Role::kAdmin) return error_response(403, "role: emergency reviews are for admins");
  const std::string note = optional_note(body);
  return locked([&] {
    const Lease* lease = engine_.find(id);
    if (lease == nullptr) return error_response(404, "unknown lease " + std::to_string(id));
    if (!lease->review_pending)
      return error_response(409, "lease " + std::to_string(id) + " has no emergency review pending");
    engine_.review_emergency(id, caller.name, clock_(), note);
    ApiResponse response;
    response.body = lease_view(*engine_.find(id), clock_());
    return response;
  });
}

ApiResponse QuotaService::list_approvals(const Caller& caller) {
  if (caller.role == Role::kMember) return error_response(403, "role: approvals are for team leads and admins");
  return read_locked([&] {
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
  return read_locked([&] {
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

// The queue in order with each request's reason and fair-share standing (issue 19); the same names and figures
// the status page shows, so any authenticated caller may read it (never justifications).
ApiResponse QuotaService::queue(const Caller&) {
  return read_locked([&] {
    const int64_t now = clock_();
    json items = json::array();
    int position = 0;
    for (int64_t id : engine_.queue_ids()) {
      const Lease* lease = engine_.find(id);
      ++position;
      if (lease == nullptr) continue;
      const FairShare share = engine_.fair_share(lease->req.team, lease->req.user, now);
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
                {"reason", engine_.waiting_reason(id, now)}};
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
    // every change is written before it is answered, so the table is complete
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
  // a snapshot taken under the lock, rendered outside it: a slow page never delays a state change
  std::optional<Engine> engine;
  std::optional<UtilTracker> tracker;
  std::string audit_head;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    merge_beats_locked();
    sync_tracker(engine_, tracker_);
    engine.emplace(engine_);
    tracker.emplace(tracker_);
    if (store_) audit_head = store_->audit_head();
  }
  ServiceCounters counters;
  counters.audit_chain_head = audit_head;
  counters.heartbeats = heartbeats_total_.load();
  counters.preemptions = preemptions_total_.load();
  counters.emergency_grants = emergency_total_.load();
  counters.storage_write_errors = storage_write_errors_.load();
  for (size_t code = 0; code < responses_by_status_.size(); ++code) {
    if (const uint64_t count = responses_by_status_[code].load(); count > 0) {
      counters.responses[static_cast<int>(code)] = count;
    }
  }
  // the snapshot's own policy: a reload may replace the service's meanwhile
  const ServiceView view{engine->policy(), *engine, *tracker, counters, clock_()};
  fn(view);
}

}  // namespace yolo8::quota
