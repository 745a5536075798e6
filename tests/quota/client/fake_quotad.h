#pragma once
// Stand-ins for quotad on loopback, speaking quota/README.md's API: a scripted quotad (one of several replicas when
// it answers as a follower), one that accepts and never answers, and a port nothing listens on.
#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "quota/client/client.h"

namespace yolo8::quota::testing {

// The certificate and key (PEM files) of a fake that speaks https.
struct FakeTls {
  std::string cert;
  std::string key;
};

// One answer of the fake: a status, Retry-After when > 0, and the leader a follower's 503 names when not empty
// (the reason is then "not the leader", else "scripted").
struct Answer {
  Answer() = default;
  explicit Answer(int status_) : status(status_) {}
  Answer(int status_, int retry_after_s_, std::string leader_ = "")
      : status(status_), retry_after_s(retry_after_s_), leader(std::move(leader_)) {}
  int status = 201;
  int retry_after_s = 0;
  std::string leader;
};

// A quotad stand-in on a loopback port. POST /v1/leases takes its answers from `asks` (a 202 queues lease 7),
// then grants lease 7; GET /v1/leases/7 takes its answers from `polls`, then says granted. Heartbeats and releases
// answer 200 until hang(), after which they are never answered (until the fake goes away), or until follow(),
// after which they answer as a follower does; close() stops it (its port refuses connections). After
// accept_only(token) any other bearer token gets 401, as quotad answers it.
class FakeQuotad {
 public:
  // Over https when `tls` names a certificate and its key (PEM files).
  FakeQuotad(std::vector<Answer> asks, int ttl_s = 60, int interval_s = 10, std::vector<Answer> polls = {},
             const FakeTls& tls = {})
      : server_(tls.cert.empty() ? std::make_unique<httplib::Server>()
                                 : std::make_unique<httplib::SSLServer>(tls.cert.c_str(), tls.key.c_str())),
        scheme_(tls.cert.empty() ? "http" : "https"),
        asks_(asks.begin(), asks.end()),
        polls_(polls.begin(), polls.end()),
        ttl_s_(ttl_s),
        interval_s_(interval_s) {
    server_->Post("/v1/leases", [this](const httplib::Request& request, httplib::Response& response) {
      std::lock_guard<std::mutex> lock(mutex_);
      keys_.insert(request.get_header_value("Idempotency-Key"));
      ++asked_;
      const Answer answer = next(asks_);
      if (answer.status == 201)
        return reply(response, 201,
                     nlohmann::json{{"status", "granted"}, {"lease_id", 7}, {"lease", lease("granted")}});
      if (answer.status == 202) {
        return reply(response, 202,
                     nlohmann::json{{"status", "queued"}, {"lease_id", 7}, {"position", 1}, {"reason", "busy"}});
      }
      reply_error(response, answer);
    });
    server_->Get("/v1/leases/7", [this](const httplib::Request&, httplib::Response& response) {
      std::lock_guard<std::mutex> lock(mutex_);
      const Answer answer = next(polls_);
      if (answer.status == 201) return reply(response, 200, lease("granted"));
      if (answer.status == 202) {
        return reply(response, 200,
                     nlohmann::json{{"id", 7}, {"state", "queued"}, {"position", 1}, {"reason", "busy"}});
      }
      reply_error(response, answer);
    });
    server_->Post("/v1/leases/7/heartbeat", [this](const httplib::Request&, httplib::Response& response) {
      if (const auto follower = wait_while_hung()) return reply_error(response, *follower);
      ++beats_;
      reply(response, 200,
            nlohmann::json{{"state", "granted"}, {"ttl_s", ttl_s_}, {"heartbeat_interval_s", interval_s_}});
    });
    server_->Post("/v1/leases/7/release", [this](const httplib::Request&, httplib::Response& response) {
      if (const auto follower = wait_while_hung()) return reply_error(response, *follower);
      ++releases_;
      nlohmann::json view = lease("released");
      view["released_now"] = true;
      reply(response, 200, view);
    });
    server_->set_pre_routing_handler([this](const httplib::Request& request, httplib::Response& response) {
      std::lock_guard<std::mutex> lock(mutex_);
      tokens_.push_back(request.get_header_value("Authorization"));
      if (accepted_.empty() || request.get_header_value("Authorization") == "Bearer " + accepted_) {
        return httplib::Server::HandlerResponse::Unhandled;
      }
      ++unauthorized_;
      reply(response, 401, nlohmann::json{{"error", "unauthorized"}, {"reason", "invalid token"}});
      return httplib::Server::HandlerResponse::Handled;
    });
    port_ = server_->bind_to_any_port("127.0.0.1");  // listening from here: early connections wait in the backlog
    thread_ = std::thread([this] { server_->listen_after_bind(); });
  }
  ~FakeQuotad() { close(); }
  std::string url() const { return scheme_ + "://127.0.0.1:" + std::to_string(port_); }
  int port() const { return port_; }
  void hang() {
    std::lock_guard<std::mutex> lock(mutex_);
    hung_ = true;
  }
  // The answers to the next lease requests (replicas that name each other are known only once both listen).
  void script_asks(const std::vector<Answer>& asks) {
    std::lock_guard<std::mutex> lock(mutex_);
    asks_.assign(asks.begin(), asks.end());
  }
  // From now on heartbeats and releases answer 503 naming `leader`, as a replica that lost the leadership does.
  void follow(const std::string& leader) {
    std::lock_guard<std::mutex> lock(mutex_);
    leader_ = leader;
  }
  // Heartbeats and releases are answered again, after follow().
  void lead() {
    std::lock_guard<std::mutex> lock(mutex_);
    leader_.clear();
  }
  // From now on only this bearer token is accepted.
  void accept_only(const std::string& token) {
    std::lock_guard<std::mutex> lock(mutex_);
    accepted_ = token;
  }
  // The Authorization headers of every request so far, in order.
  std::vector<std::string> tokens() {
    std::lock_guard<std::mutex> lock(mutex_);
    return tokens_;
  }
  void close() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      hung_ = false;
    }
    unhung_.notify_all();
    server_->stop();
    if (thread_.joinable()) thread_.join();
  }
  int asked() const { return asked_; }
  int beats() const { return beats_; }
  int releases() const { return releases_; }
  int refused() const { return refused_; }  // the scripted error answers given
  int unauthorized() const { return unauthorized_; }
  std::set<std::string> keys() {
    std::lock_guard<std::mutex> lock(mutex_);
    return keys_;
  }

 private:
  static Answer next(std::deque<Answer>& answers) {
    if (answers.empty()) return Answer{};
    const Answer answer = answers.front();
    answers.pop_front();
    return answer;
  }
  nlohmann::json lease(const std::string& state) const {
    return nlohmann::json{{"id", 7},          {"state", state},      {"devices", {"n1:0"}},
                          {"memory_gib", 24}, {"ttl_s", ttl_s_},     {"heartbeat_interval_s", interval_s_},
                          {"shared", false},  {"preempt_grace_s", 0}};
  }
  static void reply(httplib::Response& response, int status, const nlohmann::json& body, int retry_after_s = 0) {
    response.status = status;
    if (retry_after_s > 0) response.set_header("Retry-After", std::to_string(retry_after_s));
    response.set_content(body.dump(), "application/json");
  }
  void reply_error(httplib::Response& response, const Answer& answer) {
    ++refused_;
    // a follower answers as replicated quotad will: why in "error", and the leader's URL
    const nlohmann::json body = answer.leader.empty()
                                    ? nlohmann::json{{"error", answer.status}, {"reason", "scripted"}}
                                    : nlohmann::json{{"error", "not the leader"}, {"leader", answer.leader}};
    reply(response, answer.status, body, answer.retry_after_s);
  }
  // The follower's answer once follow() was called, else nothing (after any hang).
  std::optional<Answer> wait_while_hung() {
    std::unique_lock<std::mutex> lock(mutex_);
    unhung_.wait(lock, [this] { return !hung_; });
    if (leader_.empty()) return std::nullopt;
    return Answer{503, 1, leader_};
  }

  std::unique_ptr<httplib::Server> server_;
  std::string scheme_;
  std::thread thread_;
  int port_ = 0;
  std::mutex mutex_;
  std::condition_variable unhung_;
  bool hung_ = false;
  std::string leader_;
  std::deque<Answer> asks_;
  std::deque<Answer> polls_;
  std::set<std::string> keys_;
  std::string accepted_;
  std::vector<std::string> tokens_;
  std::atomic<int> asked_{0};
  std::atomic<int> beats_{0};
  std::atomic<int> releases_{0};
  std::atomic<int> refused_{0};
  std::atomic<int> unauthorized_{0};
  int ttl_s_;
  int interval_s_;
};

// A loopback port whose connections the kernel accepts (the listen backlog) and nobody ever answers: a stopped or
// hung quotad.
class SilentListener {
 public:
  SilentListener() {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
    EXPECT_EQ(::listen(fd_, 64), 0);
    socklen_t length = sizeof(address);
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&address), &length);
    port_ = ntohs(address.sin_port);
  }
  ~SilentListener() { ::close(fd_); }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }

 private:
  int fd_ = -1;
  int port_ = 0;
};

// A loopback port nothing listens on: quotad is down.
inline std::string closed_port_url() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address));
  socklen_t length = sizeof(address);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  ::close(fd);
  return "http://127.0.0.1:" + std::to_string(ntohs(address.sin_port));
}

// `url`: one quotad URL or several, comma-separated; short waits.
inline ClientConfig http_config(const std::string& url) {
  ClientConfig config;
  config.mode = url;
  config.token = "alice-token";
  config.poll_interval_s = 0.05;
  config.retry_initial_s = 0.1;
  config.retry_max_s = 0.4;
  return config;
}

}  // namespace yolo8::quota::testing
