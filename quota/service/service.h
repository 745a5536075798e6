#pragma once
// The quota API as a transport-free router over the engine and its store: the HTTP server and the embedded
// local mode of the client both call handle(). /metrics and the status page belong to the server.
#include <nlohmann/json.hpp>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <vector>

#include "quota/core/api.h"
#include "quota/core/engine.h"
#include "quota/core/usage.h"
#include "quota/store/store.h"

namespace yolo8::quota {

struct ServiceOptions {
  std::string db_path;             // --db: a SQLite file or a PostgreSQL URL (parse_db_target); empty: in memory only
  std::string db_password_file;    // PostgreSQL: the password's file (empty: libpq's PGPASSWORD / PGPASSFILE)
  bool reload_per_call = false;    // local mode: several processes share db_path; each call locks and reloads it
  bool full_sync = false;          // SQLite synchronous=FULL instead of NORMAL
  std::function<int64_t()> clock;  // UTC ms; the system clock when empty
  // Milliseconds of a clock that never steps: expiry, billing and quotad's own outages go by its differences;
  // wall time stays what is shown and stored. When empty: steady_clock with the system clock, `clock` itself when
  // that is set (a scripted time has no steps to follow).
  std::function<int64_t()> monotonic_clock;
  // The wall clock moving by more than this against the monotonic one between two checks is a step (NTP, a
  // hand-set date), not drift: the engine's lease clocks move with it (Engine::clock_stepped), audited and logged.
  int64_t clock_step_after_ms = 30000;
  int64_t keep_ended_ms = 24 * 3600 * 1000LL;  // ended leases kept in memory for GET
  bool write_each_heartbeat = false;           // commit every heartbeat sample at once instead of batching (benchmarks)
  // How long a state change waits for the SQLite write lock (another process holding it) before it is answered
  // 503 with Retry-After, its effects undone; after such a failure, state changes are answered 503 at once for
  // store_backoff_ms rather than each waiting in turn. Local mode waits longer: the other holders are
  // trainers on the same workstation.
  int store_busy_timeout_ms = 30000;
  int store_backoff_ms = 1000;
  // A gap longer than this between two ticks is quotad's own outage (stalled, stopped): lease clocks are
  // extended by it (Engine::credit_outage). 0 = off; the server ticks every second and sets 3000.
  int64_t outage_after_ms = 0;
  size_t max_pending_heartbeats = 200000;  // samples buffered while the store is unavailable (oldest dropped)
};

// Counters the service keeps for the exposition (monotonic since start).
struct ServiceCounters {
  uint64_t heartbeats = 0;
  uint64_t preemptions = 0;
  uint64_t emergency_grants = 0;
  uint64_t storage_write_errors = 0;  // failed SQLite writes (state changes or heartbeat batches)
  std::map<int, uint64_t> responses;  // by HTTP status
  std::string audit_chain_head;       // "<seq> <link>" of the audit log's hash chain (issue 30); "" without a store
};

// A consistent view of the service's state for read-only pages.
struct ServiceView {
  const Policy& policy;
  const Engine& engine;
  const UtilTracker& tracker;
  ServiceCounters counters;
  int64_t now_ms;
};

// Who may call a route: anyone (/healthz), a bearer token (every /v1 call), or anyone for a page the HTTP
// front renders itself (/metrics, the status page; the embedded service answers those 404).
enum class RouteAccess { kOpen, kToken, kPage };
// Which workers answer a route: heartbeats and /healthz never queue behind other calls or slow clients.
enum class RouteLane { kApi, kFast };

struct RouteSpec {
  std::string method;
  std::string pattern;  // "/v1/leases/{id}/heartbeat": {id} stands for one path segment
  RouteAccess access = RouteAccess::kToken;
  RouteLane lane = RouteLane::kApi;
};

// What the route table says about a method and path (the path without its query).
struct RouteMatch {
  int index = -1;       // into QuotaService::routes(); -1 when no route answers this method on this path
  std::string allowed;  // the methods the path answers ("GET, POST"); "" for an unknown path (404)
  RouteLane lane() const;
  bool found() const { return index >= 0; }
};

const char* to_string(RouteAccess access);
const char* to_string(RouteLane lane);

class QuotaService {
 public:
  QuotaService(Policy policy, ServiceOptions options);

  // The one route table: it drives routing, 405 with Allow, the HTTP front's lanes and pages, and the route
  // list in quota/README.md (a test compares them).
  static const std::vector<RouteSpec>& routes();
  static RouteMatch match_route(const std::string& method, const std::string& path);

