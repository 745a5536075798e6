#include "quota/client/client.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <ostream>
#include <random>

#include "quota/client/transport.h"
#include "quota/core/codec.h"

namespace yolo8::quota {

using nlohmann::json;

namespace {

std::string random_key() {
  std::random_device device;
  const auto now = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  std::mt19937_64 generator((static_cast<uint64_t>(device()) << 32) ^ device() ^ now);
  const char* hex = "0123456789abcdef";
  std::string key;
  for (int i = 0; i < 32; ++i) key += hex[generator() % 16];
  return key;
}

// The lease state the service answered with; an unknown text is an error naming the field, not a guess.
LeaseState lease_state_of(const json& body) {
  try {
    return parse_lease_state(body.value("state", ""));
  } catch (const PolicyError& error) {
    throw std::runtime_error(std::string("quota: the service answered with an unknown lease ") + error.what());
  }
}

LeaseInfo lease_info(const json& view) {
  LeaseInfo lease;
  lease.id = view.value("id", int64_t{0});
  lease.state = lease_state_of(view);
  lease.devices = view.value("devices", std::vector<std::string>{});
  lease.memory_gib = view.value("memory_gib", 0.0);
  lease.shared = view.value("shared", false);
  lease.ttl_s = view.value("ttl_s", 60);
  lease.heartbeat_interval_s = view.value("heartbeat_interval_s", 10);
  lease.preempt_grace_s = view.value("preempt_grace_s", 0);
  return lease;
}

std::string reason_of(const ApiResponse& response) {
  if (response.body.is_object() && response.body.contains("reason") && response.body["reason"].is_string()) {
    return response.body["reason"].get<std::string>();
  }
  return "status " + std::to_string(response.status);
}

// "503: storage: ...", or the transport's reason alone when nothing answered.
std::string answer_text(const ApiResponse& response) {
  return response.status == 0 ? reason_of(response) : std::to_string(response.status) + ": " + reason_of(response);
}

// Retry-After in seconds (0: absent, or an HTTP date, which quotad never sends).
double retry_after_s(const ApiResponse& response) {
  const auto header = response.headers.find("Retry-After");
  if (header == response.headers.end()) return 0;
  try {
    return std::max(0.0, std::stod(header->second));
  } catch (const std::exception&) {
    return 0;
  }
}

double uniform(double low, double high) {
  thread_local std::mt19937_64 generator(std::random_device{}());
  return std::uniform_real_distribution<double>(low, high)(generator);
}

// A heartbeat or release waits at most about one interval (1-3 s) for quotad: a later answer is no help, and the
// trainer's stop must not wait longer than that for a hung quotad.
HttpTimeouts beat_timeouts(int heartbeat_interval_s) {
  const double seconds = std::clamp(static_cast<double>(heartbeat_interval_s), 1.0, 3.0);
  return HttpTimeouts{seconds, seconds};
}

}  // namespace

bool is_unavailable(int status) { return status == 0 || status == 502 || status == 503 || status == 504; }

std::string to_string(WaitStatus status) {
  switch (status) {
    case WaitStatus::kQueued: return "queued";
    case WaitStatus::kNeedsApproval: return "needs_approval";
  }
  return "queued";
}

WaitStatus parse_wait_status(const std::string& text) {
  for (const WaitStatus status : {WaitStatus::kQueued, WaitStatus::kNeedsApproval}) {
    if (to_string(status) == text) return status;
  }
  throw std::runtime_error("quota: status: '" + text + "' is not one of queued, needs_approval");
}

std::ostream& operator<<(std::ostream& out, WaitStatus status) { return out << to_string(status); }

ClientConfig client_config_from_setting(const std::string& setting, int local_gpus, double local_gpu_memory_gib) {
  ClientConfig config;
  config.local_gpus = local_gpus;
  config.local_gpu_memory_gib = local_gpu_memory_gib;
  if (setting == "off" || setting == "local" || setting.empty()) {
    config.mode = setting.empty() ? "local" : setting;
  } else if (setting.rfind("local:", 0) == 0 && setting.size() > 6) {
    config.mode = "local";
    config.local_db = setting.substr(6);
  } else if ((setting.rfind("http://", 0) == 0 && setting.size() > 7) ||
             (setting.rfind("https://", 0) == 0 && setting.size() > 8)) {
    config.mode = setting;
    if (const char* token = std::getenv("YOLO8_QUOTA_TOKEN")) config.token = token;
    if (const char* ca_file = std::getenv("YOLO8_QUOTA_CA_FILE")) config.ca_file = ca_file;
  } else {
    throw std::invalid_argument("quota: '" + setting + "' is not off, local, local:PATH or an http(s):// URL");
  }
  return config;
}

std::string QuotaClient::default_local_db() {
  std::string base;
  if (const char* cache_home = std::getenv("XDG_CACHE_HOME"); cache_home != nullptr && *cache_home) {
    base = cache_home;
  } else if (const char* home = std::getenv("HOME"); home != nullptr && *home) {
    base = std::string(home) + "/.cache";
  } else {
    base = "/tmp";
  }
  return base + "/yolo8/quota.db";
}

QuotaClient::QuotaClient(ClientConfig config) : config_(std::move(config)) {
  if (config_.mode == "off") return;
  if (config_.mode == "local" || config_.mode.empty()) {
    if (config_.user.empty()) {
      const char* user = std::getenv("USER");
      config_.user = user != nullptr && *user ? user : "local";
    }
    std::string db = config_.local_db.empty() ? default_local_db() : config_.local_db;
    const auto parent = std::filesystem::path(db).parent_path();
    if (!parent.empty()) std::filesystem::create_directories(parent);
    Policy policy = config_.local_policy.empty()
                        ? local_policy(config_.local_gpus, config_.local_gpu_memory_gib, config_.user)
                        : load_policy(config_.local_policy);
    if (config_.local_policy.empty() && !config_.local_memory_table.empty()) {
      policy.memory_table = load_memory_table(config_.local_memory_table);
    }
    ServiceOptions options;
    options.db_path = db;
    options.reload_per_call = true;
    options.clock = config_.clock;
    transport_ = make_local_transport(std::move(policy), options, config_.user);
  } else if (config_.mode.rfind("http://", 0) == 0 || config_.mode.rfind("https://", 0) == 0) {
    transport_ = make_http_transport(config_.mode, config_.token, config_.ca_file);
  } else {
    throw std::invalid_argument("quota: '" + config_.mode + "' is not off, local or an http(s):// URL");
  }
}

QuotaClient::~QuotaClient() { stop_heartbeats(); }

int64_t QuotaClient::now_ms() const { return config_.clock ? config_.clock() : system_now_ms(); }

int64_t QuotaClient::steady_ms() const {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

ApiResponse QuotaClient::call(const ApiRequest& request) { return transport_->call(request); }

ApiResponse QuotaClient::beat_call(const ApiRequest& request) {
  return (beat_transport_ ? beat_transport_ : transport_)->call(request);
}

void QuotaClient::pause(double seconds, const RetryHooks& hooks) const {
  const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(static_cast<int64_t>(seconds * 1e6));
  for (;;) {
    if (hooks.check) hooks.check();
    const auto now = std::chrono::steady_clock::now();
    if (now >= until) return;
    std::this_thread::sleep_for(
        std::min<std::chrono::steady_clock::duration>(until - now, std::chrono::milliseconds(100)));
  }
}

LeaseInfo QuotaClient::acquire(const LeaseRequest& request, const std::function<void(const WaitInfo&)>& on_wait,
                               double max_wait_s, const RetryHooks& retry) {
  if (!enabled()) {
    lease_ = LeaseInfo{};
    lease_.state = LeaseState::kGranted;
    return lease_;
  }
  revoked_ = false;
  lost_ = false;
  released_ = false;
  ApiRequest ask;
  ask.method = "POST";
  ask.path = "/v1/leases";
  ask.body = to_json(request).dump();
  ask.idempotency_key = request.idempotency_key.empty() ? random_key() : request.idempotency_key;
  const int64_t start = steady_ms();
  const auto poll = std::chrono::milliseconds(static_cast<int64_t>(config_.poll_interval_s * 1000));
  // An unavailable answer waits (back-off doubling from retry_initial_s with jitter, at least Retry-After) and
  // tries again, until unavailable_deadline_s after the call that began a run of such answers (`called`: when
  // this one began; a hung quotad takes the read timeout to give it).
  int unavailable_attempts = 0;
  int64_t unavailable_since = 0;
  int64_t called = 0;
  const auto wait_out = [&](const ApiResponse& response) {
    if (unavailable_attempts++ == 0) unavailable_since = called;
    const double unavailable_s = static_cast<double>(steady_ms() - unavailable_since) / 1000.0;
    const double left_s = config_.unavailable_deadline_s - unavailable_s;
    if (left_s <= 0) {
      throw QuotaUnavailable(response.status, "quotad unavailable for " + fixed_text(unavailable_s, 0) +
                                                  " s, the last of " + std::to_string(unavailable_attempts) +
                                                  " attempts: " + answer_text(response));
    }
    const double backoff =
        std::min(config_.retry_max_s, config_.retry_initial_s * std::pow(2.0, std::min(unavailable_attempts - 1, 30)));
    const double after = retry_after_s(response);
    // equal jitter: trainers that lost quotad together do not come back together
    const double delay = std::min(left_s, std::max(after * uniform(1.0, 1.2), backoff * uniform(0.5, 1.0)));
    if (retry.on_retry) {
      RetryInfo info;
      info.attempt = unavailable_attempts;
      info.status = response.status;
      info.reason = reason_of(response);
      info.retry_in_s = delay;
      info.give_up_in_s = left_s;
      retry.on_retry(info);
    }
    pause(delay, retry);
  };
  ApiResponse response;
  // the idempotency key makes the retries safe: an ask that was applied but not answered returns the same lease
  for (;;) {
    called = steady_ms();
    response = call(ask);
    if (!is_unavailable(response.status)) break;
    wait_out(response);
  }
  if (response.status == 201) {
    lease_ = lease_info(response.body.at("lease"));
    lease_.memory_row = response.body.value("memory_row", "");
    last_ok_steady_ms_ = steady_ms();
    return lease_;
  }
  const std::string needs_approval = to_string(WaitStatus::kNeedsApproval);
  if (response.status != 202 && !(response.status == 403 && response.body.value("status", "") == needs_approval)) {
    throw QuotaRefused(response.status, reason_of(response), response.body.value("max_batch", 0));
  }
  const int64_t id = response.body.value("lease_id", int64_t{0});
  WaitInfo wait;
  wait.lease_id = id;
  wait.status = parse_wait_status(response.body.value("status", ""));
  wait.approval_id = response.body.value("approval_id", int64_t{0});
  wait.position = response.body.value("position", 0);
  wait.reason = reason_of(response);
  ApiRequest poll_request;
  poll_request.method = "GET";
  poll_request.path = "/v1/leases/" + std::to_string(id);
  const auto cancel_request = [&] {
    ApiRequest cancel;
    cancel.method = "POST";
    cancel.path = poll_request.path + "/release";
    cancel.body = json{{"outcome", to_string(Outcome::kCancelled)}}.dump();
    call(cancel);
  };
  // on_wait and the retry hooks may throw to give up (the trainer does on SIGTERM), and quotad may stay
  // unavailable: the queued request is cancelled (best effort), not left to be granted to nobody.
  const auto give_up_on_throw = [&](const auto& step) {
    try {
      step();
    } catch (...) {
      cancel_request();
      throw;
    }
  };
  const auto report_wait = [&] {
    if (on_wait) give_up_on_throw([&] { on_wait(wait); });
  };
  report_wait();
  for (;;) {
    if (steady_ms() - start > static_cast<int64_t>(max_wait_s * 1000)) {
      cancel_request();
      throw std::runtime_error("quota: gave up waiting for lease " + std::to_string(id));
    }
    std::this_thread::sleep_for(poll);
    called = steady_ms();
    response = call(poll_request);
    if (is_unavailable(response.status)) {
      give_up_on_throw([&] { wait_out(response); });
      continue;
    }
    unavailable_attempts = 0;
    if (response.status != 200) throw QuotaRefused(response.status, reason_of(response));
    const LeaseState state = lease_state_of(response.body);
    if (state == LeaseState::kGranted || state == LeaseState::kRevoking) {
      lease_ = lease_info(response.body);
      last_ok_steady_ms_ = steady_ms();
      if (state == LeaseState::kRevoking) {
        revoked_ = true;
        deadline_ms_ = response.body.value("deadline_ms", int64_t{0});
      }
      return lease_;
    }
    if (state == LeaseState::kQueued || state == LeaseState::kPendingApproval) {
      wait.status = state == LeaseState::kQueued ? WaitStatus::kQueued : WaitStatus::kNeedsApproval;
      wait.position = response.body.value("position", 0);
      wait.reason = response.body.value("reason", "");
      report_wait();
      continue;
    }
    throw QuotaRefused(
        403, "lease " + std::to_string(id) + " " + to_string(state) + ": " + response.body.value("reason", ""));
  }
}

void QuotaClient::start_heartbeats(std::function<Telemetry()> provider) {
  if (!enabled() || lease_.id == 0 || heartbeat_thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(heartbeat_mutex_);
    heartbeat_stop_ = false;
  }
  // Its own connection: stop_heartbeats() can abandon a beat in flight without touching the release's.
  if (config_.mode.rfind("http", 0) == 0 && !beat_transport_) {
    beat_transport_ =
        make_http_transport(config_.mode, config_.token, config_.ca_file, beat_timeouts(lease_.heartbeat_interval_s));
  }
  last_ok_steady_ms_ = steady_ms();
  beat_unanswered_ = false;
  heartbeat_provider_ = provider;
  heartbeat_done_ = false;
  heartbeat_thread_ = std::thread([this, provider] {
    const int64_t interval_ms = std::max(1, lease_.heartbeat_interval_s) * 1000;
    int64_t wait_ms = 0;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(heartbeat_mutex_);
        if (heartbeat_wakeup_.wait_for(lock, std::chrono::milliseconds(wait_ms), [this] { return heartbeat_stop_; })) {
          break;
        }
      }
      const ApiResponse response = beat_call(heartbeat_request(provider ? provider() : Telemetry{}));
      beat_unanswered_ = is_unavailable(response.status);
      if (beat_unanswered_) {
        wait_ms = std::max<int64_t>(500, interval_ms / 4);  // retry sooner while unreachable
        continue;
      }
      wait_ms = interval_ms;
      if (response.status != 200) {
        if (response.status == 404) lost_ = true;
        continue;
      }
      last_ok_steady_ms_ = steady_ms();
      // No exception may leave this thread: a state text this client does not know counts as not granted, as
      // any state but granted/revoking does, so the trainer stops using the GPUs.
      std::optional<LeaseState> state;
      try {
        state = lease_state_of(response.body);
      } catch (const std::runtime_error&) {
        state.reset();
      }
      if (state == LeaseState::kRevoking) {
        deadline_ms_ = response.body.value("deadline_ms", int64_t{0});
        revoked_ = true;
      } else if (state != LeaseState::kGranted) {
        lost_ = true;
        break;
      }
    }
    heartbeat_done_ = true;
  });
}

