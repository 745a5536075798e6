#include "quota/client/client.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <optional>
#include <ostream>
#include <random>

#include "quota/client/bearer_token.h"
#include "quota/client/resolver.h"
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

// quotad's errors say why in "reason"; a follower's 503 in "error" (with "leader").
std::string reason_of(const ApiResponse& response) {
  for (const char* field : {"reason", "error"}) {
    if (response.body.is_object() && response.body.contains(field) && response.body[field].is_string()) {
      return response.body[field].get<std::string>();
    }
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

std::string lower(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(), [](unsigned char c) { return std::tolower(c); });
  return text;
}

std::string trim(const std::string& text) {
  const size_t first = text.find_first_not_of(" \t");
  if (first == std::string::npos) return "";
  return text.substr(first, text.find_last_not_of(" \t") - first + 1);
}

// The least Retry-After of a round's answers that gave one (0: none did).
double least_retry_after_s(const std::vector<ApiResponse>& answers) {
  double least = 0;
  for (const ApiResponse& answer : answers) {
    const double after = retry_after_s(answer);
    if (after > 0 && (least == 0 || after < least)) least = after;
  }
  return least;
}

ApiRequest release_request(int64_t id, Outcome outcome) {
  ApiRequest request;
  request.method = "POST";
  request.path = "/v1/leases/" + std::to_string(id) + "/release";
  request.body = json{{"outcome", to_string(outcome == Outcome::kNone ? Outcome::kCompleted : outcome)}}.dump();
  return request;
}

// A heartbeat or release waits at most about one interval (1-3 s) for quotad: a later answer is no help, and the
// trainer's stop must not wait longer than that for a hung quotad.
HttpTimeouts beat_timeouts(int heartbeat_interval_s) {
  const double seconds = std::clamp(static_cast<double>(heartbeat_interval_s), 1.0, 3.0);
  return HttpTimeouts{seconds, seconds};
}

}  // namespace

AnswerClass answer_class(int status) {
  static constexpr int kTransient[] = {0, 429, 500, 502, 503, 504};
  if (std::find(std::begin(kTransient), std::end(kTransient), status) != std::end(kTransient)) {
    return AnswerClass::kTransient;
  }
  return status >= 100 && status < 400 ? AnswerClass::kAnswered : AnswerClass::kRefused;
}

bool is_unavailable(int status) { return answer_class(status) == AnswerClass::kTransient; }

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

std::string normalise_endpoint(const std::string& url) {
  const size_t separator = url.find("://");
  if (separator == std::string::npos) return "";
  const std::string scheme = lower(url.substr(0, separator));
  if (scheme != "http" && scheme != "https") return "";
  std::string rest = url.substr(separator + 3);
  if (!rest.empty() && rest.back() == '/') rest.pop_back();
  std::string host;
  std::string port;
  if (!rest.empty() && rest.front() == '[') {  // an IPv6 address
    const size_t close = rest.find(']');
    if (close == std::string::npos || close == 1) return "";
    host = rest.substr(0, close + 1);
    if (host.find_first_not_of("[]0123456789abcdefABCDEF:.") != std::string::npos) return "";
    if (close + 1 < rest.size()) {
      if (rest[close + 1] != ':') return "";
      port = rest.substr(close + 2);
      if (port.empty()) return "";
    }
  } else {
    const size_t colon = rest.find(':');
    host = rest.substr(0, colon);
    if (colon != std::string::npos) {
      port = rest.substr(colon + 1);
      if (port.empty()) return "";
    }
    const auto bad_host_char = [](unsigned char c) { return !std::isalnum(c) && c != '-' && c != '.' && c != '_'; };
    if (host.empty() || std::any_of(host.begin(), host.end(), bad_host_char)) return "";
  }
  if (port.empty()) {
    port = scheme == "https" ? "443" : "80";
  } else {
    if (port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos) return "";
    const int number = std::stoi(port);
    if (number < 1 || number > 65535) return "";
    port = std::to_string(number);
  }
  return scheme + "://" + lower(host) + ":" + port;
}

