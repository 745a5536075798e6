// Loopback tests: concurrent acquires, kill -9 of the quotad binary under load, hostile inputs, the client.
#include <arpa/inet.h>
#include <fcntl.h>
#include <httplib.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "quota/client/client.h"
#include "quota/client/transport.h"
#include "quota/core/codec.h"
#include "quota/server/http_server.h"
#include "test_paths.h"
#include "tests/quota/quotad_process.h"

namespace yolo8::quota {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

std::string temp_dir() {
  const std::string dir = std::string(yolo8::test::kBinaryDir) + "/quota_test_tmp/it_" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  return dir;
}

std::string write_file(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
  return path;
}

// 16 GPUs, two teams that may each burst to all of them, sharing on, no credits, no emergency pool.
std::string sixteen_gpu_policy(int min_runtime_s = 0,
                               const std::string& leases = "{ttl_s: 60, heartbeat_interval_s: 10, expiry_grace_s: 5}") {
  return R"(
inventory:
  nodes:
    - {name: n1, gpus: 8, memory_gib: 80}
    - {name: n2, gpus: 8, memory_gib: 80}
emergency_pool: 0
users:
  admin: {role: admin, token_sha256: 10a4c7c9fc5206d6f36dc6944a81bb6f4a3cb0e25014ae3b12e6c3e52712292a}
  alice: {token_sha256: 9c220f200955d76c0a38d308225e0ef10c5f971acaf2f8d1d8f732affa5bd1dc}
  bob: {token_sha256: 97dd3707015dcf069cf73022ed7173b1165db6eff24b441cb57fd069a8c4e525}
teams:
  ta: {base: 8, burst: 16, members: [alice]}
  tb: {base: 8, burst: 16, members: [bob]}
sharing: {enabled: true, max_leases_per_gpu: 4}
credits: {monthly_gpu_hours: 0}
leases: )" +
         leases + R"(
preemption: {min_runtime_s: )" +
         std::to_string(min_runtime_s) + R"(, grace_s: 30}
tiers: {self_service: [yolov8n, yolov8s], approval: [yolov8x]}
limits: {max_queued_per_user: 1000}  # the load tests queue ~100 requests per user on purpose
)";
}

httplib::Headers bearer(const std::string& token) { return {{"Authorization", "Bearer " + token}}; }

int post(httplib::Client& c, const std::string& path, const std::string& token, const std::string& body,
         json* out = nullptr) {
  auto r = c.Post(path.c_str(), bearer(token), body, "application/json");
  if (!r) return 0;
  if (out != nullptr) *out = json::parse(r->body, nullptr, false);
  return r->status;
}

int get(httplib::Client& c, const std::string& path, const std::string& token, json* out = nullptr) {
  auto r = c.Get(path.c_str(), bearer(token));
  if (!r) return 0;
  if (out != nullptr) *out = json::parse(r->body, nullptr, false);
  return r->status;
}

// Independent check from the API's own answers: per device, the memory of the leases holding it.
void expect_no_overcommit(const json& leases) {
  std::map<std::string, double> used;
  std::map<std::string, int> whole;
  std::map<std::string, int> count;
  for (const auto& l : leases) {
    const std::string st = l["state"];
    if (st != "granted" && st != "revoking") continue;
    for (const auto& d : l["devices"]) {
      const std::string dev = d;
      used[dev] += l["shared"].get<bool>() ? l["memory_gib"].get<double>() : 80.0;
      whole[dev] += l["shared"].get<bool>() ? 0 : 1;
      count[dev] += 1;
    }
  }
  for (const auto& [dev, gib] : used) {
    EXPECT_LE(gib, 80.0 + 1e-6) << dev;
    if (whole[dev] > 0) {
      EXPECT_EQ(count[dev], 1) << dev;
    }
  }
}