  // Never throws: every failure becomes a status with a `reason`.
  ApiResponse handle(const ApiRequest& req);
  // Expiry, deadlines, queue (the server calls it every second; local mode on every call).
  void tick();
  // Writes buffered heartbeat samples in one transaction (server mode batches them).
  void flush_heartbeats();
  std::vector<std::string> check_invariants();
  int64_t now() const { return clock_(); }
  // The policy in force; a reference valid until the next reload_policy() (startup messages, tests).
  const Policy& policy() const { return policy_; }
  // Whether a bearer token belongs to a user of the policy (the HTTP front exempts such connections from its
  // per-address cap).
  bool accepts_token(const std::string& token) const;
  // A reloaded policy (SIGHUP, a changed file) in force from the next request on: leases, queue and ledger kept,
  // audited as `policy.reloaded` with policy_change_summary(). Returns that summary. Throws PolicyError, the
  // running policy kept, when Engine::replace_policy refuses it.
  std::string reload_policy(Policy next);
  // An audit entry by quotad itself (a refused reload, a renewed certificate); a store failure is only printed.
  void audit_note(const std::string& action, const std::string& detail);
  // Runs `fn` on the engine under the service lock (tests, invariants).
  void inspect(const std::function<void(const Engine&)>& fn);
  // What /metrics and the status page render: a snapshot of the engine and the tracker (brought up to date)
  // taken under the service lock; `fn` runs outside it.
  void observe(const std::function<void(const ServiceView&)>& fn);

 private:
  struct Caller {
    std::string name;
    std::string team;
    Role role = Role::kMember;
  };
  // What a heartbeat needs to know about a lease, published after every committed change, so heartbeats are
  // answered without the engine lock (which a state change holds while it waits for SQLite).
  struct Beat {
    std::string team, user;
    LeaseState state = LeaseState::kQueued;
    int64_t deadline_ms = 0;
    int position = 0;
    std::string reason;
    Telemetry telemetry;  // the latest figures, each carried forward until reported again
  };
  // Failed authentications of one (address, presented token): a client repeating a wrong token backs off;
  // a valid token is never recorded here, so it is never blocked, whoever shares its address.
  struct AuthFailures {
    int count = 0;  // consecutive failures
    int64_t blocked_until_ms = 0;
  };
  static constexpr int kFreeAuthFailures = 5;
  static constexpr size_t kMaxTrackedFailures = 10000;
  // The throttle's key: the address and a digest of the token (wrong tokens may be typos of real ones).
  static std::string auth_key(const std::string& address, const std::string& token);
  bool auth_blocked(const std::string& key, const std::string& address, int64_t now_ms, int64_t& retry_after_ms);
  void auth_failed(const std::string& key, const std::string& address, int64_t now_ms);
  // Failed authentications of one address, whatever the tokens: distinct wrong tokens are each a new key above,
  // so a guesser changing the token every time would never be slowed. Only a token found wrong is refused for
  // its address's record; a valid one is served first, whoever shares the address.
  struct AddressFailures {
    int count = 0;  // failures outside a block, since the address's last quiet spell
    int64_t blocked_until_ms = 0;
    int64_t last_failure_ms = 0;
  };
  // Several clients behind one address (a proxy, a NAT) with a stale or mistyped token each have their own
  // kFreeAuthFailures per token; four of them may fail in full before their address is slowed. Then the same
  // back-off as a token's: 250 ms, doubling with every further failure, at most a minute.
  static constexpr int kFreeAddressAuthFailures = 4 * kFreeAuthFailures;
  // an address quiet for this long starts afresh (a typo a day must not add up to a blocked address)
  static constexpr int64_t kAddressFailuresForgottenAfterMs = 10 * 60 * 1000;
  static constexpr size_t kMaxTrackedAddresses = 10000;
  // A wrong token from a blocked address: counts the attempt and says until when; false when not blocked.
  bool address_blocked(const std::string& address, int64_t now_ms, int64_t& retry_after_ms);
  ApiResponse route(const ApiRequest& req);
  using Handler = ApiResponse (*)(QuotaService&, const Caller&, const ApiRequest&, const std::vector<std::string>&,
                                  int64_t id);
  struct Route {
    RouteSpec spec;
    Handler handler;  // null for the HTTP front's pages
  };
  static const std::vector<Route>& route_table();
  // Runs `op` under the engine lock; if it changed state, the change is written before the answer leaves and
  // a failed write restores the engine as it was (503 with Retry-After).
  ApiResponse locked(const std::function<ApiResponse()>& op, bool writes = true);
  ApiResponse read_locked(const std::function<ApiResponse()>& op) { return locked(op, false); }
  ApiResponse locked_local(const std::function<ApiResponse()>& op);
  void reload_locked(int64_t now_ms);
  // Compares the wall clock with the monotonic clock since the last check; a step moves the engine's clocks.
  void follow_clock_locked();
  // The same for local mode, whose processes share the store: the reference is kept in it (meta).
  void follow_shared_clock_locked(int64_t now_ms);
  // The heartbeats answered from the board since the last merge, into the engine and the tracker.
  void merge_beats_locked();
  // The board after a committed change: `changed` leases, every queued position, pruned leases dropped.
  void publish_locked(const Changes& changes, bool all);
  void count_committed(const Changes& changes);
  bool can_read(const Caller& caller, const Lease& lease) const;
  bool can_act(const Caller& caller, const Lease& lease) const;
  // The one rule for acting on a lease of `user` in `team`: the holder, a lead of the team, an admin.
  static bool may_act(const Caller& caller, const std::string& user, const std::string& team);
  nlohmann::json lease_view(const Lease& lease, int64_t now_ms) const;
  ApiResponse acquire(const Caller& caller, const ApiRequest& req);
  ApiResponse get_lease(const Caller& caller, int64_t id);
  ApiResponse list_leases(const Caller& caller, const ApiRequest& req);
  ApiResponse heartbeat(const Caller& caller, int64_t id, const std::string& body);
  ApiResponse release(const Caller& caller, int64_t id, const std::string& body);
  ApiResponse decide(const Caller& caller, int64_t approval_id, bool approve, const std::string& body);
  ApiResponse list_approvals(const Caller& caller);
  ApiResponse review(const Caller& caller, int64_t id, const std::string& body);
  ApiResponse teams(const Caller& caller);
  ApiResponse queue(const Caller& caller);
  ApiResponse audit(const Caller& caller, const ApiRequest& req);
  // Loans, contribution credits and balances (issue 19; ledger_api.cpp): /v1/loans, /v1/credits, /v1/balance.
  ApiResponse ledger_route(const Caller& caller, const ApiRequest& req, const std::vector<std::string>& parts);

