#pragma once
// QuotaClient: what the trainer uses to hold a GPU lease (modes: off, local embedded engine, or a quotad URL).
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "quota/core/api.h"
#include "quota/core/engine.h"

namespace yolo8::quota {

class QuotaTransport;

struct ClientConfig {
  // "off", "local", or a quotad URL such as "http://127.0.0.1:8470" or "https://quotad:8443".
  std::string mode = "local";
  std::string token;                // bearer token for URL mode
  std::string ca_file;              // https: the CA (PEM) quotad's certificate chains to; empty: the system's
  std::string local_db;             // local mode database; default $XDG_CACHE_HOME or ~/.cache/yolo8/quota.db
  std::string local_policy;         // local mode policy YAML; default: local_policy(local_gpus, ...)
  std::string local_memory_table;   // local mode without a policy file: admission check from this table (optional)
  int local_gpus = 1;               // this machine's GPUs, local:i = CUDA device i (the trainer passes their count)
  double local_gpu_memory_gib = 0;  // 0: unknown (16 GiB assumed)
  std::string user;                 // local mode user; default $USER
  double poll_interval_s = 1.0;
  std::function<int64_t()> clock;  // tests
};

// Client settings from the trainer's `quota` setting: "off", "local", "local:/path/to/quota.db", or a quotad
// URL ("http://host:port", "https://host:port"); the bearer token comes from $YOLO8_QUOTA_TOKEN, the CA file
// for https from $YOLO8_QUOTA_CA_FILE, the local user from $USER.
// Throws std::invalid_argument naming the setting when it is none of these.
ClientConfig client_config_from_setting(const std::string& setting, int local_gpus = 1,
                                        double local_gpu_memory_gib = 0);

// The server said no (or the request was bad): HTTP-like status and the server's reason.
class QuotaRefused : public std::runtime_error {
 public:
  QuotaRefused(int status, const std::string& reason, int max_batch = 0)
      : std::runtime_error(reason), status_(status), max_batch_(max_batch) {}
  int status() const { return status_; }
  int max_batch() const { return max_batch_; }  // admission refusals: the largest batch that fits

 private:
  int status_;
  int max_batch_;
};

struct LeaseInfo {
  int64_t id = 0;                           // 0 in mode off
  LeaseState state = LeaseState::kGranted;  // granted or revoking once acquire() returns
  std::vector<std::string> devices;         // "node:index"
  double memory_gib = 0;                    // per GPU: what the holder may use (its GPU's memory, or its share)
  std::string memory_row;  // the memory table row quotad's admission used ("" when none, or after a wait)
  bool shared = false;
  int ttl_s = 0;
  int heartbeat_interval_s = 0;
  int preempt_grace_s = 0;
};

// Why acquire() waits; the texts are the "status" the service answers a lease request with.
enum class WaitStatus { kQueued, kNeedsApproval };
std::string to_string(WaitStatus status);
// Throws std::runtime_error naming the field for any other text.
WaitStatus parse_wait_status(const std::string& text);
// Prints the text form (the trainer logs it while waiting).
std::ostream& operator<<(std::ostream& out, WaitStatus status);

struct WaitInfo {
  WaitStatus status = WaitStatus::kQueued;
  int64_t lease_id = 0;
  int64_t approval_id = 0;
  int position = 0;
  std::string reason;
};

class QuotaClient {
 public:
  explicit QuotaClient(ClientConfig config);
  ~QuotaClient();
  QuotaClient(const QuotaClient&) = delete;
  QuotaClient& operator=(const QuotaClient&) = delete;

  bool enabled() const { return transport_ != nullptr; }
  // Blocks until granted, calling on_wait while queued / awaiting approval. Throws QuotaRefused on 4xx,
  // std::runtime_error when the service stays unreachable or `max_wait_s` passes (the request is cancelled).
  LeaseInfo acquire(const LeaseRequest& req, const std::function<void(const WaitInfo&)>& on_wait = {},
                    double max_wait_s = 7 * 24 * 3600.0);
  // Background heartbeats every heartbeat_interval_s with figures from `provider`.
  void start_heartbeats(std::function<Telemetry()> provider = {});
  void stop_heartbeats();
  // The server revoked the lease (preemption): checkpoint and release before revoke_deadline_ms().
  bool revoked() const { return revoked_; }
  int64_t revoke_deadline_ms() const { return deadline_ms_; }
  // The lease ended on the server (expired, released elsewhere): stop using the GPUs.
  bool lost() const { return lost_; }
  // No successful heartbeat for longer than the TTL minus one heartbeat interval: the server may expire the
  // lease soon, so the trainer should checkpoint and yield (self-fencing).
  bool unreachable_too_long() const;
  // Ends the lease (idempotent); stops heartbeats first, then sends one last heartbeat with the provider's figures,
  // so a run shorter than an interval still reports its peak memory and last step.
  void release(Outcome outcome);
  const LeaseInfo& lease() const { return lease_; }

  // Default local database path.
  static std::string default_local_db();

 private:
  ApiResponse call(const ApiRequest& request);
  ApiRequest heartbeat_request(const Telemetry& telemetry) const;
  int64_t now_ms() const;
  int64_t steady_ms() const;

  ClientConfig config_;
  std::unique_ptr<QuotaTransport> transport_;  // null in mode off
  LeaseInfo lease_;
  std::atomic<bool> revoked_{false};
  std::atomic<bool> lost_{false};
  std::atomic<int64_t> deadline_ms_{0};
  std::atomic<int64_t> last_ok_steady_ms_{0};
  std::thread heartbeat_thread_;
  std::function<Telemetry()> heartbeat_provider_;
  std::mutex heartbeat_mutex_;
  std::condition_variable heartbeat_wakeup_;  // stop_heartbeats() ends the wait between beats early
  bool heartbeat_stop_ = false;
  bool released_ = false;
};

}  // namespace yolo8::quota
