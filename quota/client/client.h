#pragma once
// QuotaClient: what the trainer uses to hold a GPU lease (modes: off, local embedded engine, or quotad URLs).
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

class BearerToken;
class HostResolver;
class QuotaTransport;
struct HttpOptions;
struct HttpTimeouts;

struct ClientConfig {
  // "off", "local", or quotad's URL such as "http://127.0.0.1:8470" or "https://quotad:8443"; or the URLs of its
  // replicas, comma-separated ("https://a:8470,https://b:8470", see parse_endpoints).
  std::string mode = "local";
  std::string token;  // bearer token for URL mode
  // URL mode: the file holding the bearer token instead (a mounted Kubernetes Secret, a trailing newline ignored);
  // read at the start and again after a 401, the request then sent once more when it changed (a rotation).
  std::string token_file;
  std::string ca_file;              // https: the CA (PEM) quotad's certificate chains to; empty: the system's
  std::string local_db;             // local mode database; default $XDG_CACHE_HOME or ~/.cache/yolo8/quota.db
  std::string local_policy;         // local mode policy YAML; default: local_policy(local_gpus, ...)
  std::string local_memory_table;   // local mode without a policy file: admission check from this table (optional)
  int local_gpus = 1;               // this machine's GPUs, local:i = CUDA device i (the trainer passes their count)
  double local_gpu_memory_gib = 0;  // 0: unknown (16 GiB assumed)
  std::string user;                 // local mode user; default $USER
  double poll_interval_s = 1.0;
  // While quotad does not answer (unreachable, no answer within the timeouts, a name lookup that runs late) or
  // answers a transient status (answer_class), acquire() waits and tries again for at most this long, then throws
  // QuotaUnavailable. The waits grow from retry_initial_s to retry_max_s, with jitter; a Retry-After is the least,
  // up to retry_after_max_s.
  double unavailable_deadline_s = 600;
  double retry_initial_s = 1.0;
  double retry_max_s = 30.0;
  double retry_after_max_s = 300;
  std::function<int64_t()> clock;  // tests
  // What the client says unasked: which quotad answers when that changes (with several endpoints). Called from
  // the heartbeat thread too. Unset: a line on stdout.
  std::function<void(const std::string&)> on_notice;
};

// The endpoints of a URL `mode`: one quotad URL, or several replicas' comma-separated, all of one scheme, each
// http(s)://host[:port] with an optional trailing slash. Returned as written less spaces around them and the
// slash, the scheme in lower case. Throws std::invalid_argument naming `setting` and the bad element, a repeated
// one included (compared as normalise_endpoint does).
std::vector<std::string> parse_endpoints(const std::string& text, const std::string& setting = "quota");

// "scheme://host:port", lower case, the scheme's default port filled in: the form in which two spellings of one
// quotad are equal (a trailing slash is ignored). "" when `url` is not an http(s)://host[:port] URL.
std::string normalise_endpoint(const std::string& url);

// Client settings from the trainer's `quota` setting: "off", "local", "local:/path/to/quota.db", or a quotad
// URL ("http://host:port", "https://host:port") or several (its replicas, comma-separated); the bearer token
// comes from $YOLO8_QUOTA_TOKEN, the CA file for https from $YOLO8_QUOTA_CA_FILE, the local user from $USER.
// Throws std::invalid_argument naming the setting (and the bad URL of a list) when it is none of these.
ClientConfig client_config_from_setting(const std::string& setting, int local_gpus = 1,
                                        double local_gpu_memory_gib = 0);

// quotad stayed unavailable (no answer, or a transient status: answer_class) for
// ClientConfig::unavailable_deadline_s: worth trying again later, unlike a refusal. `status`: the last answer's
// (0: none).
class QuotaUnavailable : public std::runtime_error {
 public:
  QuotaUnavailable(int status, const std::string& reason) : std::runtime_error(reason), status_(status) {}
  int status() const { return status_; }

 private:
  int status_;
};