TEST(QuotaLoopback, TwoHundredConcurrentAcquiresNeverOverAllocate) {
  const std::string dir = temp_dir();
  const Policy policy = load_policy_from_string(sixteen_gpu_policy(), "sixteen.yaml");
  ServiceOptions so;
  so.db_path = dir + "/concurrent.db";
  for (const char* s : {"", "-wal", "-shm"}) std::filesystem::remove(so.db_path + s);
  QuotaService service(policy, so);
  ServerOptions server_options;
  server_options.max_connections_per_client = 256;  // 200 clients share the loopback address
  QuotaServer server(service, server_options);
  const int port = server.start();
  for (int round = 0; round < 3; ++round) {
    std::vector<std::thread> threads;
    std::atomic<int> granted{0}, queued{0}, other{0};
    for (int i = 0; i < 200; ++i) {
      threads.emplace_back([&, i] {
        httplib::Client c("127.0.0.1", port);
        c.set_read_timeout(20, 0);
        json body{{"job", "j" + std::to_string(i)}, {"model", "yolov8n"}};
        if (i % 3 == 0) {
          body["shared"] = true;
          body["memory_gib"] = 10 + (i % 5) * 7;
        } else {
          body["gpus"] = 1 + i % 3;
        }
        if (i % 7 == 0) body["priority"] = "high";
        if (i % 4 == 1) body["node"] = i % 8 == 1 ? "n1" : "n2";  // pinned where the trainer runs
        const int st = post(c, "/v1/leases", i % 2 ? "alice-token" : "bob-token", body.dump());
        (st == 201 ? granted : st == 202 ? queued : other)++;
      });
    }
    for (auto& t : threads) t.join();
    EXPECT_EQ(other, 0);
    EXPECT_GT(granted, 0);
    EXPECT_EQ(granted + queued, 200);
    const auto errors = service.check_invariants();
    EXPECT_TRUE(errors.empty()) << errors.front();
    httplib::Client admin("127.0.0.1", port);
    json all;
    ASSERT_EQ(get(admin, "/v1/leases", "admin-token", &all), 200);
    expect_no_overcommit(all["leases"]);
    // drain: release everything running until the queue is empty, checking after every wave
    for (int wave = 0; wave < 400; ++wave) {
      ASSERT_EQ(get(admin, "/v1/leases", "admin-token", &all), 200);
      if (all["leases"].empty()) break;
      expect_no_overcommit(all["leases"]);
      for (const auto& l : all["leases"]) {
        if (l["state"] == "granted" || l["state"] == "revoking") {
          post(admin, "/v1/leases/" + std::to_string(l["id"].get<int64_t>()) + "/release", "admin-token",
               R"({"outcome":"completed"})");
        } else if (l["state"] == "queued") {
          get(admin, "/v1/leases/" + std::to_string(l["id"].get<int64_t>()), "admin-token");
        }
      }
      const auto e = service.check_invariants();
      ASSERT_TRUE(e.empty()) << e.front();
    }
    ASSERT_TRUE(all["leases"].empty()) << "round " << round << ": the queue did not drain";
  }
  server.stop();
}

