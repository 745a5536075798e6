#pragma once
// The quota API as a transport-free service over the engine and its store: the HTTP server and the embedded
// local mode of the client both call handle(). /metrics and the status page belong to the server. Its parts:
// the router (router.h), the authentication gate (auth_gate.h), the heartbeat board (heartbeat_board.h) and the
// engine host (engine_host.h: the engine, its store and transactions, the clock follower); the handlers of the
// routes are here and in ledger_api.cpp.
#include <nlohmann/json.hpp>

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <shared_mutex>
#include <string>
#include <vector>

#include "quota/core/api.h"
#include "quota/core/engine.h"
#include "quota/core/usage.h"
#include "quota/service/auth_gate.h"
#include "quota/service/engine_host.h"
#include "quota/service/heartbeat_board.h"
#include "quota/service/router.h"

namespace yolo8::quota {

// Counters the service keeps for the exposition (monotonic since start).
struct ServiceCounters {
  uint64_t heartbeats = 0;
  uint64_t preemptions = 0;
  uint64_t emergency_grants = 0;
  uint64_t storage_write_errors = 0;  // failed SQLite writes (state changes or heartbeat batches)
  std::map<int, uint64_t> responses;  // by HTTP status
  std::string audit_chain_head;       // "<seq> <link>" of the audit log's hash chain; "" without a store
};

// A consistent view of the service's state for read-only pages.
struct ServiceView {
  const Policy& policy;
  const Engine& engine;
  const UtilTracker& tracker;
  ServiceCounters counters;
  int64_t now_ms;
};

// GET /readyz: 200 {ready: true, role} from a process that serves the state (`serves`, its mode `role`); else 503
// with Retry-After and {ready: false, role, leader}, the leader (null while unknown) being where traffic belongs.
// /healthz stays liveness: it answers whenever the process does.
ApiResponse readiness_answer(bool serves, const std::string& role, const std::string& leader);

class QuotaService {
 public:
  QuotaService(Policy policy, ServiceOptions options);

  // The one route table: it drives routing, 405 with Allow, the HTTP front's lanes and pages, and the route
  // list in quota/README.md (a test compares them).
  static const std::vector<RouteSpec>& routes() { return Router::routes(); }
  static RouteMatch match_route(const std::string& method, const std::string& path) {
    return Router::match(method, path);
  }

  // Never throws: every failure becomes a status with a `reason`.
  ApiResponse handle(const ApiRequest& req);
  // Expiry, deadlines, queue (the server calls it every second; local mode on every call).
  void tick();
  // Writes buffered heartbeat samples in one transaction (server mode batches them).
  void flush_heartbeats();
  std::vector<std::string> check_invariants();
  int64_t now() const { return host_.now(); }
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
  friend class Router;  // the route table names the handlers below
  using Parts = Router::Parts;
  ApiResponse locked(const std::function<ApiResponse()>& op) { return host_.run(op, true); }
  ApiResponse read_locked(const std::function<ApiResponse()>& op) { return host_.run(op, false); }
  // The engine, inside locked() and read_locked() only.
  Engine& engine() { return host_.engine(); }
  bool can_read(const Caller& caller, const Lease& lease) const;
  bool can_act(const Caller& caller, const Lease& lease) const;
  nlohmann::json lease_view(const Lease& lease, int64_t now_ms);
  ApiResponse healthz();
  ApiResponse readyz();
  ApiResponse acquire(const Caller& caller, const ApiRequest& req);
  ApiResponse get_lease(const Caller& caller, int64_t id);
  ApiResponse list_leases(const Caller& caller, const ApiRequest& req);
  ApiResponse heartbeat(const Caller& caller, int64_t id, const std::string& body);
  // A lease this quotad does not hold (lost with a restore), presented with its grant receipt (Engine::reattach):
  // answered like a heartbeat when re-admitted; else 400 (a bad signature), 403 (not the receipt's user) or 409.
  ApiResponse reattach(const Caller& caller, int64_t id, const std::string& body);
  ApiResponse release(const Caller& caller, int64_t id, const std::string& body);
  ApiResponse decide(const Caller& caller, int64_t approval_id, bool approve, const std::string& body);
  ApiResponse list_approvals(const Caller& caller);
  ApiResponse review(const Caller& caller, int64_t id, const std::string& body);
  ApiResponse teams(const Caller& caller);
  ApiResponse queue(const Caller& caller);
  ApiResponse audit(const Caller& caller, const ApiRequest& req);
  // Loans, contribution credits and balances (ledger_api.cpp): /v1/loans, /v1/credits, /v1/balance.
  ApiResponse ledger_route(const Caller& caller, const ApiRequest& req, const Parts& parts);

  // Requests read policy_ (users, tokens, teams) shared for their whole handling; reload_policy() replaces it
  // exclusive, so a reload waits for the requests in flight.
  mutable std::shared_mutex policy_mutex_;
  Policy policy_;
  ServiceOptions options_;
  AuthGate gate_;
  HeartbeatBoard board_;
  EngineHost host_;  // publishes to board_
  std::atomic<uint64_t> heartbeats_total_{0};
  std::array<std::atomic<uint64_t>, 600> responses_by_status_{};
};

}  // namespace yolo8::quota
