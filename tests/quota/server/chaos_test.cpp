// Chaos and security suite (label integration; run alone with --gtest_filter='QuotaChaos.*'):
// a storage stall, restarts after long quiet periods, hostile clients on loopback.
#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <thread>
#include <tuple>

#include "quota/server/http_server.h"
#include "quota/server/status_page.h"
#include "quota/service/service.h"
#include "tests/quota/loopback_util.h"
#include "tests/quota/quota_test_util.h"
#include "tests/quota/write_lock_holder.h"

namespace yolo8::quota {
namespace {
using yolo8::test::WriteLockHolder;

using nlohmann::json;
using testing::api_call;
using testing::connect_from;
using testing::kHour;
using testing::kMonday;
using testing::temp_db;
using Steady = std::chrono::steady_clock;

struct FakeClock {
  std::shared_ptr<std::atomic<int64_t>> now = std::make_shared<std::atomic<int64_t>>(kMonday + 9 * kHour);
  std::function<int64_t()> fn() const {
    auto shared = now;
    return [shared] { return shared->load(); };
  }
};

double ms_since(Steady::time_point start) {
  return std::chrono::duration<double, std::milli>(Steady::now() - start).count();
}

// Another process holds the write lock. Before: the acquire blocked 30 s, answered 503,
// yet the lease was granted in memory, its audit row was missing for good, and a heartbeating lease expired.
TEST(QuotaChaos, AStorageStallLeavesNoPhantomStateNoAuditGapAndNoExpiredLease) {
  const std::string db = temp_db("chaos_stall");
  FakeClock clock;
  ServiceOptions options;
  options.db_path = db;
  options.clock = clock.fn();
  options.store_busy_timeout_ms = 300;
  options.store_backoff_ms = 0;  // every call below really waits for the lock (see the back-off test)
  options.outage_after_ms = 3000;
  QuotaService service(testing::example_policy(), options);
  ASSERT_EQ(service.handle(api_call("POST", "/v1/leases", "alice-token", R"({"model":"yolov8s"})")).status, 201);
  ASSERT_EQ(service.handle(api_call("POST", "/v1/leases", "erin-token", R"({"model":"yolov8s"})")).status, 201);
  service.tick();
  int64_t before_gpus = 0;
  service.inspect([&](const Engine& engine) { before_gpus = static_cast<int64_t>(engine.leases().size()); });

  WriteLockHolder holder(db);
  // the acquire fails whole: 503 with Retry-After, and nothing of it stays in memory
  const ApiResponse refused = service.handle(api_call("POST", "/v1/leases", "bob-token", R"({"model":"yolov8s"})"));
  EXPECT_EQ(refused.status, 503) << refused.body.dump();
  EXPECT_EQ(refused.headers.count("Retry-After"), 1u);
  service.inspect([&](const Engine& engine) {
    EXPECT_EQ(static_cast<int64_t>(engine.leases().size()), before_gpus);
    EXPECT_EQ(engine.find(3), nullptr);
    EXPECT_DOUBLE_EQ(engine.team_units("team-cv", clock.now->load()), 1);
  });
  // a release fails whole too: lease 1 is still granted
  EXPECT_EQ(service.handle(api_call("POST", "/v1/leases/1/release", "alice-token")).status, 503);
  service.inspect([](const Engine& engine) { EXPECT_EQ(engine.find(1)->state, LeaseState::kGranted); });

  // heartbeats never wait for the database, even while a state change is stuck on it
  std::atomic<bool> writer_done{false};
  std::thread writer([&] {
    service.handle(api_call("POST", "/v1/leases", "bob-token", R"({"model":"yolov8s"})"));
    writer_done = true;
  });
  double worst_ms = 0;
  // the stall lasts 90 s of quotad's clock (beyond the 60 s TTL); lease 1 heartbeats every 10 s, lease 2 not
  for (int beat = 0; beat < 9; ++beat) {
    *clock.now += 10000;
    const auto start = Steady::now();
    const ApiResponse answer = service.handle(api_call("POST", "/v1/leases/1/heartbeat", "alice-token", "{}"));
    worst_ms = std::max(worst_ms, ms_since(start));
    EXPECT_EQ(answer.status, 200) << answer.body.dump();
    EXPECT_EQ(answer.body["state"], "granted");
    EXPECT_THROW(service.tick(), std::exception);  // the tick cannot be saved either: nothing expires
  }
  EXPECT_LT(worst_ms, 100) << "a heartbeat waited for the stalled store";
  writer.join();
  EXPECT_TRUE(writer_done);
  holder.release();

  service.tick();
  service.inspect([&](const Engine& engine) {
    EXPECT_EQ(engine.find(1)->state, LeaseState::kGranted) << "a heartbeating lease expired during the stall";
    EXPECT_EQ(engine.find(2)->state, LeaseState::kGranted) << "quotad's outage was not credited";
    EXPECT_EQ(engine.find(3), nullptr);
  });
  const ApiResponse granted = service.handle(api_call("POST", "/v1/leases", "bob-token", R"({"model":"yolov8s"})"));
  EXPECT_EQ(granted.status, 201) << granted.body.dump();
  EXPECT_EQ(granted.body["lease_id"], 3);
  const json audit = service.handle(api_call("GET", "/v1/audit?limit=1000", "admin-token")).body["audit"];
  ASSERT_FALSE(audit.empty());
  bool outage_audited = false;
  for (size_t i = 0; i < audit.size(); ++i) {
    EXPECT_EQ(audit[i]["seq"], static_cast<int64_t>(i) + 1) << "the audit sequence has a gap";
    outage_audited = outage_audited || audit[i]["action"] == "quotad.outage";
  }
  EXPECT_TRUE(outage_audited);
  EXPECT_TRUE(service.check_invariants().empty());
  // and a restart finds a sound database
  QuotaService again(testing::example_policy(), options);
  again.inspect([](const Engine& engine) { EXPECT_EQ(engine.find(3)->state, LeaseState::kGranted); });
}

// After a write failed, state changes answer 503 at once for a moment instead of each holding the engine lock
// for the whole busy timeout in turn (which would tie up every API worker during a long stall).
TEST(QuotaChaos, AfterAFailedWriteChangesFailFastUntilTheBackOffEnds) {
  const std::string db = temp_db("chaos_backoff");
  ServiceOptions options;
  options.db_path = db;
  options.store_busy_timeout_ms = 300;
  options.store_backoff_ms = 1000;
  QuotaService service(testing::example_policy(), options);
  WriteLockHolder holder(db);
  auto start = Steady::now();
  EXPECT_EQ(service.handle(api_call("POST", "/v1/leases", "alice-token", "{}")).status, 503);
  EXPECT_GE(ms_since(start), 250) << "the first change waits for the lock";
  start = Steady::now();
  const ApiResponse fast = service.handle(api_call("POST", "/v1/leases", "alice-token", "{}"));
  EXPECT_EQ(fast.status, 503);
  EXPECT_EQ(fast.headers.count("Retry-After"), 1u);
  EXPECT_LT(ms_since(start), 100) << "a change during the back-off does not wait";
  EXPECT_EQ(service.handle(api_call("GET", "/v1/teams", "alice-token")).status, 200) << "reads still answer";
  holder.release();
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  EXPECT_EQ(service.handle(api_call("POST", "/v1/leases", "alice-token", "{}")).status, 201);
}

// The example department served from memory (the security rules do not depend on storage).
struct Served {
  FakeClock clock;
  std::unique_ptr<QuotaService> service;
  explicit Served(Policy policy = testing::example_policy()) {
    ServiceOptions options;
    options.clock = clock.fn();
    service = std::make_unique<QuotaService>(std::move(policy), options);
  }
  ApiResponse call(const std::string& method, const std::string& path, const std::string& token,
                   const std::string& body = "", const std::string& address = "10.0.0.1") {
    ApiRequest request = api_call(method, path, token, body);
    request.client_address = address;
    return service->handle(request);
  }
  json audit() { return call("GET", "/v1/audit?limit=1000", "admin-token").body["audit"]; }
};

// A lead approved their own yolov8x request.
TEST(QuotaChaos, NobodyApprovesTheirOwnRequest) {
  Served served;
  const ApiResponse asked =
      served.call("POST", "/v1/leases", "carol-token", R"({"model":"yolov8x","justification":"my paper"})");
  ASSERT_EQ(asked.status, 403);
  ASSERT_EQ(asked.body["status"], "needs_approval");
  const ApiResponse own = served.call("POST", "/v1/approvals/1/approve", "carol-token");
  EXPECT_EQ(own.status, 403) << own.body.dump();
  EXPECT_NE(own.body["reason"].get<std::string>().find("own request"), std::string::npos);
  const ApiResponse admin_ok = served.call("POST", "/v1/approvals/1/approve", "admin-token");
  EXPECT_EQ(admin_ok.status, 200) << admin_ok.body.dump();
}

// An admin acquiring for alice was audited as alice; a user outside the policy was granted.
TEST(QuotaChaos, ActingOnBehalfIsAuditedWithBothNamesAndUnknownUsersAreRefused) {
  Served served;
  const ApiResponse for_alice =
      served.call("POST", "/v1/leases", "admin-token", R"({"team":"team-cv","user":"alice","model":"yolov8s"})");
  ASSERT_EQ(for_alice.status, 201) << for_alice.body.dump();
  const json audit = served.audit();
  ASSERT_FALSE(audit.empty());
  const json& granted = audit.back();
  EXPECT_EQ(granted["action"], "lease.granted");
  EXPECT_EQ(granted["actor"], "admin");
  EXPECT_NE(granted["detail"].get<std::string>().find("on behalf of alice"), std::string::npos) << granted.dump();
  // the body cannot claim another requester
  const ApiResponse own = served.call("POST", "/v1/leases", "alice-token", R"({"model":"yolov8s","requested_by":"x"})");
  ASSERT_EQ(own.status, 201);
  EXPECT_EQ(served.audit().back()["actor"], "alice");
  EXPECT_EQ(served.audit().back()["detail"].get<std::string>().find("on behalf"), std::string::npos);

  const ApiResponse ghost =
      served.call("POST", "/v1/leases", "admin-token", R"({"team":"team-cv","user":"mallory","model":"yolov8s"})");
  EXPECT_EQ(ghost.status, 403) << ghost.body.dump();
  EXPECT_NE(ghost.body["reason"].get<std::string>().find("unknown user 'mallory'"), std::string::npos);
  const ApiResponse wrong_team =
      served.call("POST", "/v1/leases", "admin-token", R"({"team":"team-robotics","user":"alice","model":"yolov8s"})");
  EXPECT_EQ(wrong_team.status, 403) << wrong_team.body.dump();
}

// 29,594 token guesses in 3 s, no throttling, no audit row.
// The block was per address, so wrong tokens from the address trainers share (a TLS
// proxy, a NAT) locked out every valid token there. Now a wrong token is throttled per (address, token).
TEST(QuotaChaos, FailedAuthenticationIsThrottledPerAddressAndTokenAndAuditedInAggregate) {
  Served served;
  int unauthorized = 0, throttled = 0;
  for (int attempt = 0; attempt < 1000; ++attempt) {
    const ApiResponse answer = served.call("GET", "/v1/teams", "wrong", "", "198.51.100.7");
    if (answer.status == 401) ++unauthorized;
    if (answer.status == 429) {
      ++throttled;
      EXPECT_EQ(answer.headers.count("Retry-After"), 1u);
    }
  }
  EXPECT_EQ(unauthorized, 5) << "only the first few repeats reach the token check";
  EXPECT_EQ(throttled, 995);
  // a valid token from the same address is never blocked
  EXPECT_EQ(served.call("GET", "/v1/teams", "alice-token", "", "198.51.100.7").status, 200);
  // the same wrong token elsewhere, or another token here, is not blocked either
  EXPECT_EQ(served.call("GET", "/v1/teams", "wrong", "", "198.51.100.8").status, 401);
  EXPECT_EQ(served.call("GET", "/v1/teams", "wrong-too", "", "198.51.100.7").status, 401);
  // exponential back-off: 250 ms after the 5th failure, then 500 ms after the next one
  *served.clock.now += 300;
  EXPECT_EQ(served.call("GET", "/v1/teams", "wrong", "", "198.51.100.7").status, 401);
  *served.clock.now += 300;
  EXPECT_EQ(served.call("GET", "/v1/teams", "wrong", "", "198.51.100.7").status, 429);
  *served.clock.now += 300;
  EXPECT_EQ(served.call("GET", "/v1/teams", "wrong", "", "198.51.100.7").status, 401);
  served.service->tick();
  int audited = 0;
  for (const auto& entry : served.audit()) {
    if (entry["action"] != "auth.failed") continue;
    ++audited;
    const std::string detail = entry["detail"].get<std::string>();
    EXPECT_TRUE(detail.find("1004 failed or refused authentication(s) from 198.51.100.7") != std::string::npos ||
                detail.find("1 failed or refused authentication(s) from 198.51.100.8") != std::string::npos)
        << entry.dump();
  }
  EXPECT_EQ(audited, 2) << "one aggregate entry per address, not one per guess";
}

// 500 distinct wrong tokens from one address were each a new (address, token) key, all answered 401 at full
// speed. Failures are now throttled per address too, but only once a token is found wrong: a trainer with a
// valid token on the same address acquires and heartbeats throughout, and other addresses are not affected.
TEST(QuotaChaos, DistinctWrongTokensFromOneAddressAreThrottledWhileValidTokensThereAreServed) {
  Served served;
  const std::string guesser = "198.51.100.7";
  const ApiResponse granted = served.call("POST", "/v1/leases", "alice-token", R"({"model":"yolov8s"})", guesser);
  ASSERT_EQ(granted.status, 201) << granted.body.dump();
  const std::string beat = "/v1/leases/" + std::to_string(granted.body["lease_id"].get<int64_t>()) + "/heartbeat";
  int unauthorized = 0, throttled = 0, trainer_calls = 0, trainer_served = 0;
  for (int attempt = 0; attempt < 500; ++attempt) {
    if (attempt % 50 == 25) *served.clock.now += 1000;  // time passes: blocks end, the back-off grows
    const ApiResponse answer = served.call("GET", "/v1/teams", "wrong-" + std::to_string(attempt), "", guesser);
    if (answer.status == 401) ++unauthorized;
    if (answer.status == 429) {
      ++throttled;
      EXPECT_EQ(answer.headers.count("Retry-After"), 1u);
      EXPECT_NE(answer.body["reason"].get<std::string>().find("too many failed authentications from this address"),
                std::string::npos)
          << answer.body.dump();
    }
    if (attempt % 10 == 0) {  // the trainer on the same address, meanwhile
      const ApiResponse heartbeat = served.call("POST", beat, "alice-token", "{}", guesser);
      ++trainer_calls;
      if (heartbeat.status == 200 && heartbeat.body["state"] == "granted") ++trainer_served;
    }
    if (attempt % 100 == 0) {
      const ApiResponse another =
          served.call("POST", "/v1/leases", "alice-token", R"({"model":"yolov8s","shared":true})", guesser);
      ++trainer_calls;
      if (another.status == 201 || another.status == 202) ++trainer_served;
    }
  }
  EXPECT_EQ(unauthorized + throttled, 500);
  // the free failures, then one per block that ran out (ten clock steps)
  EXPECT_LE(unauthorized, 20 + 10) << "distinct wrong tokens were not slowed";
  EXPECT_GE(throttled, 470);
  EXPECT_EQ(trainer_served, trainer_calls) << "a valid token on the guessing address was refused";
  // another address: a wrong token gets its 401, a valid one is served
  const ApiResponse elsewhere = served.call("GET", "/v1/teams", "wrong-0", "", "198.51.100.8");
  EXPECT_EQ(elsewhere.status, 401) << elsewhere.body.dump();
  EXPECT_EQ(served.call("GET", "/v1/teams", "bob-token", "", "198.51.100.8").status, 200);
  // still blocked here, for wrong tokens only
  EXPECT_EQ(served.call("GET", "/v1/teams", "wrong-500", "", guesser).status, 429);
  EXPECT_EQ(served.call("GET", "/v1/teams", "alice-token", "", guesser).status, 200);
}

// A NUL byte in a justification cut the audit text while the lease kept the rest.
TEST(QuotaChaos, ControlCharactersInFreeTextAreRefusedNamingTheField) {
  Served served;
  ApiResponse answer =
      served.call("POST", "/v1/leases", "bob-token", R"({"model":"yolov8x","justification":"needed\u0000 rm -rf"})");
  EXPECT_EQ(answer.status, 400);
  EXPECT_EQ(answer.body["reason"].get<std::string>().rfind("justification: contains the control character 0x00", 0), 0u)
      << answer.body.dump();
  answer = served.call("POST", "/v1/leases", "bob-token", R"({"model":"yolov8s","job":"a\u001b[31mred"})");
  EXPECT_EQ(answer.status, 400);
  EXPECT_EQ(answer.body["reason"].get<std::string>().rfind("job: ", 0), 0u) << answer.body.dump();
  // line feeds stay allowed in free text
  answer = served.call("POST", "/v1/leases", "bob-token", R"({"model":"yolov8x","justification":"line 1\nline 2"})");
  ASSERT_EQ(answer.status, 403);
  const ApiResponse note = served.call("POST", "/v1/approvals/1/approve", "carol-token", R"({"note":"ok\u0000"})");
  EXPECT_EQ(note.status, 400);
  EXPECT_EQ(note.body["reason"].get<std::string>().rfind("note: ", 0), 0u) << note.body.dump();
}

// POST /metrics and POST /healthz answered 200 (the service's routes; the pages are the
// HTTP server's and covered on loopback).
TEST(QuotaChaos, ReadOnlyRoutesAnswer405WithAllow) {
  Served served;
  for (const auto& [method, path, allow] :
       std::vector<std::tuple<std::string, std::string, std::string>>{{"POST", "/healthz", "GET"},
                                                                      {"DELETE", "/v1/leases/1", "GET"},
                                                                      {"PUT", "/v1/leases", "GET, POST"},
                                                                      {"POST", "/v1/teams", "GET"},
                                                                      {"GET", "/v1/leases/1/heartbeat", "POST"},
                                                                      {"POST", "/v1/audit", "GET"}}) {
    const ApiResponse answer = served.call(method, path, "alice-token");
    EXPECT_EQ(answer.status, 405) << method << " " << path;
    EXPECT_EQ(answer.headers.count("Allow") ? answer.headers.at("Allow") : "", allow) << method << " " << path;
  }
  EXPECT_EQ(served.call("GET", "/healthz", "").status, 200);
  EXPECT_EQ(served.call("GET", "/v1/nothing", "alice-token").status, 404);
}

// One member queued 1,200 requests.
TEST(QuotaChaos, APerUserCapOnQueuedRequestsAnswers429) {
  Policy policy = testing::example_policy();
  policy.max_queued_per_user = 3;
  Served served(policy);
  // alice fills team-cv's base so her next requests queue
  for (int i = 0; i < 8; ++i) ASSERT_EQ(served.call("POST", "/v1/leases", "alice-token", "{}").status, 201);
  *served.clock.now += 4 * kHour;  // outside the burst window
  for (int i = 0; i < 3; ++i) ASSERT_EQ(served.call("POST", "/v1/leases", "alice-token", "{}").status, 202);
  const ApiResponse capped = served.call("POST", "/v1/leases", "alice-token", "{}");
  EXPECT_EQ(capped.status, 429) << capped.body.dump();
  EXPECT_EQ(capped.body["status"], "too_many_queued");
  EXPECT_EQ(served.call("POST", "/v1/leases", "bob-token", "{}").status, 202) << "the cap is per user";
}

// ---- the HTTP front on loopback ----

std::string ttl_policy(int ttl_s, int interval_s, int grace_s) {
  return R"(
inventory:
  nodes: [{name: box, gpus: 2, memory_gib: 24}]
emergency_pool: 0
users:
  alice: {token_sha256: 9c220f200955d76c0a38d308225e0ef10c5f971acaf2f8d1d8f732affa5bd1dc}
teams:
  t: {base: 2, burst: 2, members: [alice]}
credits: {monthly_gpu_hours: 0}
leases: {ttl_s: )" +
         std::to_string(ttl_s) + ", heartbeat_interval_s: " + std::to_string(interval_s) +
         ", expiry_grace_s: " + std::to_string(grace_s) + "}\n";
}

std::string short_ttl_policy() { return ttl_policy(3, 1, 1); }

// What the server answered on `fd` (the status line), waiting at most `timeout_ms`.
std::string status_line(int fd, int timeout_ms) {
  timeval timeout{timeout_ms / 1000, (timeout_ms % 1000) * 1000};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  std::string text;
  char chunk[512];
  while (text.find("\r\n") == std::string::npos) {
    const ssize_t n = ::recv(fd, chunk, sizeof(chunk), 0);
    if (n <= 0) break;
    text.append(chunk, static_cast<size_t>(n));
  }
  return text.substr(0, text.find("\r\n"));
}

int64_t resident_kib() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6));
  }
  return 0;
}