ApiRequest QuotaClient::heartbeat_request(const Telemetry& telemetry) const {
  ApiRequest beat;
  beat.method = "POST";
  beat.path = "/v1/leases/" + std::to_string(lease_.id) + "/heartbeat";
  beat.body = to_json(telemetry).dump();
  return beat;
}

void QuotaClient::stop_heartbeats() {
  {
    std::lock_guard<std::mutex> lock(heartbeat_mutex_);
    heartbeat_stop_ = true;
  }
  heartbeat_wakeup_.notify_all();
  if (!heartbeat_thread_.joinable()) return;
  // A beat waiting on a hung quotad is cut short; again until the thread has left, since a beat may start just
  // after one cancel.
  while (beat_transport_ && !heartbeat_done_) {
    beat_transport_->cancel();
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  heartbeat_thread_.join();
}

int64_t QuotaClient::fence_after_ms() const {
  const int64_t interval_ms = static_cast<int64_t>(std::max(1, lease_.heartbeat_interval_s)) * 1000;
  const int64_t budget_ms = static_cast<int64_t>(lease_.ttl_s) * 1000 - interval_ms;
  const int64_t reserve_ms =
      std::clamp<int64_t>(std::max<int64_t>(interval_ms, 5000), 0, std::max<int64_t>(0, budget_ms - 2 * interval_ms));
  return std::max<int64_t>(1000, budget_ms - reserve_ms);
}

bool QuotaClient::unreachable_too_long() const {
  if (!enabled() || lease_.id == 0) return false;
  return steady_ms() - last_ok_steady_ms_ > fence_after_ms();
}

int64_t QuotaClient::expires_at_ms() const {
  return system_now_ms() - (steady_ms() - last_ok_steady_ms_) + static_cast<int64_t>(lease_.ttl_s) * 1000;
}

ReleaseAnswer QuotaClient::release(Outcome outcome) {
  const bool beating = heartbeat_thread_.joinable();
  stop_heartbeats();
  if (!enabled() || lease_.id == 0) {
    ReleaseAnswer none;
    none.acknowledged = true;  // nothing was held
    return none;
  }
  if (released_) return release_answer_;
  released_ = true;
  // While the heartbeats get answers quotad has a few seconds to take the release (a storage stall answers 503);
  // when they get none it has one call: the trainer is leaving before the lease could expire.
  bool answering = !beat_unanswered_;
  if (beating && heartbeat_provider_ && !lost_ && answering) {
    // The final figures: the first beat goes out before any step, the next one an interval later.
    answering = !is_unavailable(beat_call(heartbeat_request(heartbeat_provider_())).status);
  }
  ApiRequest request;
  request.method = "POST";
  request.path = "/v1/leases/" + std::to_string(lease_.id) + "/release";
  request.body = json{{"outcome", to_string(outcome == Outcome::kNone ? Outcome::kCompleted : outcome)}}.dump();
  constexpr int64_t kReleaseRetryMs = 5000;
  const int64_t give_up = steady_ms() + (answering ? kReleaseRetryMs : 0);
  ApiResponse response;
  for (;;) {
    response = beat_call(request);
    if (!is_unavailable(response.status)) break;
    const int64_t delay_ms = static_cast<int64_t>(std::clamp(retry_after_s(response), 0.5, 1.0) * 1000);
    if (steady_ms() + delay_ms > give_up) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
  }
  ReleaseAnswer& answer = release_answer_;
  answer.status = response.status;
  answer.acknowledged = response.status == 200;
  if (answer.acknowledged) {
    answer.state = response.body.value("state", "");
    // a first call that was applied but not answered in time makes the second one find it released already
    answer.released_now =
        response.body.value("released_now", false) || answer.state == to_string(LeaseState::kReleased);
  } else {
    answer.reason = answer_text(response);
  }
  return answer;
}

}  // namespace yolo8::quota
