// The client against quotad's transient answers, with a fake quotad speaking quota/README.md's API: 503 with
// Retry-After (a storage stall), 502 and 504 (a proxy in front of it), no answer at all (down, or accepting and
// never answering). Asking for a lease retries them until the deadline; refusals are final; heartbeats and the
// release never wait long for a hung quotad, and the release says whether quotad acknowledged it.
#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <iostream>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "quota/client/client.h"

namespace yolo8::quota {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

// One answer of the fake: a status, and Retry-After when > 0.
struct Answer {
  int status = 201;
  int retry_after_s = 0;
};

// A quotad stand-in on a loopback port. POST /v1/leases takes its answers from `asks` (a 202 queues lease 7),
// then grants lease 7; GET /v1/leases/7 takes its answers from `polls`, then says granted. Heartbeats and releases
// answer 200 until hang(), after which they are never answered (until the fake goes away).
class FakeQuotad {
 public:
  FakeQuotad(std::vector<Answer> asks, int ttl_s = 60, int interval_s = 10, std::vector<Answer> polls = {})
      : asks_(asks.begin(), asks.end()), polls_(polls.begin(), polls.end()), ttl_s_(ttl_s), interval_s_(interval_s) {
    server_.Post("/v1/leases", [this](const httplib::Request& request, httplib::Response& response) {
      std::lock_guard<std::mutex> lock(mutex_);
      keys_.insert(request.get_header_value("Idempotency-Key"));
      ++asked_;
      const Answer answer = next(asks_);
      if (answer.status == 201)
        return reply(response, 201, json{{"status", "granted"}, {"lease_id", 7}, {"lease", lease("granted")}});
      if (answer.status == 202) {
        return reply(response, 202, json{{"status", "queued"}, {"lease_id", 7}, {"position", 1}, {"reason", "busy"}});
      }
      reply(response, answer.status, json{{"error", answer.status}, {"reason", "scripted"}}, answer.retry_after_s);
    });
    server_.Get("/v1/leases/7", [this](const httplib::Request&, httplib::Response& response) {
      std::lock_guard<std::mutex> lock(mutex_);
      const Answer answer = next(polls_);
      if (answer.status == 201) return reply(response, 200, lease("granted"));
      if (answer.status == 202) {
        return reply(response, 200, json{{"id", 7}, {"state", "queued"}, {"position", 1}, {"reason", "busy"}});
      }
      reply(response, answer.status, json{{"error", answer.status}, {"reason", "scripted"}}, answer.retry_after_s);
    });
    server_.Post("/v1/leases/7/heartbeat", [this](const httplib::Request&, httplib::Response& response) {
      wait_while_hung();
      ++beats_;
      reply(response, 200, json{{"state", "granted"}, {"ttl_s", ttl_s_}, {"heartbeat_interval_s", interval_s_}});
    });
    server_.Post("/v1/leases/7/release", [this](const httplib::Request&, httplib::Response& response) {
      wait_while_hung();
      ++releases_;
      json view = lease("released");
      view["released_now"] = true;
      reply(response, 200, view);
    });
    port_ = server_.bind_to_any_port("127.0.0.1");  // listening from here: early connections wait in the backlog
    thread_ = std::thread([this] { server_.listen_after_bind(); });
  }
  ~FakeQuotad() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      hung_ = false;
    }
    unhung_.notify_all();
    server_.stop();
    thread_.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  void hang() {
    std::lock_guard<std::mutex> lock(mutex_);
    hung_ = true;
  }
  int asked() const { return asked_; }
  int beats() const { return beats_; }
  int releases() const { return releases_; }
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
  json lease(const std::string& state) const {
    return json{{"id", 7},          {"state", state},      {"devices", {"n1:0"}},
                {"memory_gib", 24}, {"ttl_s", ttl_s_},     {"heartbeat_interval_s", interval_s_},
                {"shared", false},  {"preempt_grace_s", 0}};
  }
  static void reply(httplib::Response& response, int status, const json& body, int retry_after_s = 0) {
    response.status = status;
    if (retry_after_s > 0) response.set_header("Retry-After", std::to_string(retry_after_s));
    response.set_content(body.dump(), "application/json");
  }
  void wait_while_hung() {
    std::unique_lock<std::mutex> lock(mutex_);
    unhung_.wait(lock, [this] { return !hung_; });
  }

