#pragma once
// The quota API as a transport-free router over the engine and its store: the HTTP server and the embedded
// local mode of the client both call handle(). /metrics and the status page belong to the server.
#include <nlohmann/json.hpp>

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "quota/core/api.h"
#include "quota/core/engine.h"
#include "quota/core/usage.h"
#include "quota/store/store.h"

namespace yolo8::quota {

struct ServiceOptions {
  std::string db_path;             // empty: state in memory only
  bool reload_per_call = false;    // local mode: several processes share db_path; each call locks and reloads it
  bool full_sync = false;          // SQLite synchronous=FULL instead of NORMAL
  std::function<int64_t()> clock;  // UTC ms; the system clock when empty
  int64_t keep_ended_ms = 24 * 3600 * 1000LL;  // ended leases kept in memory for GET
  bool write_each_heartbeat = false;           // commit every heartbeat sample at once instead of batching (benchmarks)
};

// Counters the service keeps for the exposition (monotonic since start).
struct ServiceCounters {
  uint64_t heartbeats = 0;
  uint64_t preemptions = 0;
  uint64_t emergency_grants = 0;
  uint64_t storage_write_errors = 0;  // failed SQLite writes (state changes or heartbeat batches)
  std::map<int, uint64_t> responses;  // by HTTP status
};

// A consistent view of the service's state for read-only pages.
struct ServiceView {
  const Policy& policy;
  const Engine& engine;
  const UtilTracker& tracker;
  ServiceCounters counters;
  int64_t now_ms;
};

class QuotaService {
 public:
  QuotaService(Policy policy, ServiceOptions options);

  // Never throws: every failure becomes a status with a `reason`.
  ApiResponse handle(const ApiRequest& req);
  // Expiry, deadlines, queue (the server calls it every second; local mode on every call).
  void tick();
  // Writes buffered heartbeat samples in one transaction (server mode batches them).
  void flush_heartbeats();
  std::vector<std::string> check_invariants();
  int64_t now() const { return clock_(); }
  const Policy& policy() const { return policy_; }
  // Runs `fn` on the engine under the service lock (tests, invariants).
  void inspect(const std::function<void(const Engine&)>& fn);
  // What /metrics and the status page render, read under the service lock with the tracker brought up to date.
  void observe(const std::function<void(const ServiceView&)>& fn);

 private:
  struct Caller {
    std::string name;
    std::string team;
    Role role = Role::kMember;
  };
  ApiResponse route(const ApiRequest& req);
  ApiResponse locked(const std::function<ApiResponse()>& op);
  void reload_locked(int64_t now_ms);
  void persist_locked();
  bool can_read(const Caller& caller, const Lease& lease) const;
  bool can_act(const Caller& caller, const Lease& lease) const;
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
  ApiResponse audit(const Caller& caller, const ApiRequest& req);

  Policy policy_;
  ServiceOptions options_;
  std::function<int64_t()> clock_;
  std::mutex mutex_;  // engine and pending heartbeats
  std::mutex store_mutex_;
  Engine engine_;
  std::unique_ptr<Store> store_;
  std::vector<HeartbeatSample> pending_heartbeats_;
  std::atomic<uint64_t> heartbeats_total_{0};
  std::atomic<uint64_t> preemptions_total_{0};
  std::atomic<uint64_t> emergency_total_{0};
  std::atomic<uint64_t> storage_write_errors_{0};
  std::array<std::atomic<uint64_t>, 600> responses_by_status_{};
  UtilTracker tracker_;  // guarded by mutex_
};

}  // namespace yolo8::quota