// What an answer's status means to the client.
enum class AnswerClass {
  kAnswered,   // 1xx-3xx: quotad's answer, read as such
  kTransient,  // "not now": retried with back-off (a lease request until the deadline, then exit 75)
  kRefused,    // "no": retrying cannot change it (bad token, not allowed, bad request), exit 2
};
// One table: no answer (0), 429 (quotad's rate limit), 500, 502, 503 (quotad's "retry": a storage stall) and 504
// are transient; every other 4xx and 5xx a refusal.
AnswerClass answer_class(int status);
// answer_class(status) == kTransient.
bool is_unavailable(int status);

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
  // The grant receipt quotad signed (null from a quotad without receipts): presented should quotad answer a
  // heartbeat or the release "unknown lease" (a database restored from a backup that predates the grant).
  nlohmann::json receipt;
};

// Why acquire() waits; the texts are the "status" the service answers a lease request with.
enum class WaitStatus { kQueued, kNeedsApproval };
std::string to_string(WaitStatus status);
// Throws std::runtime_error naming the field for any other text.
WaitStatus parse_wait_status(const std::string& text);
// Prints the text form (the trainer logs it while waiting).
std::ostream& operator<<(std::ostream& out, WaitStatus status);

// acquire() is about to wait for an unavailable quotad before its next attempt (with several endpoints: after
// each of them was tried once, in a round).
struct RetryInfo {
  int attempt = 0;          // the attempts (rounds) answered so far this way, from 1
  int status = 0;           // the last answer's; 0: no answer
  std::string reason;       // with several endpoints each one's answer: "https://a:8470: 503: ...; https://b:8470: ..."
  double retry_in_s = 0;    // the wait before the next attempt
  double give_up_in_s = 0;  // what is left of unavailable_deadline_s
};

// What acquire() does while quotad is unavailable (both optional).
struct RetryHooks {
  std::function<void(const RetryInfo&)> on_retry;  // before each wait
  std::function<void()> check;                     // polled every 100 ms during the waits; may throw to give up
};

