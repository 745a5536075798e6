// The client against quotad's transient answers, with a fake quotad speaking quota/README.md's API: 503 with
// Retry-After (a storage stall), 502 and 504 (a proxy in front of it), no answer at all (down, or accepting and
// never answering). Asking for a lease retries them until the deadline; refusals are final; heartbeats and the
// release never wait long for a hung quotad, and the release says whether quotad acknowledged it.
#include <signal.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "quota/client/client.h"
#include "quota/client/transport.h"
#include "quota/core/sha256.h"
#include "tests/quota/client/fake_quotad.h"
#include "tests/quota/quotad_process.h"

namespace yolo8::quota {
namespace {

using testing::closed_port_url;
using testing::FakeQuotad;
using testing::http_config;
using testing::SilentListener;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

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

// A rate limit (429) and an internal error (500) are "not now" as a storage stall is: waited out, Retry-After
// honoured, never a refusal.
TEST(QuotaClientHttp, TooManyRequestsAndInternalErrorsAreRetriedUntilGranted) {
  for (const int status : {429, 500}) {
    SCOPED_TRACE(status);
    FakeQuotad quotad({{status, 1}});
    QuotaClient client(http_config(quotad.url()));
    std::vector<RetryInfo> retries;
    const LeaseInfo lease =
        client.acquire(LeaseRequest{}, {}, 60, RetryHooks{[&](const RetryInfo& r) { retries.push_back(r); }, {}});
    EXPECT_EQ(lease.id, 7);
    EXPECT_EQ(quotad.asked(), 2);
    ASSERT_EQ(retries.size(), 1u);
    EXPECT_EQ(retries[0].status, status);
    EXPECT_GE(retries[0].retry_in_s, 1.0) << "Retry-After is the least wait";
    EXPECT_LE(retries[0].retry_in_s, 1.2);
    EXPECT_TRUE(client.release(Outcome::kCompleted).acknowledged);
  }
}

// A Retry-After far beyond the client's patience (a proxy's hour) is cut to retry_after_max_s.
TEST(QuotaClientHttp, ALongRetryAfterIsCapped) {
  FakeQuotad quotad({{429, 3600}});
  ClientConfig config = http_config(quotad.url());
  config.retry_after_max_s = 0.2;
  QuotaClient client(config);
  std::vector<RetryInfo> retries;
  const auto start = Clock::now();
  EXPECT_EQ(
      client.acquire(LeaseRequest{}, {}, 60, RetryHooks{[&](const RetryInfo& r) { retries.push_back(r); }, {}}).id, 7);
  ASSERT_EQ(retries.size(), 1u);
  EXPECT_LE(retries[0].retry_in_s, 0.2 * 1.2 + 1e-9);
  EXPECT_LT(seconds_since(start), 2.0);
  client.release(Outcome::kCompleted);
}

TEST(QuotaClientHttp, RefusalsAreNotRetried) {
  for (const int status : {400, 401, 403, 404, 409, 422, 501}) {
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

// A token file as Kubernetes updates a mounted Secret: the new text appears at once (renamed into place).
void write_token(const std::string& path, const std::string& token) {
  const std::string part = path + ".part";
  std::ofstream(part) << token << "\n";
  std::filesystem::rename(part, path);
}

std::string token_path(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "/quota_client_token_" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  return dir + "/" + name;
}

ClientConfig token_file_config(const std::string& url, const std::string& file) {
  ClientConfig config = http_config(url);
  config.token.clear();
  config.token_file = file;
  return config;
}

// The Secret was rotated before the lease request: the 401 to the old token makes the client read the file
// again and ask once more, with the new one.
TEST(QuotaClientToken, TheLeaseRequestAfterARotationRetriesOnceWithTheNewToken) {
  const std::string file = token_path("rotated-before-ask");
  write_token(file, "token-a");
  FakeQuotad quotad({});
  quotad.accept_only("token-b");
  QuotaClient client(token_file_config(quotad.url(), file));
  write_token(file, "token-b");
  int retries = 0;
  const LeaseInfo lease = client.acquire(LeaseRequest{}, {}, 60, RetryHooks{[&](const RetryInfo&) { ++retries; }, {}});
  EXPECT_EQ(lease.id, 7);
  EXPECT_EQ(retries, 0) << "a rotation is no outage";
  EXPECT_EQ(quotad.unauthorized(), 1);
  EXPECT_EQ(quotad.asked(), 1);
  const std::vector<std::string> tokens = quotad.tokens();
  ASSERT_GE(tokens.size(), 2u);
  EXPECT_EQ(tokens[0], "Bearer token-a");
  EXPECT_EQ(tokens[1], "Bearer token-b");
  EXPECT_TRUE(client.release(Outcome::kCompleted).acknowledged);
}

// A running training: quotad stops taking the old token while the heartbeats go on; the next beat's 401 reads
// the rotated file and the lease carries on, its release acknowledged.
TEST(QuotaClientToken, HeartbeatsCarryOnThroughARotation) {
  const std::string file = token_path("rotated-while-training");
  write_token(file, "token-a");
  FakeQuotad quotad({}, 6, 1);
  quotad.accept_only("token-a");
  QuotaClient client(token_file_config(quotad.url(), file));
  client.acquire(LeaseRequest{});
  client.start_heartbeats();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const int beats = quotad.beats();
  ASSERT_GE(beats, 1);
  write_token(file, "token-b");
  quotad.accept_only("token-b");
  const auto rotated = Clock::now();
  while (quotad.beats() < beats + 2 && seconds_since(rotated) < 5) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_GE(quotad.beats(), beats + 2) << "the beats after the rotation are answered";
  EXPECT_EQ(quotad.unauthorized(), 1) << "one 401, then the new token";
  EXPECT_FALSE(client.unreachable_too_long());
  EXPECT_FALSE(client.lost());
  const ReleaseAnswer answer = client.release(Outcome::kCompleted);
  EXPECT_TRUE(answer.acknowledged);
  EXPECT_EQ(quotad.tokens().back(), "Bearer token-b");
}

// The file still holds the token quotad refuses: one request, no retry, a refusal that names the file.
TEST(QuotaClientToken, ARefusedTokenThatDidNotChangeIsARefusalNamingTheFile) {
  const std::string file = token_path("unchanged");
  write_token(file, "token-a");
  FakeQuotad quotad({});
  quotad.accept_only("token-b");
  QuotaClient client(token_file_config(quotad.url(), file));
  try {
    client.acquire(LeaseRequest{});
    FAIL() << "granted with a refused token";
  } catch (const QuotaRefused& refused) {
    EXPECT_EQ(refused.status(), 401);
    EXPECT_NE(std::string(refused.what()).find("invalid token (the token of " + file + ")"), std::string::npos)
        << refused.what();
  }
  EXPECT_EQ(quotad.tokens().size(), 1u);
}

// quotad stops taking the token while the file was not rotated: the beats are refused, which the client says once,
// naming the file, and the lease is left to the fence.
TEST(QuotaClientToken, RefusedHeartbeatsAreSaidOnceNamingTheFile) {
  const std::string file = token_path("not-rotated");
  write_token(file, "token-a");
  FakeQuotad quotad({}, 6, 1);
  std::mutex mutex;
  std::vector<std::string> notices;
  ClientConfig config = token_file_config(quotad.url(), file);
  config.on_notice = [&](const std::string& text) {
    std::lock_guard<std::mutex> lock(mutex);
    notices.push_back(text);
  };
  QuotaClient client(config);
  client.acquire(LeaseRequest{});
  quotad.accept_only("token-b");
  client.start_heartbeats();
  std::this_thread::sleep_for(std::chrono::milliseconds(2300));
  EXPECT_GE(quotad.unauthorized(), 2);
  EXPECT_EQ(quotad.beats(), 0);
  client.stop_heartbeats();
  std::lock_guard<std::mutex> lock(mutex);
  ASSERT_EQ(notices.size(), 1u);
  EXPECT_EQ(notices[0], "quotad refused the heartbeat (401: invalid token (the token of " + file + "))");
}

// The rotation end to end with quotad itself: its tokens file takes the new token beside the old one, the
// Secret is rewritten, then quotad drops the old token; the heartbeat that meets the 401 reads the file again and
// the lease runs on, its release acknowledged.
TEST(QuotaClientToken, ARotationAtQuotadNeverCutsTheLease) {
  const std::string dir = token_path("quotad");
  const std::string tokens = dir + "-tokens.yaml";
  const std::string old_hash = sha256_hex("alice-old-token");
  const std::string new_hash = sha256_hex("alice-new-token");
  const auto write_tokens = [&](const std::string& text) {
    std::ofstream(tokens + ".part") << text;
    std::filesystem::rename(tokens + ".part", tokens);
  };
  write_tokens("users:\n  alice: {token_sha256: " + old_hash + "}\n");
  std::ofstream(dir + "-policy.yaml") << yolo8::test::one_gpu_policy(6, 1);
  yolo8::test::QuotadProcess quotad;
  std::filesystem::remove(dir + "-quota.db");
  ASSERT_TRUE(quotad.start(dir + "-policy.yaml", dir + "-quota.db", dir + "-quotad.log", {"--backup-every", "0"},
                           {"QUOTAD_TOKENS_FILE=" + tokens}));
  const std::string file = token_path("secret");
  write_token(file, "alice-old-token");
  QuotaClient client(token_file_config(quotad.url(), file));
  LeaseRequest request;
  request.team = "ta";
  request.model = "yolov8n";
  const LeaseInfo lease = client.acquire(request);
  ASSERT_GT(lease.id, 0);
  client.start_heartbeats();

  write_tokens("users:\n  alice: {token_sha256: " + new_hash + ", previous_token_sha256: " + old_hash + "}\n");
  ASSERT_EQ(::kill(quotad.pid(), SIGHUP), 0);
  write_token(file, "alice-new-token");
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  write_tokens("users:\n  alice: {token_sha256: " + new_hash + "}\n");
  ASSERT_EQ(::kill(quotad.pid(), SIGHUP), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(3000));  // three beats at least, one of them meeting the 401

  // the old token is refused now: the beats went on with the new one
  ApiRequest list;
  list.method = "GET";
  list.path = "/v1/leases";
  EXPECT_EQ(make_http_transport(quotad.url(), "alice-old-token")->call(list).status, 401);
  EXPECT_FALSE(client.unreachable_too_long());
  EXPECT_FALSE(client.lost());
  const ReleaseAnswer answer = client.release(Outcome::kCompleted);
  EXPECT_TRUE(answer.acknowledged) << answer.reason;
  EXPECT_TRUE(answer.released_now);
  EXPECT_TRUE(quotad.stop());
}

TEST(QuotaClientToken, AMissingFileOrBothATokenAndAFileAreErrorsNamingThem) {
  const std::string missing = token_path("missing");
  std::filesystem::remove(missing);
  try {
    QuotaClient client(token_file_config("http://127.0.0.1:1", missing));
    FAIL() << "a client without its token file";
  } catch (const std::invalid_argument& error) {
    EXPECT_NE(std::string(error.what()).find("quota_token_file: cannot read '" + missing + "'"), std::string::npos)
        << error.what();
  }
  const std::string file = token_path("both");
  write_token(file, "token-a");
  ClientConfig both = token_file_config("http://127.0.0.1:1", file);
  both.token = "token-b";
  EXPECT_THROW(QuotaClient client(both), std::invalid_argument);
}

// A quotad whose database was restored from a backup that predates lease 9: heartbeats and the release answer
// "unknown lease 9" (as quotad does) until the receipt the grant carried is presented; `accept` says whether the
// reattach is granted (else 409, as for GPUs taken since).
class RestoredQuotad {
 public:
  explicit RestoredQuotad(bool accept) : accept_(accept) {
    server_.Post("/v1/leases", [](const httplib::Request&, httplib::Response& response) {
      const nlohmann::json lease = {{"id", 9},
                                    {"state", "granted"},
                                    {"devices", {"node-a:2"}},
                                    {"ttl_s", 30},
                                    {"heartbeat_interval_s", 1},
                                    {"memory_gib", 80},
                                    {"receipt", kReceipt}};
      response.status = 201;
      response.set_content(nlohmann::json{{"status", "granted"}, {"lease_id", 9}, {"lease", lease}}.dump(),
                           "application/json");
    });
    auto unknown_or_granted = [this](const httplib::Request&, httplib::Response& response) {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!reattached_) {
        response.status = 404;
        response.set_content(R"({"error":404,"reason":"unknown lease 9"})", "application/json");
        return;
      }
      response.set_content(R"({"lease_id":9,"state":"granted","released_now":true})", "application/json");
    };
    server_.Post("/v1/leases/9/heartbeat", unknown_or_granted);
    server_.Post("/v1/leases/9/release", unknown_or_granted);
    server_.Post("/v1/leases/9/reattach", [this](const httplib::Request& request, httplib::Response& response) {
      std::lock_guard<std::mutex> lock(mutex_);
      presented_.push_back(nlohmann::json::parse(request.body));
      if (!accept_) {
        response.status = 409;
        response.set_content(R"({"error":409,"reason":"devices: GPU node-a:2 is held by lease 2000000000"})",
                             "application/json");
        return;
      }
      reattached_ = true;
      response.set_content(R"({"lease_id":9,"state":"granted","reattached":true})", "application/json");
    });
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
  }
  ~RestoredQuotad() {
    server_.stop();
    thread_.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  std::vector<nlohmann::json> presented() {
    std::lock_guard<std::mutex> lock(mutex_);
    return presented_;
  }
  inline static const nlohmann::json kReceipt = {{"lease_id", 9}, {"user", "alice"}, {"signature", "ab12"}};

 private:
  const bool accept_;
  httplib::Server server_;
  std::thread thread_;
  int port_ = 0;
  std::mutex mutex_;
  bool reattached_ = false;
  std::vector<nlohmann::json> presented_;
};

TEST(QuotaClientHttp, AnUnknownLeaseIsReattachedFromItsReceiptAndBeatsOn) {
  RestoredQuotad quotad(true);
  QuotaClient client(http_config(quotad.url()));
  const LeaseInfo lease = client.acquire(LeaseRequest{});
  EXPECT_EQ(lease.receipt, RestoredQuotad::kReceipt);
  client.start_heartbeats();
  const auto until = Clock::now() + std::chrono::seconds(5);
  while (client.reattachments() == 0 && Clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // a beat after it
  EXPECT_EQ(client.reattachments(), 1);
  EXPECT_FALSE(client.lost());
  ASSERT_EQ(quotad.presented().size(), 1u);
  EXPECT_EQ(quotad.presented()[0], nlohmann::json({{"receipt", RestoredQuotad::kReceipt}}));
  EXPECT_TRUE(client.release(Outcome::kCompleted).acknowledged);
}

TEST(QuotaClientHttp, ARefusedReceiptLosesTheLeaseAndIsPresentedOnce) {
  RestoredQuotad quotad(false);
  std::vector<std::string> notices;
  std::mutex notices_mutex;
  ClientConfig config = http_config(quotad.url());
  config.on_notice = [&](const std::string& text) {
    std::lock_guard<std::mutex> lock(notices_mutex);
    notices.push_back(text);
  };
  QuotaClient client(config);
  client.acquire(LeaseRequest{});
  client.start_heartbeats();
  const auto until = Clock::now() + std::chrono::seconds(5);
  while (!client.lost() && Clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_TRUE(client.lost());
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));  // two more beats: still 404, not presented again
  EXPECT_EQ(quotad.presented().size(), 1u);
  EXPECT_EQ(client.reattachments(), 0);
  {
    std::lock_guard<std::mutex> lock(notices_mutex);
    ASSERT_FALSE(notices.empty());
    EXPECT_NE(notices[0].find("refused its grant receipt (409"), std::string::npos) << notices[0];
  }
  EXPECT_FALSE(client.release(Outcome::kCompleted).acknowledged);
}

}  // namespace
}  // namespace yolo8::quota