// 80 sockets each sending a byte every few seconds starved /healthz and the heartbeats
// for ~24 s and a healthy lease expired. Here: 80 drips (from another loopback address, so the per-address
// limit is not what saves us) against a lease with a 3 s TTL that heartbeats every second.
TEST(QuotaChaos, SlowDripConnectionsStarveNeitherHeartbeatsNorHealthz) {
  QuotaService service(load_policy_from_string(short_ttl_policy(), "short.yaml"), ServiceOptions{});
  ServerOptions options;
  options.threads = 8;
  options.max_connections_per_client = 200;
  QuotaServer server(service, options);
  const int port = server.start();
  httplib::Client client("127.0.0.1", port);
  client.set_read_timeout(5, 0);
  const httplib::Headers auth{{"Authorization", "Bearer alice-token"}};
  auto granted = client.Post("/v1/leases", auth, "{}", "application/json");
  ASSERT_TRUE(granted);
  ASSERT_EQ(granted->status, 201);
  const int64_t id = json::parse(granted->body)["lease_id"].get<int64_t>();

  std::vector<int> drips;
  for (int i = 0; i < 80; ++i) {
    const int fd = connect_from("127.0.0.2", port);
    ASSERT_GE(fd, 0);
    drips.push_back(fd);
  }
  std::atomic<bool> dripping{true};
  std::thread dripper([&] {
    const std::string request = "POST /v1/leases HTTP/1.1\r\nHost: x\r\n";
    for (size_t byte = 0; dripping && byte < request.size(); ++byte) {
      for (int fd : drips) ::send(fd, &request[byte], 1, MSG_NOSIGNAL);
      for (int wait = 0; wait < 10 && dripping; ++wait) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
  std::vector<double> health_ms;
  int beats_ok = 0;
  const auto start = Steady::now();
  while (ms_since(start) < 8000) {  // beyond twice the TTL and past the gate's 5 s request deadline
    const auto beat_start = Steady::now();
    auto beat =
        client.Post(("/v1/leases/" + std::to_string(id) + "/heartbeat").c_str(), auth, "{}", "application/json");
    if (beat && beat->status == 200 && json::parse(beat->body)["state"] == "granted") ++beats_ok;
    const auto health_start = Steady::now();
    auto health = client.Get("/healthz");
    health_ms.push_back(ms_since(health_start));
    EXPECT_TRUE(health && health->status == 200);
    std::this_thread::sleep_for(std::chrono::milliseconds(std::max(0, 1000 - static_cast<int>(ms_since(beat_start)))));
  }
  dripping = false;
  dripper.join();
  // the drips got 408 once their deadline passed
  int timed_out = 0;
  for (int fd : drips) {
    if (status_line(fd, 500).rfind("HTTP/1.1 408", 0) == 0) ++timed_out;
    ::close(fd);
  }
  std::sort(health_ms.begin(), health_ms.end());
  EXPECT_GE(beats_ok, 7) << "heartbeats failed while the drips were open";
  EXPECT_LT(health_ms.back(), 250) << "slowest /healthz";
  EXPECT_EQ(timed_out, 80);
  service.inspect([&](const Engine& engine) { EXPECT_EQ(engine.find(id)->state, LeaseState::kGranted); });
  server.stop();
}

// Four 40 MB header blocks (or 400,000 headers) were answered 200 and resident memory
// grew from 12 MB to 762 MB for good.
TEST(QuotaChaos, HugeOrManyHeadersGet431AndMemoryStaysBounded) {
  QuotaService service(load_policy_from_string(short_ttl_policy(), "short.yaml"), ServiceOptions{});
  QuotaServer server(service, ServerOptions{});
  const int port = server.start();
  const int64_t before_kib = resident_kib();
  for (int attempt = 0; attempt < 4; ++attempt) {
    const int fd = connect_from("127.0.0.1", port);
    ASSERT_GE(fd, 0);
    std::thread sender([fd] {
      const std::string line = "X-Filler: " + std::string(1000, 'a') + "\r\n";
      std::string block = "GET /healthz HTTP/1.1\r\nHost: x\r\n";
      while (block.size() < (1u << 20)) block += line;
      for (int megabyte = 0; megabyte < 40; ++megabyte) {
        if (::send(fd, block.data(), block.size(), MSG_NOSIGNAL) < 0) break;  // the server stopped reading
        block = line + line;
        while (block.size() < (1u << 20)) block += line;
      }
    });
    EXPECT_EQ(status_line(fd, 3000).rfind("HTTP/1.1 431", 0), 0u);
    ::shutdown(fd, SHUT_RDWR);
    sender.join();
    ::close(fd);
  }
  // many small headers: under the byte cap, over the count cap
  const int fd = connect_from("127.0.0.1", port);
  std::string many = "GET /healthz HTTP/1.1\r\nHost: x\r\n";
  for (int i = 0; i < 100; ++i) many += "X-" + std::to_string(i) + ": 1\r\n";
  many += "\r\n";
  ASSERT_GT(::send(fd, many.data(), many.size(), MSG_NOSIGNAL), 0);
  EXPECT_EQ(status_line(fd, 3000).rfind("HTTP/1.1 431", 0), 0u);
  ::close(fd);
  EXPECT_LT(resident_kib() - before_kib, 32 * 1024) << "resident memory grew by more than 32 MiB";
  httplib::Client client("127.0.0.1", port);
  auto health = client.Get("/healthz");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  server.stop();
}

// Per-address connection limit, and 405 from the read-only pages for every other method.
TEST(QuotaChaos, PerClientConnectionLimitAnd405OnReadOnlyPages) {
  QuotaService service(load_policy_from_string(short_ttl_policy(), "short.yaml"), ServiceOptions{});
  ServerOptions options;
  options.max_connections_per_client = 8;
  QuotaServer server(service, options);
  const int port = server.start();
  std::vector<int> idle;
  for (int i = 0; i < 8; ++i) idle.push_back(connect_from("127.0.0.3", port));
  // the ninth: the oldest idle connection of the address gets 429 and closes, the newcomer is served
  const int extra = connect_from("127.0.0.3", port);
  EXPECT_EQ(status_line(idle.front(), 2000).rfind("HTTP/1.1 429", 0), 0u);
  const std::string health_request = "GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  ASSERT_GT(::send(extra, health_request.data(), health_request.size(), MSG_NOSIGNAL), 0);
  EXPECT_EQ(status_line(extra, 2000).rfind("HTTP/1.1 200", 0), 0u);
  ::close(extra);
  httplib::Client other("127.0.0.1", port);  // another address is served
  auto health = other.Get("/healthz");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  for (int fd : idle) ::close(fd);
  for (const char* path : {"/metrics", "/", "/status", "/healthz"}) {
    for (const char* method : {"POST", "PUT", "DELETE"}) {
      auto answer = other.send([&] {
        httplib::Request request;
        request.method = method;
        request.path = path;
        return request;
      }());
      ASSERT_TRUE(answer) << method << " " << path;
      EXPECT_EQ(answer->status, 405) << method << " " << path;
      EXPECT_EQ(answer->get_header_value("Allow"), "GET") << method << " " << path;
    }
  }
  server.stop();
}

// A connection that presented a valid token no longer counts against its address's cap,
// so idle sockets from the same address cannot push it out; the idle ones make room among themselves.
TEST(QuotaChaos, AnAuthenticatedConnectionIsNeverEvictedForIdleSocketsFromItsAddress) {
  QuotaService service(load_policy_from_string(short_ttl_policy(), "short.yaml"), ServiceOptions{});
  ServerOptions options;
  options.max_connections_per_client = 2;
  QuotaServer server(service, options);
  const int port = server.start();
  // everything the server sent on `fd` within `timeout_ms`
  auto drain = [](int fd, int timeout_ms) {
    timeval timeout{timeout_ms / 1000, (timeout_ms % 1000) * 1000};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
    std::string text;
    char chunk[4096];
    for (ssize_t n; (n = ::recv(fd, chunk, sizeof(chunk), 0)) > 0;) text.append(chunk, static_cast<size_t>(n));
    return text;
  };
  const std::string teams = "GET /v1/teams HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer alice-token\r\n\r\n";
  const int trainer = connect_from("127.0.0.5", port);
  ASSERT_GT(::send(trainer, teams.data(), teams.size(), MSG_NOSIGNAL), 0);
  EXPECT_EQ(drain(trainer, 300).rfind("HTTP/1.1 200", 0), 0u);
  std::vector<int> idle;
  for (int i = 0; i < 5; ++i) idle.push_back(connect_from("127.0.0.5", port));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  int evicted = 0;
  for (int fd : idle) {
    char head[12] = {0};
    if (::recv(fd, head, sizeof(head), MSG_DONTWAIT | MSG_PEEK) == 12 && std::string(head, 12) == "HTTP/1.1 429") {
      ++evicted;
    }
  }
  EXPECT_EQ(evicted, 3) << "five idle sockets under a cap of two";
  // the trainer's kept-alive connection is still served
  ASSERT_GT(::send(trainer, teams.data(), teams.size(), MSG_NOSIGNAL), 0);
  EXPECT_EQ(drain(trainer, 300).rfind("HTTP/1.1 200", 0), 0u);
  ::close(trainer);
  for (int fd : idle) ::close(fd);
  server.stop();
}

// When every unauthenticated connection of an address has an answer in flight (clients that
// pipeline and never read), none is idle to make room. Before, the newcomer was refused at once, before it could
// show its token: a trainer behind the proxy was locked out. Now it is admitted on probation: served with a valid
// token, 429 without one.
TEST(QuotaChaos, ANewcomerWithAValidTokenIsServedWhenTheAddressIsFullOfStuckAnswers) {
  QuotaService service(load_policy_from_string(short_ttl_policy(), "short.yaml"), ServiceOptions{});
  ServerOptions options;
  options.max_connections_per_client = 2;
  QuotaServer server(service, options);
  const int port = server.start();
  std::string requests;
  for (int i = 0; i < 900; ++i) requests += "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";  // large answers
  std::vector<int> stuck;
  for (int i = 0; i < 2; ++i) {
    const int fd = connect_from("127.0.0.6", port);
    const int small = 1024;  // the answers back up at once
    ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
    const timeval timeout{0, 300000};
    ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof(timeout));
    stuck.push_back(fd);
  }
  // pipeline whole requests, never read, until quotad stops reading them: its answers are stuck in the socket
  std::vector<size_t> sent(stuck.size(), 0);
  for (bool progressed = true; progressed;) {
    progressed = false;
    for (size_t i = 0; i < stuck.size(); ++i) {
      const ssize_t n = ::send(stuck[i], requests.data() + sent[i], requests.size() - sent[i], MSG_NOSIGNAL);
      if (n > 0) sent[i] += static_cast<size_t>(n);
      progressed = progressed || (n > 0 && sent[i] < requests.size());
    }
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // quotad answers until the sockets are full
  auto ask = [&](const std::string& token) {
    const int fd = connect_from("127.0.0.6", port);
    const std::string request = "GET /v1/teams HTTP/1.1\r\nHost: x\r\n" +
                                (token.empty() ? "" : "Authorization: Bearer " + token + "\r\n") +
                                "Connection: close\r\n\r\n";
    ::send(fd, request.data(), request.size(), MSG_NOSIGNAL);
    const std::string line = status_line(fd, 2000);
    ::close(fd);
    return line;
  };
  EXPECT_EQ(ask("").rfind("HTTP/1.1 429", 0), 0u) << "no idle connection made room: the address is full";
  EXPECT_EQ(ask("alice-token").rfind("HTTP/1.1 200", 0), 0u) << "a valid token on a full address";
  EXPECT_EQ(ask("alice-token").rfind("HTTP/1.1 200", 0), 0u);
  for (int fd : stuck) ::close(fd);
  server.stop();
}

// A trainer on 127.0.0.1 that holds a lease of `policy` and heartbeats it every second for `run_ms`, each
// heartbeat on a new connection (as through a proxy that does not pool); what it saw.
struct TrainerRun {
  int beats = 0, ok = 0, throttled = 0, refused = 0;
  double worst_ms = 0;
  bool granted_at_end = false;
};

template <typename Attack>
TrainerRun heartbeat_under(const std::string& policy, ServerOptions options, int run_ms, Attack attack) {
  QuotaService service(load_policy_from_string(policy, "ttl.yaml"), ServiceOptions{});
  QuotaServer server(service, options);
  const int port = server.start();
  const httplib::Headers auth{{"Authorization", "Bearer alice-token"}};
  int64_t id = 0;
  {
    httplib::Client client("127.0.0.1", port);
    auto granted = client.Post("/v1/leases", auth, "{}", "application/json");
    EXPECT_TRUE(granted && granted->status == 201);
    if (!granted || granted->status != 201) return {};
    id = json::parse(granted->body)["lease_id"].get<int64_t>();
  }
  std::atomic<bool> attacking{true};
  std::thread attacker([&] { attack(port, attacking); });
  TrainerRun run;
  const auto start = Steady::now();
  while (ms_since(start) < run_ms) {
    const auto beat_start = Steady::now();
    httplib::Client client("127.0.0.1", port);
    client.set_connection_timeout(5, 0);
    client.set_read_timeout(5, 0);
    auto beat =
        client.Post(("/v1/leases/" + std::to_string(id) + "/heartbeat").c_str(), auth, "{}", "application/json");
    run.worst_ms = std::max(run.worst_ms, ms_since(beat_start));
    ++run.beats;
    if (!beat) {
      ++run.refused;
    } else if (beat->status == 429) {
      ++run.throttled;
    } else if (beat->status == 200 && json::parse(beat->body)["state"] == "granted") {
      ++run.ok;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(std::max(0, 1000 - static_cast<int>(ms_since(beat_start)))));
  }
  attacking = false;
  attacker.join();
  service.inspect([&](const Engine& engine) {
    run.granted_at_end = engine.find(id) != nullptr && engine.find(id)->state == LeaseState::kGranted;
  });
  server.stop();
  return run;
}

// 100 wrong tokens a second from the address the trainers share. Before: the address was
// blocked after 5 failures (growing to 60 s), every heartbeat got 429 and the 6 s-TTL lease expired.
TEST(QuotaChaos, WrongTokensFromTheTrainersOwnAddressNeverThrottleTheTrainer) {
  std::atomic<int> attacker_throttled{0};
  const TrainerRun run =
      heartbeat_under(ttl_policy(6, 2, 0), ServerOptions{}, 10000, [&](int port, std::atomic<bool>& attacking) {
        httplib::Client client("127.0.0.1", port);
        const httplib::Headers wrong{{"Authorization", "Bearer not-alice"}};
        for (int i = 0; attacking; ++i) {
          const auto sent = Steady::now();
          auto answer = client.Post("/v1/leases/1/heartbeat", wrong, "{}", "application/json");
          if (answer && answer->status == 429) ++attacker_throttled;
          std::this_thread::sleep_for(std::chrono::milliseconds(std::max(0, 10 - static_cast<int>(ms_since(sent)))));
        }
      });
  EXPECT_GE(run.beats, 9);
  EXPECT_EQ(run.throttled, 0) << "a valid token got 429";
  EXPECT_EQ(run.ok, run.beats);
  EXPECT_TRUE(run.granted_at_end) << "the lease expired";
  EXPECT_GT(attacker_throttled.load(), 500) << "the wrong token was not throttled";
}

// Over HTTP: a different wrong token every 10 ms from the trainers' address gets 429s, while the trainer's
// heartbeats from there are all answered and its lease stays granted.
TEST(QuotaChaos, DistinctWrongTokensFromTheTrainersOwnAddressNeverThrottleTheTrainer) {
  std::atomic<int> attacker_throttled{0}, attacker_unauthorized{0};
  const TrainerRun run =
      heartbeat_under(ttl_policy(6, 2, 0), ServerOptions{}, 6000, [&](int port, std::atomic<bool>& attacking) {
        httplib::Client client("127.0.0.1", port);
        for (int i = 0; attacking; ++i) {
          const auto sent = Steady::now();
          const httplib::Headers wrong{{"Authorization", "Bearer not-alice-" + std::to_string(i)}};
          auto answer = client.Post("/v1/leases/1/heartbeat", wrong, "{}", "application/json");
          if (answer && answer->status == 429) ++attacker_throttled;
          if (answer && answer->status == 401) ++attacker_unauthorized;
          std::this_thread::sleep_for(std::chrono::milliseconds(std::max(0, 10 - static_cast<int>(ms_since(sent)))));
        }
      });
  EXPECT_GE(run.beats, 5);
  EXPECT_EQ(run.throttled, 0) << "a valid token got 429";
  EXPECT_EQ(run.ok, run.beats);
  EXPECT_TRUE(run.granted_at_end) << "the lease expired";
  // 20 free failures, then one per back-off that ran out (250 ms doubling: a handful in 6 s)
  EXPECT_LE(attacker_unauthorized.load(), 30) << "distinct wrong tokens were not slowed";
  EXPECT_GT(attacker_throttled.load(), 200);
}

// 32 idle sockets from the trainers' address. Before: every further connection from it got
// 429, heartbeats included, and the lease expired. Here 40 idle sockets, reopened as soon as one is closed.
TEST(QuotaChaos, IdleSocketsFromTheTrainersAddressLeaveHeartbeatsAnswered) {
  std::atomic<int> evicted{0};
  const TrainerRun run =
      heartbeat_under(ttl_policy(6, 2, 0), ServerOptions{}, 10000, [&](int port, std::atomic<bool>& attacking) {
        std::vector<int> idle;
        for (int i = 0; i < 40; ++i) idle.push_back(connect_from("127.0.0.1", port));
        while (attacking) {
          std::this_thread::sleep_for(std::chrono::milliseconds(250));
          for (int& fd : idle) {
            char head[12] = {0};
            const ssize_t n = fd < 0 ? 0 : ::recv(fd, head, sizeof(head), MSG_DONTWAIT | MSG_PEEK);
            if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) continue;   // still open and silent
            if (n == 12 && std::string(head, 12) == "HTTP/1.1 429") ++evicted;  // made room for a newcomer
            if (fd >= 0) ::close(fd);
            fd = connect_from("127.0.0.1", port);
          }
        }
        for (int fd : idle) ::close(fd);
      });
  EXPECT_GE(run.beats, 9);
  EXPECT_EQ(run.throttled + run.refused, 0) << "a heartbeat was refused for the address's idle sockets";
  EXPECT_EQ(run.ok, run.beats);
  EXPECT_TRUE(run.granted_at_end) << "the lease expired";
  EXPECT_GT(evicted.load(), 0) << "the idle sockets were never capped";
}

// Clients that pipeline requests and never read their answers. Before (the request gate),
// each blocked write held a heartbeat worker for 10 s and a 6 s-TTL lease expired. Now libmicrohttpd writes
// without blocking and a worker only builds the answer: four such clients, on the fast lane's routes too,
// hold no worker.
TEST(QuotaChaos, FourSlowReadersPipeliningLoseNoLease) {
  ServerOptions options;
  options.fast_threads = 4;
  const TrainerRun run =
      heartbeat_under(ttl_policy(6, 2, 0), options, 10000, [&](int port, std::atomic<bool>& attacking) {
        std::vector<int> readers;
        std::string batch;
        for (int i = 0; i < 200; ++i) {
          batch += "GET /no/such/endpoint/" + std::string(200, 'x') + " HTTP/1.1\r\nHost: x\r\n\r\n";
          batch += "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n";
          batch += "POST /v1/leases/1/heartbeat HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}";
        }
        for (int i = 0; i < 4; ++i) {
          const int fd = connect_from("127.0.0.1", port);
          const int small = 1024;  // the answers back up at once
          ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
          readers.push_back(fd);
        }
        while (attacking) {  // keep the pipes full; never read
          for (int& fd : readers) {
            if (fd < 0) continue;
            const ssize_t sent = ::send(fd, batch.data(), batch.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
            if (sent < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {  // closed by the server: come back
              ::close(fd);
              fd = connect_from("127.0.0.1", port);
            }
          }
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
        }
        for (int fd : readers) ::close(fd);
      });
  EXPECT_GE(run.beats, 9);
  EXPECT_EQ(run.ok, run.beats);
  EXPECT_LT(run.worst_ms, 1000) << "slowest heartbeat";
  EXPECT_TRUE(run.granted_at_end) << "the lease expired";
}

// Team-interns (base 2) held all 17 non-pool GPUs through 68 shared leases while counting
// as 1.33 GPUs; team-cv stayed queued below its base and nothing was preempted.
TEST(QuotaChaos, SixtyEightSharedLeasesHoldNoMoreThanTheBaseAndEveryTeamReachesItsOwn) {
  FakeClock clock;
  clock.now->store(kMonday + 13 * kHour);  // outside every burst window
  ServiceOptions options;
  options.clock = clock.fn();
  QuotaService service(testing::example_policy(), options);
  int granted = 0;
  for (int i = 0; i < 68; ++i) {
    const ApiResponse r = service.handle(api_call(
        "POST", "/v1/leases", "ivan-token",
        R"({"model":"yolov8n","shared":true,"memory_gib":1.2,"idempotency_key":"flood-)" + std::to_string(i) + "\"}"));
    granted += r.status == 201;
  }
  EXPECT_EQ(granted, 8);  // 4 per GPU on the 2 GPUs of the base
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(service.handle(api_call("POST", "/v1/leases", "alice-token", R"({"model":"yolov8s"})")).status, 201);
  }
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(service.handle(api_call("POST", "/v1/leases", "erin-token", R"({"model":"yolov8s"})")).status, 201);
  }
  const json teams = service.handle(api_call("GET", "/v1/teams", "admin-token")).body["teams"];
  for (const json& team : teams) {
    EXPECT_LE(team["gpus_in_use"].get<double>(), team["base"].get<double>()) << team.dump();
    EXPECT_DOUBLE_EQ(team["gpus_in_use"].get<double>(), team["base"].get<double>()) << team.dump();
  }
  EXPECT_TRUE(service.check_invariants().empty());
}

// One member queued 1,200 requests; heartbeats took 7.9 s and 13.4 s and the status page
// 1.2 s (the queue position was recomputed by re-sorting for every row).
TEST(QuotaChaos, AQueueOfTwelveHundredKeepsHeartbeatsTicksAndTheStatusPageFast) {
  FakeClock clock;
  ServiceOptions options;
  options.clock = clock.fn();
  Policy policy = testing::example_policy();
  policy.max_queued_per_user = 2000;
  QuotaService service(policy, options);
  for (int i = 0; i < 6; ++i) {
    ASSERT_EQ(service.handle(api_call("POST", "/v1/leases", "erin-token", R"({"model":"yolov8s"})")).status, 201);
  }
  const auto flood_start = Steady::now();
  for (int i = 0; i < 1200; ++i) {
    ASSERT_EQ(service.handle(api_call("POST", "/v1/leases", "erin-token", R"({"model":"yolov8s"})")).status, 202);
  }
  const double flood_ms = ms_since(flood_start);
  double worst_heartbeat_ms = 0, worst_tick_ms = 0;
  for (int round = 0; round < 5; ++round) {
    *clock.now += 1000;
    auto start = Steady::now();
    EXPECT_EQ(service.handle(api_call("POST", "/v1/leases/1/heartbeat", "erin-token", "{}")).status, 200);
    worst_heartbeat_ms = std::max(worst_heartbeat_ms, ms_since(start));
    start = Steady::now();
    service.tick();
    worst_tick_ms = std::max(worst_tick_ms, ms_since(start));
  }
  auto start = Steady::now();
  const std::string page = render_status_page(service);
  const double page_ms = ms_since(start);
  const ApiResponse queue = service.handle(api_call("GET", "/v1/queue", "erin-token"));
  ASSERT_EQ(queue.body["queue"].size(), 1200u);
  EXPECT_EQ(queue.body["queue"][1199]["position"], 1200);
  std::printf(
      "[ figures  ] 1,200 queued: submitted in %.0f ms; worst heartbeat %.2f ms, worst tick %.1f ms, status "
      "page %.0f ms\n",
      flood_ms, worst_heartbeat_ms, worst_tick_ms, page_ms);
  // generous bounds for a loaded 2-core machine; the failures were seconds
  EXPECT_LT(worst_heartbeat_ms, 50);
  EXPECT_LT(worst_tick_ms, 500);
  EXPECT_LT(page_ms, 1000);
  EXPECT_NE(page.find("team-robotics uses 6.0 of the 6.0"), std::string::npos);
  EXPECT_NE(page.find("; fair share "), std::string::npos);  // the reason shows the fair-share standing
}

}  // namespace
}  // namespace yolo8::quota