std::vector<std::string> parse_endpoints(const std::string& text, const std::string& setting) {
  std::vector<std::string> endpoints;
  std::vector<std::string> keys;
  const bool several = text.find(',') != std::string::npos;
  const std::string in_list = several ? " (in '" + text + "')" : "";
  size_t begin = 0;
  for (;;) {
    const size_t comma = text.find(',', begin);
    const std::string element =
        trim(text.substr(begin, comma == std::string::npos ? std::string::npos : comma - begin));
    const std::string key = normalise_endpoint(element);
    if (key.empty()) {
      throw std::invalid_argument(setting + ": '" + element + "'" + in_list +
                                  " is not an http(s)://host[:port] URL of quotad");
    }
    const std::string scheme = key.substr(0, key.find("://"));
    if (!keys.empty() && scheme != keys.front().substr(0, keys.front().find("://"))) {
      throw std::invalid_argument(setting + ": '" + element + "'" + in_list + " is not " +
                                  keys.front().substr(0, keys.front().find("://")) +
                                  ":// as the first URL is: the replicas of one quotad share a scheme");
    }
    const auto repeated = std::find(keys.begin(), keys.end(), key);
    if (repeated != keys.end()) {
      throw std::invalid_argument(setting + ": '" + element + "'" + in_list + " repeats '" +
                                  endpoints[static_cast<size_t>(repeated - keys.begin())] + "'");
    }
    std::string endpoint = scheme + element.substr(element.find("://"));
    if (endpoint.back() == '/') endpoint.pop_back();
    endpoints.push_back(endpoint);
    keys.push_back(key);
    if (comma == std::string::npos) break;
    begin = comma + 1;
  }
  return endpoints;
}

ClientConfig client_config_from_setting(const std::string& setting, int local_gpus, double local_gpu_memory_gib) {
  ClientConfig config;
  config.local_gpus = local_gpus;
  config.local_gpu_memory_gib = local_gpu_memory_gib;
  if (setting == "off" || setting == "local" || setting.empty()) {
    config.mode = setting.empty() ? "local" : setting;
  } else if (setting.rfind("local:", 0) == 0 && setting.size() > 6) {
    config.mode = "local";
    config.local_db = setting.substr(6);
  } else if (setting.find("://") != std::string::npos) {
    parse_endpoints(setting);  // throws naming the bad URL
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
    endpoints_ = {"local"};
    transports_.push_back(make_local_transport(std::move(policy), options, config_.user));
  } else if (config_.mode.find("://") != std::string::npos) {
    endpoints_ = parse_endpoints(config_.mode);
    if (!config_.token.empty() && !config_.token_file.empty()) {
      throw std::invalid_argument("quota: a token and a token file are both given; use one");
    }
    token_ = config_.token_file.empty() ? std::make_shared<BearerToken>(config_.token)
                                        : BearerToken::from_file(config_.token_file);
    resolver_ = std::make_shared<HostResolver>();
    for (const std::string& endpoint : endpoints_)
      transports_.push_back(make_http_transport(endpoint, http_options(HttpTimeouts{})));
  } else {
    throw std::invalid_argument("quota: '" + config_.mode + "' is not off, local or an http(s):// URL");
  }
}

QuotaClient::~QuotaClient() { stop_heartbeats(); }

HttpOptions QuotaClient::http_options(const HttpTimeouts& timeouts) const {
  HttpOptions options;
  options.token = token_;
  options.ca_file = config_.ca_file;
  options.timeouts = timeouts;
  options.resolver = resolver_;
  return options;
}

int64_t QuotaClient::now_ms() const { return config_.clock ? config_.clock() : system_now_ms(); }

