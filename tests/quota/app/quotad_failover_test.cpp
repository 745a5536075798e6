// Two `quotad serve` replicas on one throwaway PostgreSQL under load: the leader is killed (kill -9) at random
// moments while trainers acquire, heartbeat and release and leads decide loans and grant credits, and nothing
// acknowledged is lost; a leader cut from the database (its sessions terminated while it is paused) is fenced: a
// change sent to it after the other took over is refused and nothing of it lands.
#include <arpa/inet.h>
#include <httplib.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "quota/store/postgres_store.h"
#include "tests/quota/postgres_cluster.h"
#include "tests/quota/quota_test_util.h"
#include "tests/quota/quotad_process.h"

namespace yolo8::quota {
namespace {

using nlohmann::json;
using testing::PostgresCluster;
using testing::read_text;
using testing::test_dir;
using yolo8::test::run_quotad;
using Clock = std::chrono::steady_clock;

// A loopback port free now (the kernel's pick), for a replica that must restart on the same one.
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address));
  socklen_t size = sizeof(address);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &size);
  ::close(fd);
  return ntohs(address.sin_port);
}

// The example policy with room for as many loan applications and grants as the load makes.
std::string chaos_policy(const std::string& dir) {
  std::string text = read_text(testing::example_policy_path());
  const std::string credits = "credits: {monthly_gpu_hours: 100, loan_gpu_hours: 20}";
  const auto at = text.find(credits);
  if (at == std::string::npos) return "";
  text.replace(at, credits.size(),
               "credits: {monthly_gpu_hours: 100, loan_gpu_hours: 20, loan_applications_per_month: 100000, "
               "max_loan_gpu_hours_per_month: 1000000, max_grant_gpu_hours_per_quarter: 1000000}");
  const std::string table = "memory_table: memory-table.yaml";
  const auto table_at = text.find(table);
  if (table_at == std::string::npos) return "";
  text.replace(table_at, table.size(),
               "memory_table: " + std::string(yolo8::test::kSourceDir) + "/configs/memory-table.yaml");
  const std::string path = dir + "/failover_policy.yaml";
  std::ofstream(path) << text;
  return path;
}

struct Answer {
  int status = 0;  // 0: no replica answered before the deadline
  json body;
};

// One HTTP call to one replica; status 0 when it did not answer.
Answer call_once(int port, const std::string& method, const std::string& path, const std::string& token,
                 const std::string& body, const std::string& key = "") {
  httplib::Client client("127.0.0.1", port);
  client.set_connection_timeout(2);
  client.set_read_timeout(10);
  httplib::Headers headers;
  if (!token.empty()) headers.emplace("Authorization", "Bearer " + token);
  if (!key.empty()) headers.emplace("Idempotency-Key", key);
  const auto result =
      method == "GET" ? client.Get(path, headers) : client.Post(path, headers, body, "application/json");
  if (!result) return {};
  return {result->status, json::parse(result->body, nullptr, false)};
}

// What a client listing every replica does: a 503 or no answer moves it to the leader the 503 names (or the next
// replica), and the same call is repeated (with the same idempotency key) until a replica that leads answers.
class ReplicaClient {
 public:
  explicit ReplicaClient(std::vector<int> ports) : ports_(std::move(ports)) {}
  Answer call(const std::string& method, const std::string& path, const std::string& token,
              const std::string& body = "{}", const std::string& key = "") {
    const auto until = Clock::now() + std::chrono::seconds(40);
    size_t at = preferred_.load();
    while (Clock::now() < until) {
      Answer answer = call_once(ports_[at], method, path, token, body, key);
      if (answer.status != 0 && answer.status != 503) {
        preferred_ = at;
        return answer;
      }
      size_t next = (at + 1) % ports_.size();
      if (answer.status == 503 && answer.body.is_object() && answer.body.contains("leader")) {
        for (size_t i = 0; i < ports_.size(); ++i) {
          if (answer.body["leader"] == url(ports_[i])) next = i;
        }
      }
      at = next;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return {};
  }
  static std::string url(int port) { return "http://127.0.0.1:" + std::to_string(port); }

 private:
  std::vector<int> ports_;
  std::atomic<size_t> preferred_{0};
};

class Replica {
 public:
  Replica(std::string name, std::string policy, std::string db)
      : name_(std::move(name)), policy_(std::move(policy)), db_(std::move(db)), port_(free_port()) {}
  bool start() {
    process_ = std::make_unique<yolo8::test::QuotadProcess>("127.0.0.1:" + std::to_string(port_));
    return process_->start(policy_, db_, log(), {"--advertise", ReplicaClient::url(port_)});
  }
  void kill_hard() { process_->kill_hard(); }
  bool stop() { return process_->stop(); }
  pid_t pid() const { return process_->pid(); }
  int port() const { return port_; }
  std::string log() const { return test_dir() + "/failover_" + name_ + ".log"; }
  bool ready() const { return call_once(port_, "GET", "/readyz", "", "").status == 200; }