TEST(QuotaLoopback, KillMinusNineUnderLoadLosesNoLease) {
  const std::string dir = temp_dir();
  const std::string policy = write_file(dir + "/sixteen.yaml", sixteen_gpu_policy());
  const std::string db = dir + "/kill9.db";
  for (const char* s : {"", "-wal", "-shm"}) std::filesystem::remove(db + s);
  yolo8::test::QuotadProcess q;
  ASSERT_TRUE(q.start(policy, db, dir + "/quotad1.log")) << "quotad did not start; see " << dir << "/quotad1.log";
  std::mutex mu;
  std::map<int64_t, std::string> acknowledged;  // lease id -> the last state the server confirmed
  std::atomic<bool> stop{false};
  std::atomic<int> heartbeats{0};
  std::vector<std::thread> load;
  for (int t = 0; t < 6; ++t) {
    load.emplace_back([&, t] {
      httplib::Client c("127.0.0.1", q.port());
      c.set_connection_timeout(1, 0);
      c.set_read_timeout(2, 0);
      c.set_keep_alive(true);
      c.set_tcp_nodelay(true);
      const std::string token = t % 2 ? "alice-token" : "bob-token";
      int n = 0;
      while (!stop) {
        json r;
        json body{{"job", "load"}, {"model", "yolov8n"}, {"shared", true}, {"memory_gib", 8}};
        const int st = post(c, "/v1/leases", token, body.dump(), &r);
        if (st == 0) break;
        if (st != 201 && st != 202) continue;
        const int64_t id = r["lease_id"];
        {
          std::lock_guard<std::mutex> lk(mu);
          acknowledged[id] = r["status"];
        }
        for (int h = 0; h < 5 && st == 201; ++h) {
          if (post(c, "/v1/leases/" + std::to_string(id) + "/heartbeat", token, R"({"step":1})") == 200) ++heartbeats;
        }
        if (++n % 2 == 0) {
          json rel;
          if (post(c, "/v1/leases/" + std::to_string(id) + "/release", token, R"({"outcome":"completed"})", &rel) ==
              200) {
            std::lock_guard<std::mutex> lk(mu);
            acknowledged[id] = rel["state"];
          }
        }
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  q.kill_hard();  // mid-load
  stop = true;
  for (auto& t : load) t.join();
  ASSERT_GT(acknowledged.size(), 20u) << "too little load reached quotad";
  EXPECT_GT(heartbeats, 0);

  ASSERT_TRUE(q.start(policy, db, dir + "/quotad2.log")) << "quotad did not restart; see " << dir << "/quotad2.log";
  httplib::Client c("127.0.0.1", q.port());
  int granted = 0;
  for (const auto& [id, state] : acknowledged) {
    json l;
    ASSERT_EQ(get(c, "/v1/leases/" + std::to_string(id), "admin-token", &l), 200) << "lease " << id << " was lost";
    if (state == "released") {
      EXPECT_EQ(l["state"], "released") << "lease " << id;
    } else {
      // acknowledged as granted or queued: still there (a queued one may have been granted since)
      EXPECT_TRUE(l["state"] == "granted" || l["state"] == "queued" || l["state"] == "released")
          << "lease " << id << " is " << l["state"];
      granted += l["state"] == "granted";
    }
  }
  EXPECT_GT(granted, 0);
  json all;
  ASSERT_EQ(get(c, "/v1/leases", "admin-token", &all), 200);
  expect_no_overcommit(all["leases"]);
  // the admin verbs talk to the restarted server
  const std::string bin = std::string(yolo8::test::kBinaryDir) + "/quota/quotad";
  const std::string server_url = q.url();
  auto run = [](const std::string& cmd, int& status) {
    std::string out;
    FILE* p = popen(cmd.c_str(), "r");
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
    status = pclose(p);
    return out;
  };
  int status = 0;
  const std::string listed = run(bin + " leases --json --server " + server_url + " --token admin-token", status);
  EXPECT_EQ(status, 0);
  EXPECT_EQ(json::parse(listed, nullptr, false)["leases"].size(), all["leases"].size());
  const std::string denied = run(bin + " teams --server " + server_url + " --token nope 2>&1", status);
  EXPECT_NE(status, 0);
  EXPECT_NE(denied.find("HTTP 401"), std::string::npos) << denied;
  EXPECT_TRUE(q.stop());
  // the database alone satisfies every invariant
  ServiceOptions so;
  so.db_path = db;
  QuotaService reopened(load_policy(policy), so);
  const auto errors = reopened.check_invariants();
  EXPECT_TRUE(errors.empty()) << errors.front();
}

// quotad stopped (SIGSTOP) for 8 s, longer than the 6 s ttl. alice's trainer stops during the outage, bob's keeps
// training and heartbeats after it. The outage is credited (neither loses its lease to it), alice's lease ends
// billed to her last heartbeat plus one 2 s interval, bob's is billed the whole time: the usage ledger quotad
// stored says so.
TEST(QuotaLoopback, AnOutageBillsATrainerThatStoppedDuringItOnlyItsOwnUse) {
  const std::string dir = temp_dir();
  const std::string policy =
      write_file(dir + "/outage.yaml", sixteen_gpu_policy(0, "{ttl_s: 6, heartbeat_interval_s: 2, expiry_grace_s: 1}"));
  const std::string db = dir + "/outage.db";
  for (const char* s : {"", "-wal", "-shm"}) std::filesystem::remove(db + s);
  yolo8::test::QuotadProcess q;
  ASSERT_TRUE(q.start(policy, db, dir + "/outage.log")) << "quotad did not start; see " << dir << "/outage.log";
  httplib::Client c("127.0.0.1", q.port());
  c.set_read_timeout(2, 0);
  auto seconds_since = [](Clock::time_point from) {
    return std::chrono::duration<double>(Clock::now() - from).count();
  };
  auto sleep_s = [](double s) { std::this_thread::sleep_for(std::chrono::duration<double>(s)); };
  const auto asked = Clock::now();
  json a, b;
  ASSERT_EQ(post(c, "/v1/leases", "alice-token", R"({"job":"a","model":"yolov8n"})", &a), 201) << a.dump();
  ASSERT_EQ(post(c, "/v1/leases", "bob-token", R"({"job":"b","model":"yolov8n"})", &b), 201) << b.dump();
  const auto granted = Clock::now();
  const std::string alice = "/v1/leases/" + std::to_string(a["lease_id"].get<int64_t>());
  const std::string bob = "/v1/leases/" + std::to_string(b["lease_id"].get<int64_t>());
  for (int i = 0; i < 2; ++i) {
    sleep_s(2);
    ASSERT_EQ(post(c, alice + "/heartbeat", "alice-token", "{}"), 200);
    ASSERT_EQ(post(c, bob + "/heartbeat", "bob-token", "{}"), 200);
  }
  const double alice_used_s = seconds_since(asked);  // her trainer stops now
  ASSERT_EQ(::kill(q.pid(), SIGSTOP), 0);
  sleep_s(8);
  ASSERT_EQ(::kill(q.pid(), SIGCONT), 0);
  sleep_s(1.5);  // quotad's maintenance credits the outage first
  ASSERT_EQ(post(c, bob + "/heartbeat", "bob-token", "{}"), 200);
  json seen;
  ASSERT_EQ(get(c, alice, "alice-token", &seen), 200);
  EXPECT_EQ(seen["state"], "granted") << "quotad's outage was not credited";
  for (int i = 0; i < 4; ++i) {
    sleep_s(2);
    ASSERT_EQ(post(c, bob + "/heartbeat", "bob-token", "{}"), 200);
  }
  const double bob_used_s = seconds_since(granted);
  ASSERT_EQ(post(c, bob + "/release", "bob-token", R"({"outcome":"completed"})"), 200);
  ASSERT_EQ(get(c, alice, "alice-token", &seen), 200);
  EXPECT_EQ(seen["state"], "expired");
  EXPECT_TRUE(q.stop());
  ServiceOptions so;
  so.db_path = db;
  QuotaService reopened(load_policy(policy), so);
  std::map<std::string, double> billed_s;
  reopened.inspect([&](const Engine& e) {
    for (const auto& [key, hours] : e.usage()) billed_s[key.first] += hours * 3600;
  });
  EXPECT_LE(billed_s["alice"], alice_used_s + 2 + 0.01);  // her use plus at most one interval
  EXPECT_GE(billed_s["alice"], alice_used_s - 1);
  EXPECT_GE(billed_s["bob"], bob_used_s - 0.5);  // the outage included
  EXPECT_LE(billed_s["bob"], seconds_since(asked));
}

TEST(QuotaLoopback, HostileInputsGetTheRight4xxAndTheServerKeepsServing) {
  const Policy policy = load_policy_from_string(sixteen_gpu_policy(), "sixteen.yaml");
  QuotaService service(policy, ServiceOptions{});
  ServerOptions opts;
  opts.max_body_bytes = 16 * 1024;
  QuotaServer server(service, opts);
  const int port = server.start();
  httplib::Client c("127.0.0.1", port);
  json r;
  EXPECT_EQ(post(c, "/v1/leases", "", "{}", &r), 401);
  EXPECT_FALSE(r.value("reason", "").empty());
  EXPECT_EQ(post(c, "/v1/leases", "wrong-token", "{}", &r), 401);
  EXPECT_EQ(post(c, "/v1/leases", "alice-token", "{\"gpus\": ", &r), 400);
  EXPECT_EQ(post(c, "/v1/leases", "alice-token", R"({"team":"tb"})", &r), 403);
  EXPECT_EQ(get(c, "/v1/leases/424242", "alice-token", &r), 404);
  EXPECT_EQ(post(c, "/v1/leases", "alice-token", std::string(64 * 1024, 'x'), &r), 413);
  EXPECT_EQ(r.value("reason", ""), "body: larger than the server accepts");
  EXPECT_EQ(post(c, "/v1/leases", "alice-token", "\x01\x02\xff\xfe", &r), 400);
  // Parsing is as strict as documented: a byte-order mark, a key twice, an encoded NUL in the path.
  EXPECT_EQ(post(c, "/v1/leases", "alice-token", "\xEF\xBB\xBF{}", &r), 400);
  EXPECT_NE(r.value("reason", "").find("byte-order mark"), std::string::npos) << r;
  EXPECT_EQ(post(c, "/v1/leases", "alice-token", R"({"gpus": 1, "gpus": 8})", &r), 400);
  EXPECT_NE(r.value("reason", "").find("'gpus' appears twice"), std::string::npos) << r;
  EXPECT_EQ(get(c, "/v1/leases/1%00", "alice-token", &r), 400);  // libmicrohttpd alone would have read /v1/leases/1
  EXPECT_NE(r.value("reason", "").find("%00"), std::string::npos) << r;
  EXPECT_EQ(get(c, "/healthz%00x", "", &r), 400);
  // raw garbage on the socket
  for (int i = 0; i < 20; ++i) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(uint16_t(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    const std::string junk = i % 2 ? std::string("GARBAGE \r\n\r\n") : std::string(5000, static_cast<char>(i * 13));
    EXPECT_GT(send(fd, junk.data(), junk.size(), MSG_NOSIGNAL), 0);
    close(fd);
  }
  EXPECT_EQ(get(c, "/healthz", "", &r), 200);
  EXPECT_EQ(post(c, "/v1/leases", "alice-token", "{}", &r), 201);
  server.stop();
}

std::string two_gpu_policy() {
  return R"(
inventory:
  nodes: [{name: box, gpus: 2, memory_gib: 24}]
emergency_pool: 0
users:
  alice: {token_sha256: 9c220f200955d76c0a38d308225e0ef10c5f971acaf2f8d1d8f732affa5bd1dc}
  bob: {token_sha256: 97dd3707015dcf069cf73022ed7173b1165db6eff24b441cb57fd069a8c4e525}
  admin: {role: admin, token_sha256: 10a4c7c9fc5206d6f36dc6944a81bb6f4a3cb0e25014ae3b12e6c3e52712292a}
teams:
  t: {base: 2, burst: 2, members: [alice, bob]}
credits: {monthly_gpu_hours: 0}
leases: {ttl_s: 3, heartbeat_interval_s: 1, expiry_grace_s: 1}
preemption: {min_runtime_s: 0, grace_s: 10}
)";
}

TEST(QuotaLoopback, ClientIsRevokedReleasesAndTheWaiterStartsOnlyThen) {
  QuotaService service(load_policy_from_string(two_gpu_policy(), "two.yaml"), ServiceOptions{});
  QuotaServer server(service, ServerOptions{});
  const int port = server.start();
  const std::string url = "http://127.0.0.1:" + std::to_string(port);
  ClientConfig ca;
  ca.mode = url;
  ca.token = "alice-token";
  ca.poll_interval_s = 0.1;
  ClientConfig cb = ca;
  cb.token = "bob-token";
  auto pa = std::make_unique<QuotaClient>(ca);
  auto pb = std::make_unique<QuotaClient>(cb);
  QuotaClient& a = *pa;
  QuotaClient& b = *pb;
  LeaseRequest low;
  low.model = "yolov8n";
  low.gpus = 2;
  low.priority = Priority::kLow;
  const LeaseInfo la = a.acquire(low);
  EXPECT_EQ(la.devices.size(), 2u);
  a.start_heartbeats([] {
    Telemetry t;
    t.step = 7;
    return t;
  });
  std::atomic<bool> b_granted{false};
  std::vector<WaitInfo> waits;
  std::thread tb([&] {
    LeaseRequest high;
    high.model = "yolov8s";
    high.priority = Priority::kHigh;
    b.acquire(high, [&](const WaitInfo& w) { waits.push_back(w); });
    b_granted = true;
  });
  const auto until = Clock::now() + std::chrono::seconds(5);
  while (!a.revoked() && Clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_TRUE(a.revoked());
  EXPECT_GT(a.revoke_deadline_ms(), system_now_ms());
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_FALSE(b_granted) << "the waiter must not start before the victim releases";
  a.release(Outcome::kPreempted);
  tb.join();
  EXPECT_TRUE(b_granted);
  ASSERT_FALSE(waits.empty());
  EXPECT_EQ(waits.front().status, WaitStatus::kQueued);
  EXPECT_NE(waits.back().reason.find("preempted"), std::string::npos) << waits.back().reason;
  // the preempted job comes back for what is left
  low.gpus = 1;
  EXPECT_EQ(a.acquire(low).state, LeaseState::kGranted);
  EXPECT_TRUE(service.check_invariants().empty());
  a.release(Outcome::kCompleted);
  b.release(Outcome::kCompleted);
  pa.reset();  // closes the keep-alive connections so the server stops at once
  pb.reset();
  server.stop();
}

TEST(QuotaLoopback, SixtyTrainersHeartbeatThroughASmallWorkerPool) {
  const Policy policy = load_policy_from_string(
      sixteen_gpu_policy(0, "{ttl_s: 4, heartbeat_interval_s: 1, expiry_grace_s: 1}"), "p.yaml");
  QuotaService service(policy, ServiceOptions{});
  ServerOptions opts;
  opts.threads = 8;  // far fewer workers than trainers: connections must not pin them
  QuotaServer server(service, opts);
  const int port = server.start();
  std::vector<std::unique_ptr<QuotaClient>> clients;
  for (int i = 0; i < 60; ++i) {
    ClientConfig cfg;
    cfg.mode = "http://127.0.0.1:" + std::to_string(port);
    cfg.token = i % 2 ? "alice-token" : "bob-token";
    clients.push_back(std::make_unique<QuotaClient>(cfg));
    LeaseRequest r;
    r.job = "t" + std::to_string(i);
    r.shared = true;
    r.memory_gib = 10;
    ASSERT_EQ(clients.back()->acquire(r).state, LeaseState::kGranted);
    clients.back()->start_heartbeats();
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(3500));
  for (size_t i = 0; i < clients.size(); ++i) {
    EXPECT_FALSE(clients[i]->unreachable_too_long()) << "trainer " << i;
    EXPECT_FALSE(clients[i]->lost()) << "trainer " << i;
  }
  int granted = 0;
  service.inspect([&](const Engine& e) {
    for (const auto& [id, l] : e.leases()) granted += l.state == LeaseState::kGranted;
  });
  EXPECT_EQ(granted, 60);  // nobody expired
  for (auto& c : clients) c->release(Outcome::kCompleted);
  clients.clear();
  server.stop();
}

TEST(QuotaLoopback, ClientSelfFencesWhenQuotadIsUnreachable) {
  QuotaService service(load_policy_from_string(two_gpu_policy(), "two.yaml"), ServiceOptions{});
  auto server = std::make_unique<QuotaServer>(service, ServerOptions{});
  const int port = server->start();
  ClientConfig cfg;
  cfg.mode = "http://127.0.0.1:" + std::to_string(port);
  cfg.token = "alice-token";
  QuotaClient q(cfg);
  q.acquire(LeaseRequest{});
  q.start_heartbeats();
  std::this_thread::sleep_for(std::chrono::milliseconds(1200));
  EXPECT_FALSE(q.unreachable_too_long());
  const auto stopping = Clock::now();
  server->stop();
  const auto stopped = Clock::now();
  EXPECT_LT(stopped - stopping, std::chrono::milliseconds(2000)) << "the server should stop promptly";
  while (!q.unreachable_too_long() && Clock::now() - stopped < std::chrono::seconds(6)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_TRUE(q.unreachable_too_long());
  // ttl 3 s minus one 1 s interval: fenced about 2 s after the last good heartbeat, before the server's expiry
  EXPECT_LT(Clock::now() - stopped, std::chrono::milliseconds(3000));
  q.stop_heartbeats();
}

// TLS end to end. The test makes a CA and a server certificate for 127.0.0.1 (openssl CLI), runs the
// quotad binary with --tls-cert/--tls-key, and a client given quota=https://… and the CA file acquires,
// heartbeats and releases; a client without the CA, or speaking plain HTTP, gets nothing.
TEST(QuotaLoopback, HttpsWithTheCaFileAcquiresHeartbeatsAndReleasesAndWithoutItIsRefused) {
  const std::string dir = temp_dir() + "/tls";
  std::filesystem::create_directories(dir);
  const std::string make_certs =
      "cd '" + dir +
      "' && openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=yolo8-test-ca -keyout ca.key -out ca.pem "
      "&& openssl req -newkey rsa:2048 -nodes -subj /CN=quotad -keyout server.key -out server.csr "
      "&& printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\\n' > san.ext "
      "&& openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 -extfile san.ext "
      "-out server.pem) > '" +
      dir + "/openssl.log' 2>&1";
  ASSERT_EQ(std::system(("(" + make_certs).c_str()), 0) << dir << "/openssl.log";
  yolo8::test::QuotadProcess quotad;
  write_file(dir + "/policy.yaml", two_gpu_policy());
  ASSERT_TRUE(quotad.start(dir + "/policy.yaml", dir + "/quota.db", dir + "/quotad.log",
                           {"--tls-cert", dir + "/server.pem", "--tls-key", dir + "/server.key"}))
      << dir << "/quotad.log";
  const std::string url = "https://127.0.0.1:" + std::to_string(quotad.port());

  ClientConfig config = client_config_from_setting(url);
  config.token = "alice-token";
  config.ca_file = dir + "/ca.pem";
  QuotaClient client(config);
  LeaseRequest request;
  request.model = "yolov8n";
  const LeaseInfo lease = client.acquire(request);
  EXPECT_EQ(lease.state, LeaseState::kGranted);
  auto transport = make_http_transport(url, "alice-token", dir + "/ca.pem");
  ApiRequest beat;
  beat.method = "POST";
  beat.path = "/v1/leases/" + std::to_string(lease.id) + "/heartbeat";
  beat.body = R"({"step": 3})";
  const ApiResponse beaten = transport->call(beat);
  EXPECT_EQ(beaten.status, 200) << beaten.body.dump();
  EXPECT_EQ(beaten.body.value("state", ""), "granted");
  client.release(Outcome::kCompleted);
  ApiRequest get;
  get.method = "GET";
  get.path = "/v1/leases/" + std::to_string(lease.id);
  const ApiResponse ended = transport->call(get);
  EXPECT_EQ(ended.status, 200);
  EXPECT_EQ(ended.body.value("state", ""), "released") << ended.body.dump();
  EXPECT_EQ(ended.body.value("outcome", ""), "completed") << ended.body.dump();

  // without the CA the server's certificate is not trusted: nothing is sent
  const ApiResponse untrusted = make_http_transport(url, "alice-token")->call(get);
  EXPECT_EQ(untrusted.status, 0) << untrusted.body.dump();
  // plain HTTP to the TLS port gets no answer
  httplib::Client plain("127.0.0.1", quotad.port());
  plain.set_read_timeout(2, 0);
  auto answer = plain.Get("/healthz");
  EXPECT_TRUE(!answer || answer->status != 200);
  EXPECT_TRUE(quotad.stop());
}

}  // namespace
}  // namespace yolo8::quota
