#include "quota/client/client.h"

#include <chrono>
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

}  // namespace

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

LeaseInfo QuotaClient::acquire(const LeaseRequest& request, const std::function<void(const WaitInfo&)>& on_wait,
                               double max_wait_s) {
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
  ApiResponse response;
  // the idempotency key makes retries after network errors safe
  for (;;) {
    response = call(ask);
    if (response.status != 0) break;
    if (steady_ms() - start > 60000) throw std::runtime_error("quota: " + reason_of(response));
    std::this_thread::sleep_for(poll);
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
  // on_wait may throw to give up (the trainer does on SIGTERM): the queued request is cancelled, not left to
  // be granted to nobody.
  const auto report_wait = [&] {
    if (!on_wait) return;
    try {
      on_wait(wait);
    } catch (...) {
      cancel_request();
      throw;
    }
  };
  report_wait();
  int64_t unreachable_since = 0;
  for (;;) {
    if (steady_ms() - start > static_cast<int64_t>(max_wait_s * 1000)) {
      cancel_request();
      throw std::runtime_error("quota: gave up waiting for lease " + std::to_string(id));
    }
    std::this_thread::sleep_for(poll);
    response = call(poll_request);
    if (response.status == 0) {
      if (unreachable_since == 0) unreachable_since = steady_ms();
      if (steady_ms() - unreachable_since > 10 * 60 * 1000) throw std::runtime_error("quota: " + reason_of(response));
      continue;
    }
    unreachable_since = 0;
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
  last_ok_steady_ms_ = steady_ms();
  heartbeat_provider_ = provider;
  heartbeat_thread_ = std::thread([this, provider] {
    const int64_t interval_ms = std::max(1, lease_.heartbeat_interval_s) * 1000;
    int64_t wait_ms = 0;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(heartbeat_mutex_);
        if (heartbeat_wakeup_.wait_for(lock, std::chrono::milliseconds(wait_ms), [this] { return heartbeat_stop_; })) {
          return;
        }
      }
      const ApiResponse response = call(heartbeat_request(provider ? provider() : Telemetry{}));
      if (response.status == 0) {
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
        return;
      }
    }
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
  if (heartbeat_thread_.joinable()) heartbeat_thread_.join();
}

bool QuotaClient::unreachable_too_long() const {
  if (!enabled() || lease_.id == 0) return false;
  const int64_t budget_ms = static_cast<int64_t>(lease_.ttl_s - lease_.heartbeat_interval_s) * 1000;
  return steady_ms() - last_ok_steady_ms_ > std::max<int64_t>(1000, budget_ms);
}

void QuotaClient::release(Outcome outcome) {
  const bool beating = heartbeat_thread_.joinable();
  stop_heartbeats();
  if (!enabled() || lease_.id == 0 || released_) return;
  if (beating && heartbeat_provider_ && !lost_) {
    // The final figures: the first beat goes out before any step, the next one an interval later.
    call(heartbeat_request(heartbeat_provider_()));
  }
  ApiRequest request;
  request.method = "POST";
  request.path = "/v1/leases/" + std::to_string(lease_.id) + "/release";
  request.body = json{{"outcome", to_string(outcome == Outcome::kNone ? Outcome::kCompleted : outcome)}}.dump();
  for (int attempt = 0; attempt < 3; ++attempt) {
    const ApiResponse response = call(request);
    if (response.status != 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  released_ = true;
}

}  // namespace yolo8::quota