int64_t QuotaClient::steady_ms() const {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string QuotaClient::current_endpoint() const { return endpoints_.empty() ? "" : endpoints_[current_]; }

void QuotaClient::notice(const std::string& text) const {
  if (config_.on_notice) {
    config_.on_notice(text);
  } else {
    std::cout << (text + "\n") << std::flush;  // one write: the heartbeat thread's line is not cut into another
  }
}

// The replicas' followers answer 503 naming the leader: the round goes there next, at once, so a takeover costs
// one extra call. A hint outside the configured endpoints is not followed: the bearer token would go to a host
// the user never named (a misconfigured or hostile replica could collect tokens); the round goes on through the
// list, which reaches the leader too when it is listed.
QuotaClient::Routed QuotaClient::route(const ApiRequest& request,
                                       const std::vector<std::unique_ptr<QuotaTransport>>& transports,
                                       const std::function<bool()>& stop) {
  const size_t count = transports.size();
  const size_t first = current_;
  std::vector<bool> tried(count, false);
  std::vector<ApiResponse> answers;
  std::string failures;
  size_t at = first;
  bool hinted = false;  // `at` is the leader a follower named
  for (;;) {
    ApiResponse response = transports[at]->call(request);
    tried[at] = true;
    if (!is_unavailable(response.status)) {
      if (at != first) {
        current_ = at;
        notice("quotad " + endpoints_[at] + (hinted ? " is the leader now (" : " answers now (") + failures + ")");
      }
      return Routed{std::move(response), ""};
    }
    if (count == 1) return Routed{response, answer_text(response)};
    std::string failure = endpoints_[at] + ": " + answer_text(response);
    std::optional<size_t> next;
    hinted = false;
    if (response.status == 503 && response.body.is_object() && response.body.contains("leader") &&
        response.body["leader"].is_string()) {
      const std::string leader = response.body["leader"].get<std::string>();
      const std::string key = normalise_endpoint(leader);
      for (size_t i = 0; i < count && !key.empty(); ++i) {
        if (normalise_endpoint(endpoints_[i]) == key) next = i;
      }
      if (!next) {
        failure += " (its leader " + leader + " is not one of the quota setting's URLs: not followed)";
      } else if (tried[*next]) {
        next.reset();
      } else {
        hinted = true;
      }
    }
    failures += (failures.empty() ? "" : "; ") + failure;
    answers.push_back(std::move(response));
    for (size_t step = 1; step < count && !next; ++step) {
      if (!tried[(at + step) % count]) next = (at + step) % count;
    }
    if (!next || (stop && stop())) break;
    at = *next;
  }
  Routed routed{answers.back(), failures};
  const double after = least_retry_after_s(answers);
  routed.response.headers.erase("Retry-After");
  if (after > 0) routed.response.headers["Retry-After"] = fixed_text(after, 3);
  return routed;
}

QuotaClient::Routed QuotaClient::call(const ApiRequest& request) { return route(request, transports_); }

QuotaClient::Routed QuotaClient::beat_call(const ApiRequest& request, const std::function<bool()>& stop) {
  return route(request, beat_transports_.empty() ? transports_ : beat_transports_, stop);
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
  // at the clock's own resolution: in whole milliseconds the deadline could pass up to one early
  std::chrono::steady_clock::time_point unavailable_since;
  std::chrono::steady_clock::time_point called;
  // With several endpoints an attempt is a round that tried each of them (route()).
  const auto wait_out = [&](const Routed& routed) {
    const ApiResponse& response = routed.response;
    if (unavailable_attempts++ == 0) unavailable_since = called;
    const double unavailable_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - unavailable_since).count();
    const double left_s = config_.unavailable_deadline_s - unavailable_s;
    if (left_s <= 0) {
      throw QuotaUnavailable(response.status, "quotad unavailable for " + fixed_text(unavailable_s, 0) +
                                                  " s, the last of " + std::to_string(unavailable_attempts) +
                                                  " attempts: " + routed.failures);
    }
    const double backoff =
        std::min(config_.retry_max_s, config_.retry_initial_s * std::pow(2.0, std::min(unavailable_attempts - 1, 30)));
    const double after = std::min(retry_after_s(response), config_.retry_after_max_s);
    // equal jitter: trainers that lost quotad together do not come back together
    const double delay = std::min(left_s, std::max(after * uniform(1.0, 1.2), backoff * uniform(0.5, 1.0)));
    if (retry.on_retry) {
      RetryInfo info;
      info.attempt = unavailable_attempts;
      info.status = response.status;
      info.reason = endpoints_.size() == 1 ? reason_of(response) : routed.failures;
      info.retry_in_s = delay;
      info.give_up_in_s = left_s;
      retry.on_retry(info);
    }
    pause(delay, retry);
  };
  ApiResponse response;
  // the idempotency key makes the retries safe, at any endpoint (the replicas share one database): an ask that
  // was applied but not answered returns the same lease
  for (;;) {
    called = std::chrono::steady_clock::now();
    Routed routed = call(ask);
    if (!is_unavailable(routed.response.status)) {
      response = std::move(routed.response);
      break;
    }
    wait_out(routed);
  }
  if (response.status == 201) {
    lease_ = lease_info(response.body.at("lease"));
    lease_.memory_row = response.body.value("memory_row", "");
    lease_.receipt = response.body.at("lease").value("receipt", json());
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
    called = std::chrono::steady_clock::now();
    Routed routed = call(poll_request);
    if (is_unavailable(routed.response.status)) {
      give_up_on_throw([&] { wait_out(routed); });
      continue;
    }
    response = std::move(routed.response);
    unavailable_attempts = 0;
    if (response.status != 200) throw QuotaRefused(response.status, reason_of(response));
    const LeaseState state = lease_state_of(response.body);
    if (state == LeaseState::kGranted || state == LeaseState::kRevoking) {
      lease_ = lease_info(response.body);
      lease_.receipt = response.body.value("receipt", json());
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
  // Its own connections: stop_heartbeats() can abandon a beat in flight without touching the release's.
  if (config_.mode.find("://") != std::string::npos && beat_transports_.empty()) {
    for (const std::string& endpoint : endpoints_) {
      beat_transports_.push_back(
          make_http_transport(endpoint, http_options(beat_timeouts(lease_.heartbeat_interval_s))));
    }
  }
  last_ok_steady_ms_ = steady_ms();
  beat_unanswered_ = false;
  heartbeat_provider_ = provider;
  heartbeat_done_ = false;
  heartbeat_thread_ = std::thread([this, provider] {
    const int64_t interval_ms = std::max(1, lease_.heartbeat_interval_s) * 1000;
    int64_t wait_ms = 0;
    int refused_status = 0;  // the last refusal's status, while the beats are refused
    bool reattach_refused = false;
    const auto stopping = [this] {
      std::lock_guard<std::mutex> lock(heartbeat_mutex_);
      return heartbeat_stop_;
    };
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(heartbeat_mutex_);
        if (heartbeat_wakeup_.wait_for(lock, std::chrono::milliseconds(wait_ms), [this] { return heartbeat_stop_; })) {
          break;
        }
      }
      // a follower's 503 leads the beat to the leader, a silent quotad to the next one: the lease goes on there
      ApiResponse response = beat_call(heartbeat_request(provider ? provider() : Telemetry{}), stopping).response;
      // a database restored from a backup older than the grant: the receipt gets the lease back, then beat on
      if (unknown_lease(response) && !reattach_refused) {
        if (reattach(stopping)) {
          response = beat_call(heartbeat_request(provider ? provider() : Telemetry{}), stopping).response;
        } else {
          reattach_refused = true;  // presented once: the lease is lost (a refusal does not change by asking again)
        }
      }
      beat_unanswered_ = is_unavailable(response.status);
      if (beat_unanswered_) {
        // retry sooner while unreachable; a Retry-After (429, 503) is the least wait, up to an interval
        const auto after_ms = static_cast<int64_t>(std::min(retry_after_s(response), 1e6) * 1000);
        wait_ms = std::max<int64_t>({500, interval_ms / 4, std::min(interval_ms, after_ms)});
        continue;
      }
      wait_ms = interval_ms;
      if (response.status != 200) {
        if (response.status == 404) lost_ = true;
        // said once per status: a refused token (which file it came from) is fixed by the user, not by waiting
        if (response.status != refused_status) notice("quotad refused the heartbeat (" + answer_text(response) + ")");
        refused_status = response.status;
        continue;
      }
      refused_status = 0;
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
  while (!beat_transports_.empty() && !heartbeat_done_) {
    for (const auto& transport : beat_transports_) transport->cancel();
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
    answering = !is_unavailable(beat_call(heartbeat_request(heartbeat_provider_())).response.status);
  }
  const ApiRequest request = release_request(lease_.id, outcome);
  constexpr int64_t kReleaseRetryMs = 5000;
  const int64_t give_up = steady_ms() + (answering ? kReleaseRetryMs : 0);
  Routed routed;
  bool reattach_tried = lost_;  // a receipt the heartbeats presented in vain is not presented again
  for (;;) {
    routed = beat_call(request);
    // quotad lost the lease with a restore: back from its receipt, then released (and billed) as it should be
    if (unknown_lease(routed.response) && !reattach_tried) {
      reattach_tried = true;
      if (reattach()) continue;
    }
    if (!is_unavailable(routed.response.status)) break;
    const int64_t delay_ms = static_cast<int64_t>(std::clamp(retry_after_s(routed.response), 0.5, 1.0) * 1000);
    if (steady_ms() + delay_ms > give_up) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
  }
  release_answer_ = release_answer(routed);
  return release_answer_;
}

bool QuotaClient::unknown_lease(const ApiResponse& response) {
  return response.status == 404 && reason_of(response).rfind("unknown lease", 0) == 0;
}

bool QuotaClient::reattach(const std::function<bool()>& stop) {
  const std::string id = std::to_string(lease_.id);
  if (!lease_.receipt.is_object()) return false;  // granted by a quotad without receipts: lost, as before
  ApiRequest request;
  request.method = "POST";
  request.path = "/v1/leases/" + id + "/reattach";
  request.body = json{{"receipt", lease_.receipt}}.dump();
  const Routed routed = beat_call(request, stop);
  if (routed.response.status == 200 && routed.response.body.value("state", "") == to_string(LeaseState::kGranted)) {
    ++reattachments_;
    notice("quotad did not know lease " + id + " (its database was restored from an older backup): re-attached " +
           "from the grant receipt, same id and GPUs");
    return true;
  }
  notice("quotad did not know lease " + id + " and refused its grant receipt (" + answer_text(routed.response) + ")");
  return false;
}

ReleaseAnswer QuotaClient::release_earlier(int64_t id, Outcome outcome) {
  if (!enabled()) return ReleaseAnswer{};
  return release_answer(call(release_request(id, outcome)));
}

ReleaseAnswer QuotaClient::release_answer(const Routed& routed) {
  const ApiResponse& response = routed.response;
  ReleaseAnswer answer;
  answer.status = response.status;
  answer.acknowledged = response.status == 200;
  if (answer.acknowledged) {
    answer.state = response.body.value("state", "");
    // a first call that was applied but not answered in time makes the second one find it released already
    answer.released_now =
        response.body.value("released_now", false) || answer.state == to_string(LeaseState::kReleased);
  } else {
    answer.reason = routed.failures.empty() ? answer_text(response) : routed.failures;
  }
  return answer;
}

}  // namespace yolo8::quota