 private:
  std::string name_, policy_, db_;
  int port_;
  std::unique_ptr<yolo8::test::QuotadProcess> process_;
};

// Polls until `done` or `limit`; whether it came.
template <typename Done>
bool wait_for(Done done, std::chrono::seconds limit) {
  const auto until = Clock::now() + limit;
  while (Clock::now() < until) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return done();
}

// What clients were told: the last acknowledged state of each lease, loan and grant.
struct Acknowledged {
  std::mutex mutex;
  std::map<int64_t, std::string> leases;  // "granted" (heartbeating) or "released"
  std::map<int64_t, std::string> loans;   // "pending" or "approved"
  std::set<int64_t> grants;
  std::vector<std::string> failures;  // answers a client must never get
  void fail(const std::string& what) {
    std::lock_guard<std::mutex> lock(mutex);
    failures.push_back(what);
  }
};

int64_t lease_id_of(const json& body) {
  if (body.contains("lease") && body["lease"].contains("id")) return body["lease"]["id"].get<int64_t>();
  return body.value("lease_id", int64_t{0});
}

// A trainer: holds one or two leases, heartbeats them, now and then releases one and asks for another.
void trainer(ReplicaClient& client, const std::string& token, uint32_t seed, const std::atomic<bool>& stop,
             Acknowledged& acked) {
  std::mt19937 rng(seed);
  std::vector<int64_t> held;
  int asked = 0;
  while (!stop) {
    if (held.size() < 2 && (held.empty() || rng() % 4 == 0)) {
      const std::string key = token + "-" + std::to_string(seed) + "-" + std::to_string(++asked);
      const Answer answer =
          client.call("POST", "/v1/leases", token, R"({"model":"yolov8s","gpus":1,"shared":false})", key);
      if (answer.status == 201 || (answer.status == 200 && answer.body.value("status", "") == "granted")) {
        const int64_t id = lease_id_of(answer.body);
        held.push_back(id);
        std::lock_guard<std::mutex> lock(acked.mutex);
        acked.leases[id] = "granted";
      } else {
        acked.fail(token + " acquire " + key + ": " + std::to_string(answer.status) + " " + answer.body.dump());
      }
    } else if (rng() % 8 == 0) {
      const int64_t id = held[rng() % held.size()];
      const Answer answer =
          client.call("POST", "/v1/leases/" + std::to_string(id) + "/release", token, R"({"outcome":"completed"})");
      if (answer.status == 200) {
        held.erase(std::find(held.begin(), held.end(), id));
        std::lock_guard<std::mutex> lock(acked.mutex);
        acked.leases[id] = "released";
      } else {
        acked.fail(token + " release " + std::to_string(id) + ": " + std::to_string(answer.status));
      }
    } else {
      for (const int64_t id : held) {
        const Answer answer = client.call("POST", "/v1/leases/" + std::to_string(id) + "/heartbeat", token,
                                          R"({"step":1,"gpu_util":0.9})");
        if (answer.status != 200 || answer.body.value("state", "") != "granted") {
          acked.fail(token + " heartbeat " + std::to_string(id) + ": " + std::to_string(answer.status) + " " +
                     answer.body.dump());
        }
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100 + rng() % 200));
  }
}

// Members apply for loans, their lead approves them and grants contribution credits.
void ledger(ReplicaClient& client, uint32_t seed, const std::atomic<bool>& stop, Acknowledged& acked) {
  std::mt19937 rng(seed);
  const std::array<std::string, 2> members = {"alice", "bob"};
  std::vector<int64_t> pending;
  int applied = 0;
  while (!stop) {
    const std::string member = members[rng() % members.size()];
    const uint32_t pick = rng() % 3;
    if (pick == 0 || (pick == 1 && pending.empty())) {
      const std::string key = "loan-" + std::to_string(seed) + "-" + std::to_string(++applied);
      const Answer answer = client.call("POST", "/v1/loans", member + "-token",
                                        R"({"amount_gpu_hours":1,"justification":"failover load"})", key);
      if (answer.status == 201 || answer.status == 200) {
        const int64_t id = answer.body["id"].get<int64_t>();
        pending.push_back(id);
        std::lock_guard<std::mutex> lock(acked.mutex);
        acked.loans[id] = "pending";
      } else {
        acked.fail("loan " + key + ": " + std::to_string(answer.status) + " " + answer.body.dump());
      }
    } else if (pick == 1) {
      const int64_t id = pending.back();
      pending.pop_back();
      const std::string path = "/v1/loans/" + std::to_string(id);
      Answer answer = client.call("POST", path + "/approve", "carol-token", R"({"note":"ok"})");
      // a repeat of an approval the killed leader applied but did not answer: the loan says it
      if (answer.status == 409) answer = client.call("GET", path, "carol-token");
      if (answer.status == 200 && answer.body.value("state", "") == "approved") {
        std::lock_guard<std::mutex> lock(acked.mutex);
        acked.loans[id] = "approved";
      } else {
        acked.fail("approve " + std::to_string(id) + ": " + std::to_string(answer.status) + " " + answer.body.dump());
      }
    } else {
      const Answer answer =
          client.call("POST", "/v1/credits", "carol-token",
                      json{{"user", member}, {"amount_gpu_hours", 0.5}, {"reason", "labelling"}}.dump());
      if (answer.status == 201) {
        std::lock_guard<std::mutex> lock(acked.mutex);
        acked.grants.insert(answer.body["id"].get<int64_t>());
      } else {
        acked.fail("grant: " + std::to_string(answer.status) + " " + answer.body.dump());
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100 + rng() % 200));
  }
}

TEST(QuotadFailover, TheLeaderKilledAtRandomMomentsUnderLoadLosesNothingAcknowledged) {
  const std::string url = PostgresCluster::get().fresh_database("failover_chaos");
  const std::string dir = test_dir();
  const std::string policy = chaos_policy(dir);
  ASSERT_FALSE(policy.empty()) << "the example policy's credits or memory_table line changed";
  const uint32_t seed = std::random_device{}();
  std::printf("failover chaos seed: %u\n", seed);
  std::mt19937 rng(seed);

  std::array<std::unique_ptr<Replica>, 2> replicas = {std::make_unique<Replica>("a", policy, url),
                                                      std::make_unique<Replica>("b", policy, url)};
  ASSERT_TRUE(replicas[0]->start()) << read_text(replicas[0]->log());
  ASSERT_TRUE(wait_for([&] { return replicas[0]->ready(); }, std::chrono::seconds(20)))
      << read_text(replicas[0]->log());
  ASSERT_TRUE(replicas[1]->start()) << read_text(replicas[1]->log());
  ReplicaClient client({replicas[0]->port(), replicas[1]->port()});

  Acknowledged acked;
  std::atomic<bool> stop{false};
  std::vector<std::thread> load;
  const std::array<std::string, 4> trainers = {"alice-token", "bob-token", "erin-token", "ivan-token"};
  for (size_t i = 0; i < trainers.size(); ++i) {
    load.emplace_back(trainer, std::ref(client), trainers[i], seed + static_cast<uint32_t>(i), std::cref(stop),
                      std::ref(acked));
  }
  load.emplace_back(ledger, std::ref(client), seed + 100, std::cref(stop), std::ref(acked));

  constexpr int kRounds = 8;
  std::vector<long long> takeovers_ms;
  size_t leader = 0;
  for (int round = 0; round < kRounds; ++round) {
    std::this_thread::sleep_for(std::chrono::milliseconds(300 + rng() % 2500));
    replicas[leader]->kill_hard();
    const auto killed = Clock::now();
    const size_t next = 1 - leader;
    const bool took_over = wait_for([&] { return replicas[next]->ready(); }, std::chrono::seconds(30));
    const long long took = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - killed).count();
    std::printf("round %d: kill -9 of replica %zu, replica %zu ready after %lld ms\n", round, leader, next, took);
    ASSERT_TRUE(took_over) << read_text(replicas[next]->log());
    takeovers_ms.push_back(took);
    ASSERT_TRUE(replicas[leader]->start()) << read_text(replicas[leader]->log());
    EXPECT_EQ(call_once(replicas[leader]->port(), "GET", "/readyz", "", "").status, 503) << "restarted as a follower";
    leader = next;
  }
  std::this_thread::sleep_for(std::chrono::seconds(1));
  stop = true;
  for (std::thread& thread : load) thread.join();

