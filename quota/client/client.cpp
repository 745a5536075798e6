#include "quota/client/client.h"

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <random>

#include "quota/client/transport.h"
#include "quota/core/codec.h"

namespace yolo8::quota {

using nlohmann::json;

namespace {

std::string random_key() {
  std::random_device rd;
  std::mt19937_64 gen((uint64_t(rd()) << 32) ^ rd() ^ uint64_t(std::chrono::steady_clock::now().time_since_epoch().count()));
  const char* hex = "0123456789abcdef";
  std::string s;
  for (int i = 0; i < 32; ++i) s += hex[gen() % 16];
  return s;
}

LeaseInfo lease_info(const json& j) {
  LeaseInfo l;
  l.id = j.value("id", int64_t(0));
  l.state = j.value("state", "");
  l.devices = j.value("devices", std::vector<std::string>{});
  l.memory_gib = j.value("memory_gib", 0.0);
  l.shared = j.value("shared", false);
  l.ttl_s = j.value("ttl_s", 60);
  l.heartbeat_interval_s = j.value("heartbeat_interval_s", 10);
  l.preempt_grace_s = j.value("preempt_grace_s", 0);
  return l;
}

std::string reason_of(const ApiResponse& r) {
  if (r.body.is_object() && r.body.contains("reason") && r.body["reason"].is_string()) {
    return r.body["reason"].get<std::string>();
  }
  return "status " + std::to_string(r.status);
}

}  // namespace

ClientConfig client_config_from_setting(const std::string& setting, int local_gpus, double local_gpu_memory_gib) {
  ClientConfig c;
  c.local_gpus = local_gpus;
  c.local_gpu_memory_gib = local_gpu_memory_gib;
  if (setting == "off" || setting == "local" || setting.empty()) {
    c.mode = setting.empty() ? "local" : setting;
  } else if (setting.rfind("local:", 0) == 0 && setting.size() > 6) {
    c.mode = "local";
    c.local_db = setting.substr(6);
  } else if (setting.rfind("http://", 0) == 0 && setting.size() > 7) {
    c.mode = setting;
    if (const char* t = std::getenv("YOLO8_QUOTA_TOKEN")) c.token = t;
  } else {
    throw std::invalid_argument("quota: '" + setting + "' is not off, local, local:PATH or an http:// URL");
  }
  return c;
}

std::string QuotaClient::default_local_db() {
  std::string base;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x != nullptr && *x) {
    base = x;
  } else if (const char* h = std::getenv("HOME"); h != nullptr && *h) {
    base = std::string(h) + "/.cache";
  } else {
    base = "/tmp";
  }
  return base + "/yolo8/quota.db";
}

QuotaClient::QuotaClient(ClientConfig config) : config_(std::move(config)) {
  if (config_.mode == "off") return;
  if (config_.mode == "local" || config_.mode.empty()) {
    if (config_.user.empty()) {
      const char* u = std::getenv("USER");
      config_.user = u != nullptr && *u ? u : "local";
    }
    std::string db = config_.local_db.empty() ? default_local_db() : config_.local_db;
    const auto parent = std::filesystem::path(db).parent_path();
    if (!parent.empty()) std::filesystem::create_directories(parent);
    Policy p = config_.local_policy.empty()
                   ? local_policy(config_.local_gpus, config_.local_gpu_memory_gib, config_.user)
                   : load_policy(config_.local_policy);
    if (config_.local_policy.empty() && !config_.local_memory_table.empty()) {
      p.memory_table = load_memory_table(config_.local_memory_table);
    }
    ServiceOptions o;
    o.db_path = db;
    o.reload_per_call = true;
    o.clock = config_.clock;
    transport_ = make_local_transport(std::move(p), o, config_.user);
  } else if (config_.mode.rfind("http://", 0) == 0) {
    transport_ = make_http_transport(config_.mode, config_.token);
  } else {
    throw std::invalid_argument("quota: '" + config_.mode + "' is not off, local or an http:// URL");
  }
}

QuotaClient::~QuotaClient() { stop_heartbeats(); }

int64_t QuotaClient::now_ms() const { return config_.clock ? config_.clock() : system_now_ms(); }