  Policy policy_;
  // Requests read policy_ (users, tokens, teams) shared; reload_policy() replaces it exclusive.
  mutable std::shared_mutex policy_mutex_;
  ServiceOptions options_;
  std::function<int64_t()> clock_;
  std::function<int64_t()> monotonic_;
  int64_t clock_offset_ms_ = 0;  // wall minus monotonic at the last check (under mutex_)
  std::string local_clock_id_;   // which monotonic clock local mode's stored offset refers to (set once)
  std::mutex mutex_;             // the engine and the tracker
  std::mutex store_mutex_;
  Engine engine_;
  std::unique_ptr<StateStore> store_;
  std::atomic<int64_t> last_tick_ms_{0};  // monotonic
  std::atomic<std::chrono::steady_clock::rep> store_down_until_{
      0};                          // steady clock  // the last saved tick (the maintenance thread)
  mutable std::mutex beat_mutex_;  // the board and the pending samples; never held during I/O
  std::map<int64_t, Beat> board_;
  std::vector<HeartbeatSample> pending_heartbeats_;  // for the store (batched)
  // Raw reports for the engine and the tracker, ts_ms on the monotonic clock (a wall step between a report and
  // its merge must not move it twice, or not at all).
  std::vector<HeartbeatSample> unmerged_beats_;
  std::atomic<uint64_t> heartbeats_total_{0};
  std::atomic<uint64_t> preemptions_total_{0};
  std::atomic<uint64_t> emergency_total_{0};
  std::atomic<uint64_t> storage_write_errors_{0};
  std::array<std::atomic<uint64_t>, 600> responses_by_status_{};
  UtilTracker tracker_;  // guarded by mutex_
  std::mutex auth_mutex_;
  std::map<std::string, AuthFailures> auth_failures_;        // by auth_key()
  std::map<std::string, AddressFailures> address_failures_;  // by client address
  std::map<std::string, int> auth_unreported_;               // attempts not yet audited, by client address
};

}  // namespace yolo8::quota