  for (const long long took : takeovers_ms) EXPECT_LT(took, 15000);
  for (const std::string& failure : acked.failures) ADD_FAILURE() << "a client was answered " << failure;
  EXPECT_GE(acked.leases.size(), 4u) << "the load ran";

  // the final leader serves what every client was last told, or a later state
  const int port = replicas[leader]->port();
  ASSERT_TRUE(replicas[leader]->ready());
  for (const auto& [id, state] : acked.leases) {
    const Answer lease = call_once(port, "GET", "/v1/leases/" + std::to_string(id), "admin-token", "");
    ASSERT_EQ(lease.status, 200) << "lease " << id << " lost";
    const std::string now = lease.body.value("state", "");
    if (state == "granted") {
      EXPECT_EQ(now, "granted") << "lease " << id << ", heartbeating until the end, was lost: " << lease.body.dump();
    } else {
      EXPECT_TRUE(now != "granted" && now != "revoking" && now != "queued")
          << "lease " << id << " was released: " << lease.body.dump();
    }
  }
  for (const auto& [id, state] : acked.loans) {
    const Answer loan = call_once(port, "GET", "/v1/loans/" + std::to_string(id), "admin-token", "");
    ASSERT_EQ(loan.status, 200) << "loan " << id << " lost";
    const std::string now = loan.body.value("state", "");
    EXPECT_TRUE(now == "approved" || (state == "pending" && now == "pending")) << loan.body.dump();
  }
  const Answer grants = call_once(port, "GET", "/v1/credits", "admin-token", "");
  ASSERT_EQ(grants.status, 200);
  std::set<int64_t> served;
  for (const json& grant : grants.body["grants"]) served.insert(grant["id"].get<int64_t>());
  for (const int64_t id : acked.grants) EXPECT_EQ(served.count(id), 1u) << "grant " << id << " lost";