int64_t QuotaClient::steady_ms() const {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

ApiResponse QuotaClient::call(const ApiRequest& req) { return transport_->call(req); }

LeaseInfo QuotaClient::acquire(const LeaseRequest& req, const std::function<void(const WaitInfo&)>& on_wait,
                               double max_wait_s) {
  if (!enabled()) {
    lease_ = LeaseInfo{};
    lease_.state = "granted";
    return lease_;
  }
  revoked_ = false;
  lost_ = false;
  released_ = false;
  ApiRequest a;
  a.method = "POST";
  a.path = "/v1/leases";
  a.body = to_json(req).dump();
  a.idempotency_key = req.idempotency_key.empty() ? random_key() : req.idempotency_key;
  const int64_t start = steady_ms();
  const auto poll = std::chrono::milliseconds(int64_t(config_.poll_interval_s * 1000));
  ApiResponse r;
  // the idempotency key makes retries after network errors safe
  for (;;) {
    r = call(a);
    if (r.status != 0) break;
    if (steady_ms() - start > 60000) throw std::runtime_error("quota: " + reason_of(r));
    std::this_thread::sleep_for(poll);
  }
  if (r.status == 201) {
    lease_ = lease_info(r.body.at("lease"));
    last_ok_steady_ms_ = steady_ms();
    return lease_;
  }
  if (r.status != 202 && !(r.status == 403 && r.body.value("status", "") == "needs_approval")) {
    throw QuotaRefused(r.status, reason_of(r), r.body.value("max_batch", 0));
  }
  const int64_t id = r.body.value("lease_id", int64_t(0));
  WaitInfo w;
  w.lease_id = id;
  w.status = r.body.value("status", "");
  w.approval_id = r.body.value("approval_id", int64_t(0));
  w.position = r.body.value("position", 0);
  w.reason = reason_of(r);
  if (on_wait) on_wait(w);
  ApiRequest g;
  g.method = "GET";
  g.path = "/v1/leases/" + std::to_string(id);
  int64_t unreachable_since = 0;
  for (;;) {
    if (steady_ms() - start > int64_t(max_wait_s * 1000)) {
      ApiRequest cancel;
      cancel.method = "POST";
      cancel.path = g.path + "/release";
      cancel.body = R"({"outcome":"cancelled"})";
      call(cancel);
      throw std::runtime_error("quota: gave up waiting for lease " + std::to_string(id));
    }
    std::this_thread::sleep_for(poll);
    r = call(g);
    if (r.status == 0) {
      if (unreachable_since == 0) unreachable_since = steady_ms();
      if (steady_ms() - unreachable_since > 10 * 60 * 1000) throw std::runtime_error("quota: " + reason_of(r));
      continue;
    }
    unreachable_since = 0;
    if (r.status != 200) throw QuotaRefused(r.status, reason_of(r));
    const std::string state = r.body.value("state", "");
    if (state == "granted" || state == "revoking") {
      lease_ = lease_info(r.body);
      last_ok_steady_ms_ = steady_ms();
      if (state == "revoking") {
        revoked_ = true;
        deadline_ms_ = r.body.value("deadline_ms", int64_t(0));
      }
      return lease_;
    }
    if (state == "queued" || state == "pending_approval") {
      w.status = state == "queued" ? "queued" : "needs_approval";
      w.position = r.body.value("position", 0);
      w.reason = r.body.value("reason", "");
      if (on_wait) on_wait(w);
      continue;
    }
    throw QuotaRefused(403, "lease " + std::to_string(id) + " " + state + ": " + r.body.value("reason", ""));
  }
}

void QuotaClient::start_heartbeats(std::function<Telemetry()> provider) {
  if (!enabled() || lease_.id == 0 || heartbeat_thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lk(hb_mu_);
    hb_stop_ = false;
  }
  last_ok_steady_ms_ = steady_ms();
  heartbeat_thread_ = std::thread([this, provider] {
    ApiRequest h;
    h.method = "POST";
    h.path = "/v1/leases/" + std::to_string(lease_.id) + "/heartbeat";
    const int64_t interval_ms = std::max(1, lease_.heartbeat_interval_s) * 1000;
    int64_t wait_ms = 0;
    for (;;) {
      {
        std::unique_lock<std::mutex> lk(hb_mu_);
        if (hb_cv_.wait_for(lk, std::chrono::milliseconds(wait_ms), [this] { return hb_stop_; })) return;
      }
      const Telemetry t = provider ? provider() : Telemetry{};
      h.body = to_json(t).dump();
      const ApiResponse r = call(h);
      if (r.status == 0) {
        wait_ms = std::max<int64_t>(500, interval_ms / 4);  // retry sooner while unreachable
        continue;
      }
      wait_ms = interval_ms;
      if (r.status != 200) {
        if (r.status == 404) lost_ = true;
        continue;
      }
      last_ok_steady_ms_ = steady_ms();
      const std::string state = r.body.value("state", "");
      if (state == "revoking") {
        deadline_ms_ = r.body.value("deadline_ms", int64_t(0));
        revoked_ = true;
      } else if (state != "granted") {
        lost_ = true;
        return;
      }
    }
  });
}

void QuotaClient::stop_heartbeats() {
  {
    std::lock_guard<std::mutex> lk(hb_mu_);
    hb_stop_ = true;
  }
  hb_cv_.notify_all();
  if (heartbeat_thread_.joinable()) heartbeat_thread_.join();
}

bool QuotaClient::unreachable_too_long() const {
  if (!enabled() || lease_.id == 0) return false;
  const int64_t budget = int64_t(lease_.ttl_s - lease_.heartbeat_interval_s) * 1000;
  return steady_ms() - last_ok_steady_ms_ > std::max<int64_t>(1000, budget);
}

void QuotaClient::release(Outcome outcome) {
  stop_heartbeats();
  if (!enabled() || lease_.id == 0 || released_) return;
  ApiRequest r;
  r.method = "POST";
  r.path = "/v1/leases/" + std::to_string(lease_.id) + "/release";
  r.body = json{{"outcome", to_string(outcome == Outcome::kNone ? Outcome::kCompleted : outcome)}}.dump();
  for (int attempt = 0; attempt < 3; ++attempt) {
    const ApiResponse res = call(r);
    if (res.status != 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  released_ = true;
}

}  // namespace yolo8::quota