  httplib::Server server_;
  std::thread thread_;
  int port_ = 0;
  std::mutex mutex_;
  std::condition_variable unhung_;
  bool hung_ = false;
  std::deque<Answer> asks_;
  std::deque<Answer> polls_;
  std::set<std::string> keys_;
  std::atomic<int> asked_{0};
  std::atomic<int> beats_{0};
  std::atomic<int> releases_{0};
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
std::string closed_port_url() {
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

ClientConfig http_config(const std::string& url) {
  ClientConfig config;
  config.mode = url;
  config.token = "alice-token";
  config.poll_interval_s = 0.05;
  config.retry_initial_s = 0.1;
  config.retry_max_s = 0.4;
  return config;
}

TEST(QuotaClientHttp, RetryAnswersAreRetriedHonouringRetryAfterUntilGranted) {
  FakeQuotad quotad({{503, 1}, {502, 0}, {504, 0}, {503, 0}});
  QuotaClient client(http_config(quotad.url()));
  std::vector<RetryInfo> retries;
  const auto start = Clock::now();
  const LeaseInfo lease =
      client.acquire(LeaseRequest{}, {}, 60, RetryHooks{[&](const RetryInfo& r) { retries.push_back(r); }, {}});
  EXPECT_EQ(lease.id, 7);
  EXPECT_EQ(quotad.asked(), 5);
  EXPECT_EQ(quotad.keys().size(), 1u) << "every attempt carries the same idempotency key";
  ASSERT_EQ(retries.size(), 4u);
  EXPECT_EQ(retries[0].status, 503);
  EXPECT_EQ(retries[1].status, 502);
  EXPECT_EQ(retries[2].status, 504);
  EXPECT_EQ(retries[0].reason, "scripted");
  EXPECT_GE(retries[0].retry_in_s, 1.0) << "Retry-After is the least wait";
  EXPECT_LE(retries[0].retry_in_s, 1.2);
  for (size_t i = 0; i < retries.size(); ++i) {
    EXPECT_EQ(retries[i].attempt, static_cast<int>(i) + 1);
    EXPECT_GT(retries[i].give_up_in_s, 590);
  }
  EXPECT_GE(seconds_since(start), 1.0);
  client.release(Outcome::kCompleted);
}

TEST(QuotaClientHttp, RefusalsAreNotRetried) {
  for (const int status : {400, 401, 403, 404, 409, 422}) {
    SCOPED_TRACE(status);
    FakeQuotad quotad({{status, 0}});
    QuotaClient client(http_config(quotad.url()));
    int retries = 0;
    try {
      client.acquire(LeaseRequest{}, {}, 60, RetryHooks{[&](const RetryInfo&) { ++retries; }, {}});
      ADD_FAILURE() << "granted after a refusal";
    } catch (const QuotaRefused& refused) {
      EXPECT_EQ(refused.status(), status);
    }
    EXPECT_EQ(retries, 0);
    EXPECT_EQ(quotad.asked(), 1);
  }
}

TEST(QuotaClientHttp, AQuotadThatIsDownIsRetriedUntilTheDeadline) {
  ClientConfig config = http_config(closed_port_url());
  config.unavailable_deadline_s = 1.5;
  QuotaClient client(config);
  std::vector<RetryInfo> retries;
  const auto start = Clock::now();
  try {
    client.acquire(LeaseRequest{}, {}, 60, RetryHooks{[&](const RetryInfo& r) { retries.push_back(r); }, {}});
    FAIL() << "granted by nobody";
  } catch (const QuotaUnavailable& unavailable) {
    EXPECT_EQ(unavailable.status(), 0);
    EXPECT_NE(std::string(unavailable.what()).find("quotad unavailable for "), std::string::npos) << unavailable.what();
    EXPECT_NE(std::string(unavailable.what()).find("no answer: Connection"), std::string::npos) << unavailable.what();
  }
  const double seconds = seconds_since(start);
  EXPECT_GE(seconds, 1.5);
  EXPECT_LT(seconds, 3.0);
  ASSERT_GE(retries.size(), 3u);
  EXPECT_EQ(retries.front().status, 0);
  // the waits grow (with jitter: each is half to all of its back-off) up to retry_max_s
  EXPECT_LE(retries.front().retry_in_s, 0.1);
  double longest = 0;
  for (const RetryInfo& retry : retries) longest = std::max(longest, retry.retry_in_s);
  EXPECT_GE(longest, 0.2 - 1e-9);
  EXPECT_LT(retries.back().give_up_in_s, retries.front().give_up_in_s);
}

TEST(QuotaClientHttp, AQuotadThatAcceptsAndNeverAnswersIsUnavailableNotHung) {
  SilentListener hung;
  ClientConfig config = http_config(hung.url());
  config.unavailable_deadline_s = 2;
  QuotaClient client(config);
  const auto start = Clock::now();
  EXPECT_THROW(client.acquire(LeaseRequest{}, {}, 60), QuotaUnavailable);
  // the deadline, or the one call under way then (its read timeout, 5 s)
  EXPECT_LT(seconds_since(start), 2 + 5 + 1.0);
}

// SIGTERM while quotad is unavailable: the trainer's check throws, and acquire gives up in the middle of a wait.
TEST(QuotaClientHttp, TheCheckGivesUpDuringTheWait) {
  FakeQuotad quotad({{503, 30}});
  QuotaClient client(http_config(quotad.url()));
  const auto start = Clock::now();
  RetryHooks hooks;
  hooks.check = [&] {
    if (seconds_since(start) > 0.3) throw std::runtime_error("SIGTERM");
  };
  EXPECT_THROW(client.acquire(LeaseRequest{}, {}, 60, hooks), std::runtime_error);
  EXPECT_LT(seconds_since(start), 1.0);
}

// A queued request whose polls meet a storage stall keeps its place: the stall is waited out, not a refusal.
TEST(QuotaClientHttp, UnavailableAnswersWhileQueuedAreWaitedOut) {
  FakeQuotad quotad({{202, 0}}, 60, 10, {{503, 1}, {502, 0}, {202, 0}});
  QuotaClient client(http_config(quotad.url()));
  int retries = 0;
  int waits = 0;
  const LeaseInfo lease = client.acquire(
      LeaseRequest{}, [&](const WaitInfo&) { ++waits; }, 60, RetryHooks{[&](const RetryInfo&) { ++retries; }, {}});
  EXPECT_EQ(lease.id, 7);
  EXPECT_EQ(retries, 2);
  EXPECT_GE(waits, 1);
  client.release(Outcome::kCompleted);
}

// The fence leaves the trainer time to checkpoint and release before ttl - interval after the last heartbeat,
// and never fires on one late heartbeat.
TEST(QuotaClientHttp, TheFenceLeavesTimeToStopBeforeTheTtlLessAnInterval) {
  struct Case {
    int ttl_s, interval_s;
    int64_t fence_ms;
  };
  for (const Case& c : {Case{60, 10, 40000}, Case{30, 1, 24000}, Case{12, 1, 6000}, Case{6, 1, 2000}, Case{4, 1, 2000},
                        Case{3, 1, 2000}}) {
    SCOPED_TRACE(std::to_string(c.ttl_s) + "/" + std::to_string(c.interval_s));
    FakeQuotad quotad({}, c.ttl_s, c.interval_s);
    QuotaClient client(http_config(quotad.url()));
    client.acquire(LeaseRequest{});
    EXPECT_EQ(client.fence_after_ms(), c.fence_ms);
    client.release(Outcome::kCompleted);
  }
}

TEST(QuotaClientHttp, AReleaseQuotadAnsweredIsAcknowledged) {
  FakeQuotad quotad({}, 6, 1);
  QuotaClient client(http_config(quotad.url()));
  client.acquire(LeaseRequest{});
  client.start_heartbeats([] { return Telemetry{}; });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const ReleaseAnswer answer = client.release(Outcome::kCompleted);
  EXPECT_TRUE(answer.acknowledged);
  EXPECT_TRUE(answer.released_now);
  EXPECT_EQ(answer.state, "released");
  EXPECT_EQ(quotad.releases(), 1);
  EXPECT_GE(quotad.beats(), 2) << "the first beat and the last one on release";
}

// quotad stops answering (SIGSTOP, a hung process): the client fences before ttl - interval, stopping the
// heartbeats does not wait for the beat in flight, and the release, tried once, says it was not acknowledged and
// when the lease expires.
TEST(QuotaClientHttp, AHungQuotadFencesInTimeAndTheReleaseIsNotAcknowledged) {
  FakeQuotad quotad({}, 6, 1);  // fence after 2 s without an answer; ttl - interval = 5 s
  QuotaClient client(http_config(quotad.url()));
  client.acquire(LeaseRequest{});
  client.start_heartbeats();
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  EXPECT_FALSE(client.unreachable_too_long());
  const int beats = quotad.beats();
  ASSERT_GE(beats, 1);
  quotad.hang();
  const auto hung = Clock::now();
  while (!client.unreachable_too_long() && seconds_since(hung) < 10) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const double fenced_s = seconds_since(hung);
  EXPECT_TRUE(client.unreachable_too_long());
  // two seconds after the last answered beat, which came at most an interval before the hang
  EXPECT_GE(fenced_s, 1.0);
  EXPECT_LT(fenced_s, 2.5);
  const auto releasing = Clock::now();
  const ReleaseAnswer answer = client.release(Outcome::kPreempted);
  const double release_s = seconds_since(releasing);
  EXPECT_FALSE(answer.acknowledged);
  EXPECT_EQ(answer.status, 0);
  EXPECT_NE(answer.reason.find("no answer: Read"), std::string::npos) << answer.reason;
  // one call of at most the heartbeat timeout (1 s here); stopping the heartbeats took no time
  EXPECT_LT(release_s, 1.5);
  const int64_t left_ms = client.expires_at_ms() - system_now_ms();
  EXPECT_GT(left_ms, 0);
  EXPECT_LT(left_ms, 6000 - 2000);
  EXPECT_EQ(quotad.releases(), 0);
  std::cout << "fenced " << fenced_s << " s after quotad hung; release gave up after " << release_s << " s\n";
}

}  // namespace
}  // namespace yolo8::quota