  // no GPU held by two running leases (the leases asked for whole GPUs)
  const Answer running = call_once(port, "GET", "/v1/leases", "admin-token", "");
  ASSERT_EQ(running.status, 200);
  std::set<int> devices;
  for (const json& lease : running.body["leases"]) {
    if (lease["state"] != "granted" && lease["state"] != "revoking") continue;
    for (const int device : lease["device_index"]) {
      EXPECT_TRUE(devices.insert(device).second) << "GPU " << device << " granted twice: " << running.body.dump();
    }
  }
  size_t heartbeating = 0;
  for (const auto& [id, state] : acked.leases) heartbeating += state == "granted" ? 1 : 0;
  EXPECT_EQ(devices.size(), heartbeating) << "no lease but those acknowledged holds a GPU: " << running.body.dump();
  // each takeover ran the invariant check of a start on the whole state
  EXPECT_EQ(PostgresCluster::query_text(url, "SELECT COUNT(*) FROM audit WHERE action = 'state.unsound'"), "0");
  EXPECT_EQ(PostgresCluster::query_text(url, "SELECT COUNT(*) FROM audit WHERE action = 'replica.lead'"),
            std::to_string(kRounds + 1));
  std::printf("acknowledged: %zu leases, %zu loans, %zu grants\n", acked.leases.size(), acked.loans.size(),
              acked.grants.size());

  for (auto& replica : replicas) EXPECT_TRUE(replica->stop());
  const std::string out = dir + "/failover_verify.out";
  EXPECT_EQ(run_quotad({"audit", "--verify", "--db", url}, out), 0) << read_text(out);
}