// What release() got back.
struct ReleaseAnswer {
  bool acknowledged = false;  // quotad answered 200: the lease has ended there
  bool released_now = false;  // ... by this release (else it had already ended: expired, released)
  int status = 0;             // 0: no answer
  std::string state;          // the lease's state quotad answered with
  std::string reason;         // why it was not acknowledged
};

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

  bool enabled() const { return !transports_.empty(); }
  // The endpoint requests go to first: the last one that answered (with several, e.g. a new leader).
  std::string current_endpoint() const;
  // Blocks until granted, calling on_wait while queued / awaiting approval. An unavailable quotad (is_unavailable)
  // is retried with back-off, reported through `retry`, for unavailable_deadline_s, then QuotaUnavailable. Throws
  // QuotaRefused on the other 4xx and 5xx, std::runtime_error when `max_wait_s` passes (the request is cancelled).
  LeaseInfo acquire(const LeaseRequest& req, const std::function<void(const WaitInfo&)>& on_wait = {},
                    double max_wait_s = 7 * 24 * 3600.0, const RetryHooks& retry = {});
  // Background heartbeats every heartbeat_interval_s with figures from `provider`.
  void start_heartbeats(std::function<Telemetry()> provider = {});
  void stop_heartbeats();
  // The server revoked the lease (preemption): checkpoint and release before revoke_deadline_ms().
  bool revoked() const { return revoked_; }
  int64_t revoke_deadline_ms() const { return deadline_ms_; }
  // The lease ended on the server (expired, released elsewhere): stop using the GPUs.
  bool lost() const { return lost_; }
  // No successful heartbeat for fence_after_ms(): the trainer should checkpoint and yield (self-fencing), and be
  // gone by ttl_s - heartbeat_interval_s after the last one, before the server could expire the lease.
  bool unreachable_too_long() const;
  // The fence: ttl_s - heartbeat_interval_s less a reserve for the last step, the checkpoint and one release
  // call (an interval, at least 5 s), but never under two intervals (one late heartbeat is no outage).
  int64_t fence_after_ms() const;
  // When quotad expires the lease if it hears nothing more: ttl_s after the last acknowledged heartbeat (the grant
  // before any), in this machine's wall-clock milliseconds.
  int64_t expires_at_ms() const;
  // Ends the lease (idempotent); stops heartbeats first (a beat in flight is abandoned), then, while quotad
  // answers, sends one last heartbeat with the provider's figures, so a run shorter than an interval still reports
  // its peak memory and last step. An unavailable quotad is tried once more (each endpoint once) when the
  // heartbeats got no answer, else for a few seconds; every call is bounded by the heartbeat timeouts.
  ReleaseAnswer release(Outcome outcome);
  // Ends lease `id` of an earlier process (one whose release quotad never acknowledged) with `outcome`: one round
  // of the endpoints; the answer as release() gives it.
  ReleaseAnswer release_earlier(int64_t id, Outcome outcome);
  const LeaseInfo& lease() const { return lease_; }
  // How often quotad re-admitted this lease from its receipt (it had lost it with a restore).
  int reattachments() const { return reattachments_; }

  // Default local database path.
  static std::string default_local_db();

 private:
  // One request tried at the endpoints in one round (see route()): the answer (the last one when none was
  // usable, with the least Retry-After of the round) and, when none was, what each endpoint answered.
  struct Routed {
    ApiResponse response;
    std::string failures;
  };
  Routed route(const ApiRequest& request, const std::vector<std::unique_ptr<QuotaTransport>>& transports,
               const std::function<bool()>& stop = {});
  Routed call(const ApiRequest& request);
  // Heartbeats and the release: short timeouts. `stop` ends a round between two endpoints.
  Routed beat_call(const ApiRequest& request, const std::function<bool()>& stop = {});
  void notice(const std::string& text) const;
  // A connection's settings: the shared token and resolver, the CA file, `timeouts`.
  HttpOptions http_options(const HttpTimeouts& timeouts) const;
  ApiRequest heartbeat_request(const Telemetry& telemetry) const;
  // Sleeps `seconds` in slices, polling hooks.check.
  void pause(double seconds, const RetryHooks& hooks) const;
  // quotad answered "unknown lease" for the held lease: its receipt presented (POST /v1/leases/{id}/reattach).
  // True when quotad re-admitted it; said either way through notice() (nothing without a receipt).
  bool reattach(const std::function<bool()>& stop = {});
  static bool unknown_lease(const ApiResponse& response);
  // A release's answer: acknowledged only on 200.
  static ReleaseAnswer release_answer(const Routed& routed);
  int64_t now_ms() const;
  int64_t steady_ms() const;

  ClientConfig config_;
  std::shared_ptr<BearerToken> token_;      // URL mode; shared by every connection, so one reload serves them all
  std::shared_ptr<HostResolver> resolver_;  // URL mode; one cache of the endpoints' addresses
  std::vector<std::string> endpoints_;      // the quotad URLs; "local" in local mode; none in mode off
  std::vector<std::unique_ptr<QuotaTransport>> transports_;  // one per endpoint
  // Each quotad's own connection for heartbeats and the release, with timeouts from the lease's interval; made by
  // start_heartbeats (none in local mode: transports_ then).
  std::vector<std::unique_ptr<QuotaTransport>> beat_transports_;
  std::atomic<size_t> current_{0};  // the index of current_endpoint()
  LeaseInfo lease_;
  std::atomic<bool> revoked_{false};
  std::atomic<bool> lost_{false};
  std::atomic<int> reattachments_{0};
  std::atomic<int64_t> deadline_ms_{0};
  std::atomic<int64_t> last_ok_steady_ms_{0};
  std::atomic<bool> beat_unanswered_{false};  // the last heartbeat got no answer (or 502/503/504)
  std::atomic<bool> heartbeat_done_{true};    // the heartbeat thread has left its loop
  std::thread heartbeat_thread_;
  std::function<Telemetry()> heartbeat_provider_;
  std::mutex heartbeat_mutex_;
  std::condition_variable heartbeat_wakeup_;  // stop_heartbeats() ends the wait between beats early
  bool heartbeat_stop_ = false;
  bool released_ = false;
  ReleaseAnswer release_answer_;
};

}  // namespace yolo8::quota