TEST(QuotadFailover, ALeaderCutFromTheDatabaseIsFencedAndReportsFollower) {
  const std::string url = PostgresCluster::get().fresh_database("failover_fenced");
  const std::string dir = test_dir();
  const std::string policy = testing::example_policy_path();
  Replica old_leader("fenced_a", policy, url);
  Replica next("fenced_b", policy, url);
  ASSERT_TRUE(old_leader.start()) << read_text(old_leader.log());
  ASSERT_TRUE(wait_for([&] { return old_leader.ready(); }, std::chrono::seconds(20)));
  ASSERT_TRUE(next.start()) << read_text(next.log());
  const Answer granted =
      call_once(old_leader.port(), "POST", "/v1/leases", "alice-token", R"({"model":"yolov8s","gpus":1})");
  ASSERT_EQ(granted.status, 201) << granted.body.dump();

  // paused (a long stall), so that its tick cannot notice the cut before the other takes over; then its sessions
  // end as in a network partition or at an administrator's hand
  ASSERT_EQ(::kill(old_leader.pid(), SIGSTOP), 0);
  PostgresCluster::execute(url,
                           "SELECT pg_terminate_backend(l.pid) FROM pg_locks l WHERE l.locktype = 'advisory' AND "
                           "l.granted AND l.objid = " +
                               std::to_string(kLeadershipLockKey & 0xffffffff) +
                               " AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())");
  PostgresCluster::execute(url,
                           "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database() "
                           "AND application_name = 'quotad' AND pid <> pg_backend_pid()");
  const auto cut = Clock::now();
  ASSERT_TRUE(wait_for([&] { return next.ready(); }, std::chrono::seconds(30))) << read_text(next.log());
  std::printf(
      "takeover after the leader's sessions ended: %lld ms\n",
      static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - cut).count()));
  const std::string leases_before = PostgresCluster::query_text(url, "SELECT COUNT(*) FROM leases");
  const std::string audit_before = PostgresCluster::query_text(url, "SELECT COUNT(*) FROM audit");
  // the change reaches it while it is still paused, so that it races its own tick: either its write is fenced or
  // its tick stepped down first; both answer 503 and write nothing
  Answer refused;
  std::thread change([&] {
    refused = call_once(old_leader.port(), "POST", "/v1/leases", "alice-token", R"({"model":"yolov8s","gpus":1})");
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_EQ(::kill(old_leader.pid(), SIGCONT), 0);
  change.join();
  EXPECT_EQ(refused.status, 503) << refused.body.dump();
  std::printf("the cut leader's answer to a new lease: %d %s\n", refused.status, refused.body.dump().c_str());
  const Answer beat = call_once(old_leader.port(), "POST", "/v1/leases/1/heartbeat", "alice-token", "{}");
  EXPECT_EQ(beat.status, 503) << beat.body.dump();
  EXPECT_EQ(PostgresCluster::query_text(url, "SELECT COUNT(*) FROM leases"), leases_before) << "nothing landed";
  Answer readyz;
  EXPECT_TRUE(wait_for(
      [&] {
        readyz = call_once(old_leader.port(), "GET", "/readyz", "", "");
        return readyz.status == 503 && readyz.body.value("role", "") == "follower";
      },
      std::chrono::seconds(15)))
      << readyz.status << " " << readyz.body.dump() << read_text(old_leader.log());
  EXPECT_EQ(readyz.body.value("leader", ""), ReplicaClient::url(next.port()));
  EXPECT_EQ(PostgresCluster::query_text(url, "SELECT COUNT(*) FROM leases"), leases_before) << "nothing landed";
  EXPECT_EQ(PostgresCluster::query_text(url, "SELECT COUNT(*) FROM audit"), audit_before) << "nothing audited";

  const Answer served = call_once(next.port(), "POST", "/v1/leases/1/heartbeat", "alice-token", "{}");
  EXPECT_EQ(served.status, 200) << served.body.dump();
  EXPECT_EQ(served.body.value("state", ""), "granted");
  EXPECT_TRUE(next.stop());
  EXPECT_TRUE(old_leader.stop());
}

}  // namespace
}  // namespace yolo8::quota
