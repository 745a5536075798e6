// Heartbeat load on loopback: heartbeats/s and latency percentiles of quotad's hot path, every scenario on both
// stores in one run, SQLite and PostgreSQL (a server given by --postgres, else a throwaway cluster of its own with
// fsync on). Compares batched heartbeat commits (quotad's default) against a commit per heartbeat, measures
// heartbeats while 200 slow-drip connections and a queue of 1,000 requests are present, and runs the batched
// scenario once more over HTTPS, with a CA and certificate the benchmark makes (openssl CLI).
#include <httplib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "quota/core/policy.h"
#include "quota/core/sha256.h"
#include "quota/server/http_server.h"
#include "quota/service/service.h"
#include "quota/store/state_store.h"
#include "tests/quota/loopback_util.h"
#include "tests/quota/postgres_cluster_core.h"

using namespace yolo8::quota;
using nlohmann::json;
using yolo8::quota::testing::connect_from;  // from 127.0.1.x: many addresses, so the per-address cap admits them all
using yolo8::quota::testing::PostgresCluster;
using Clock = std::chrono::steady_clock;

namespace {

// A department's trainers beating once a second: what every run on either backend must sustain, losing nothing.
constexpr int kDepartmentHeartbeatsPerS = 50;

// `ttl_s` 0: the policy's default lease TTL.
Policy bench_policy(int ttl_s = 0) {
  const std::string yaml =
      R"(
inventory:
  nodes:
    - {name: n1, gpus: 8, memory_gib: 80}
    - {name: n2, gpus: 8, memory_gib: 80}
emergency_pool: 0
users:
  bench: {token_sha256: )" +
      sha256_hex("bench-token") + R"(}
teams:
  t: {base: 16, burst: 16, members: [bench]}
sharing: {enabled: true, max_leases_per_gpu: 4}
credits: {monthly_gpu_hours: 0}
limits: {max_queued_per_user: 2000}
)" +
      (ttl_s > 0 ? "leases: {ttl_s: " + std::to_string(ttl_s) + ", heartbeat_interval_s: 1, expiry_grace_s: 0}\n"
                 : std::string());
  return load_policy_from_string(yaml, "bench-policy");
}

// Where a run's database goes: a SQLite file under `dir`, or a fresh schema of the PostgreSQL database `url`.
struct Backend {
  std::string name;  // "sqlite" or "postgresql", as the table and the JSON name it
  std::string dir;
  std::string url;

  // An empty database for the run `run_name`: its --db.
  std::string fresh(const std::string& run_name) const {
    if (url.empty()) {
      const std::string db = dir + "/quota_bench_" + run_name + ".db";
      for (const char* suffix : {"", "-wal", "-shm"}) std::filesystem::remove(db + suffix);
      return db;
    }
    // a schema per run, named first in the search path (libpq's `options`): the store's tables are unqualified
    const std::string schema = "bench_" + run_name;
    PostgresCluster::execute(url, "SET client_min_messages = warning; DROP SCHEMA IF EXISTS " + schema +
                                      " CASCADE; CREATE SCHEMA " + schema);
    return url + (url.find('?') == std::string::npos ? "?" : "&") + "options=-csearch_path%3D" + schema;
  }
};

struct Result {
  std::string backend;
  std::string name;
  int connections = 0;
  double seconds = 0;
  int64_t heartbeats = 0;
  int64_t setup_heartbeats = 0;  // the hostile run's renewals while it queues, stored as well
  int64_t errors = 0;
  double per_s = 0, p50_ms = 0, p99_ms = 0, p999_ms = 0, max_ms = 0;
  int64_t rows_stored = 0;
  // the hostile run
  int slow_connections = 0;
  int queued = 0;
  int expired = 0;
  int64_t rss_mib = 0;
};

int64_t resident_mib() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6)) / 1024;
  }
  return 0;
}

// A keep-alive client of the benchmark's quotad; over HTTPS when `tls_dir` holds ca.pem.
httplib::Client bench_client(int port, const std::string& tls_dir) {
  if (tls_dir.empty()) return httplib::Client("127.0.0.1", port);
  httplib::Client client("https://127.0.0.1:" + std::to_string(port));
  client.set_ca_cert_path((tls_dir + "/ca.pem").c_str());
  client.enable_server_certificate_verification(true);
  return client;
}

// A CA and a certificate for 127.0.0.1 under `dir`/tls; the directory.
std::string make_certificates(const std::string& dir) {
  const std::string tls = dir + "/quota_bench_tls";
  std::filesystem::create_directories(tls);
  const std::string command =
      "cd '" + tls +
      "' && (openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=bench-ca -keyout ca.key -out ca.pem && "
      "openssl req -newkey rsa:2048 -nodes -subj /CN=quotad -keyout server.key -out server.csr && "
      "printf 'subjectAltName=IP:127.0.0.1\\n' > san.ext && openssl x509 -req -in server.csr -CA ca.pem -CAkey "
      "ca.key -CAcreateserial -days 2 -extfile san.ext -out server.pem) > openssl.log 2>&1";
  if (std::system(command.c_str()) != 0) throw std::runtime_error("bench: openssl failed, see " + tls + "/openssl.log");
  return tls;
}

// The hostile run's attackers from the trainers' own address, 127.0.0.1: wrong tokens at
// `wrong_per_s`, `idle` silent sockets (reopened when closed), `readers` clients pipelining requests and
// never reading.
struct SharedAddressAttack {
  int wrong_per_s = 0;
  int idle = 0;
  int readers = 0;
  int ttl_s = 0;  // the leases' TTL: shorter than the run, so a stalled lease expires within it
};

void attack_shared_address(const SharedAddressAttack& attack, int port, std::atomic<bool>& attacking) {
  std::vector<std::thread> threads;
  if (attack.wrong_per_s > 0) {
    threads.emplace_back([&, port] {
      httplib::Client client("127.0.0.1", port);
      const httplib::Headers wrong = {{"Authorization", "Bearer not-the-bench-token"}};
      const auto pause = std::chrono::microseconds(1000000 / attack.wrong_per_s);
      while (attacking) {
        const auto sent = Clock::now();
        client.Post("/v1/leases/1/heartbeat", wrong, "{}", "application/json");
        std::this_thread::sleep_until(sent + pause);
      }
    });
  }
  threads.emplace_back([&, port] {
    std::vector<int> idle, readers;
    for (int i = 0; i < attack.idle; ++i) idle.push_back(connect_from("127.0.0.1", port));
    std::string batch;
    for (int i = 0; i < 100; ++i) {
      batch += "GET /no/such/endpoint HTTP/1.1\r\nHost: bench\r\n\r\nGET /healthz HTTP/1.1\r\nHost: bench\r\n\r\n";
    }
    for (int i = 0; i < attack.readers; ++i) readers.push_back(connect_from("127.0.0.1", port));
    while (attacking) {
      for (int& fd : idle) {
        char byte = 0;
        const ssize_t n = fd < 0 ? 0 : ::recv(fd, &byte, 1, MSG_DONTWAIT | MSG_PEEK);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) continue;  // open and silent
        if (fd >= 0) ::close(fd);
        fd = connect_from("127.0.0.1", port);
      }
      for (int& fd : readers) {
        if (fd >= 0 && (::send(fd, batch.data(), batch.size(), MSG_NOSIGNAL | MSG_DONTWAIT) >= 0 || errno == EAGAIN ||
                        errno == EWOULDBLOCK)) {
          continue;
        }
        if (fd >= 0) ::close(fd);
        fd = connect_from("127.0.0.1", port);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    for (int fd : idle) ::close(fd);
    for (int fd : readers) ::close(fd);
  });
  for (auto& thread : threads) thread.join();
}

Result run(const std::string& name, bool write_each, bool full_sync, int connections, int leases, double seconds,
           const Backend& backend, int slow_connections = 0, int queue = 0, const std::string& tls_dir = "",
           const SharedAddressAttack& attack = {}) {
  const std::string db = backend.fresh(name + "_" + std::to_string(connections));
  ServiceOptions so;
  so.db_path = db;
  so.write_each_heartbeat = write_each;
  so.full_sync = full_sync;
  QuotaService service(bench_policy(attack.ttl_s), so);
  ServerOptions opts;
  opts.threads = std::max(4, connections + 2);
  if (!tls_dir.empty()) {
    opts.tls_cert_file = tls_dir + "/server.pem";
    opts.tls_key_file = tls_dir + "/server.key";
  }
  QuotaServer server(service, opts);
  const int port = server.start();
  const httplib::Headers auth = {{"Authorization", "Bearer bench-token"}};
  std::vector<int64_t> ids, queued_ids;
  int64_t setup_heartbeats = 0;
  {
    httplib::Client client = bench_client(port, tls_dir);
    for (int i = 0; i < leases; ++i) {
      auto response =
          client.Post("/v1/leases", auth, R"({"model":"yolov8n","shared":true,"memory_gib":4})", "application/json");
      if (!response || response->status != 201) throw std::runtime_error("bench: acquire failed");
      ids.push_back(json::parse(response->body)["lease_id"].get<int64_t>());
    }
    // the hostile run: every GPU share is taken, so these wait in the queue (64 GiB: a share fits one GPU with
    // its process overhead). Queuing 1,000 can outlast a short TTL (on PostgreSQL each is a commit): what is
    // granted or queued so far heartbeats once a second meanwhile, as its trainers would.
    auto last_renewal = Clock::now();
    for (int i = 0; i < queue; ++i) {
      if (attack.ttl_s > 0 && Clock::now() - last_renewal >= std::chrono::seconds(1)) {
        last_renewal = Clock::now();
        auto beat = [&](int64_t id) {
          auto answer =
              client.Post(("/v1/leases/" + std::to_string(id) + "/heartbeat").c_str(), auth, "{}", "application/json");
          return answer && answer->status == 200;
        };
        // a running lease's beat is stored too: counted, so that `lost` misses none
        for (int64_t id : ids) setup_heartbeats += beat(id) ? 1 : 0;
        for (int64_t id : queued_ids) beat(id);
      }
      auto response =
          client.Post("/v1/leases", auth, R"({"model":"yolov8n","shared":true,"memory_gib":64})", "application/json");
      if (!response || response->status != 202) {
        throw std::runtime_error("bench: a queued request was not queued: " +
                                 (response ? std::to_string(response->status) + " " + response->body : "no answer"));
      }
      queued_ids.push_back(json::parse(response->body)["lease_id"].get<int64_t>());
    }
  }
  std::vector<int> drips;
  for (int i = 0; i < slow_connections; ++i) {
    const int fd = connect_from("127.0.1." + std::to_string(1 + i / 20), port);
    if (fd < 0) throw std::runtime_error("bench: cannot open a slow connection");
    drips.push_back(fd);
  }
  std::atomic<bool> dripping{!drips.empty()};
  std::thread dripper([&] {
    const std::string request = "POST /v1/leases HTTP/1.1\r\nHost: bench\r\nAuthorization: Bearer x\r\n";
    for (size_t byte = 0; dripping; byte = (byte + 1) % request.size()) {
      for (int fd : drips) ::send(fd, &request[byte], 1, MSG_NOSIGNAL);
      for (int wait = 0; wait < 5 && dripping; ++wait) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
  std::atomic<bool> attacking{true};
  std::thread attacker([&] { attack_shared_address(attack, port, attacking); });
  // with a short TTL the queued requests heartbeat too (once a second, as waiting trainers do), else they
  // expire and the queue is gone
  std::thread queue_keeper([&] {
    if (attack.ttl_s == 0 || queued_ids.empty()) return;
    httplib::Client client = bench_client(port, tls_dir);
    client.set_keep_alive(true);
    client.set_tcp_nodelay(true);  // else each heartbeat waits for a delayed ACK
    while (attacking) {
      const auto round = Clock::now();
      for (size_t i = 0; attacking && i < queued_ids.size(); ++i) {
        client.Post(("/v1/leases/" + std::to_string(queued_ids[i]) + "/heartbeat").c_str(), auth, "{}",
                    "application/json");
      }
      std::this_thread::sleep_until(round + std::chrono::seconds(1));
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(attack.idle > 0 ? 500 : 0));  // the sockets are open
  std::vector<std::vector<double>> latencies_by_thread(static_cast<size_t>(connections));
  std::atomic<int64_t> errors{0};
  std::atomic<bool> go{false};
  const auto deadline_ns = static_cast<int64_t>(seconds * 1e9);
  std::vector<std::thread> threads;
  for (int thread_index = 0; thread_index < connections; ++thread_index) {
    threads.emplace_back([&, thread_index] {
      httplib::Client client = bench_client(port, tls_dir);
      client.set_keep_alive(true);
      client.set_tcp_nodelay(true);
      auto& mine = latencies_by_thread[static_cast<size_t>(thread_index)];
      mine.reserve(200000);
      while (!go) std::this_thread::yield();
      const auto start = Clock::now();
      size_t cursor = static_cast<size_t>(thread_index);
      int64_t step = 0;
      while ((Clock::now() - start).count() < deadline_ns) {
        const int64_t id = ids[cursor % ids.size()];
        cursor += static_cast<size_t>(connections);
        const std::string body =
            R"({"step":)" + std::to_string(++step) + R"(,"epoch":1,"gpu_util":0.87,"memory_used_gib":3.2})";
        const auto t0 = Clock::now();
        auto response =
            client.Post(("/v1/leases/" + std::to_string(id) + "/heartbeat").c_str(), auth, body, "application/json");
        const auto t1 = Clock::now();
        if (!response || response->status != 200) {
          ++errors;
          continue;
        }
        mine.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
      }
    });
  }
  const auto start = Clock::now();
  go = true;
  for (auto& thread : threads) thread.join();
  const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  dripping = false;
  dripper.join();
  for (int fd : drips) ::close(fd);
  int expired = 0, queued = 0;
  service.tick();
  service.inspect([&](const Engine& engine) {
    for (int64_t id : ids) expired += engine.find(id)->state == LeaseState::kGranted ? 0 : 1;
    queued = static_cast<int>(engine.queue_ids().size());
  });
  const int64_t rss = resident_mib();
  attacking = false;
  attacker.join();
  queue_keeper.join();
  server.stop();  // flushes the last batch
  std::vector<double> all;
  for (auto& latencies : latencies_by_thread) all.insert(all.end(), latencies.begin(), latencies.end());
  std::sort(all.begin(), all.end());
  auto percentile = [&](double fraction) {
    return all.empty() ? 0.0 : all[std::min(all.size() - 1, static_cast<size_t>(fraction * all.size()))];
  };
  Result res;
  res.backend = backend.name;
  res.name = name;
  res.connections = connections;
  res.seconds = elapsed;
  res.heartbeats = static_cast<int64_t>(all.size());
  res.setup_heartbeats = setup_heartbeats;
  res.errors = errors;
  res.per_s = static_cast<double>(all.size()) / elapsed;
  res.p50_ms = percentile(0.50);
  res.p99_ms = percentile(0.99);
  res.p999_ms = percentile(0.999);
  res.max_ms = all.empty() ? 0 : all.back();
  res.slow_connections = slow_connections;
  res.queued = queued;
  res.expired = expired;
  res.rss_mib = rss;
  res.rows_stored = open_store(parse_db_target(db))->count_heartbeats();
  return res;
}

// The scenarios of one backend, in this order: batched at each connection count, then at the comparison count
// batched with synchronous=FULL, a commit per heartbeat with synchronous=FULL, the hostile mix and HTTPS. `full_sync`
// is SQLite's alone: on PostgreSQL the two "_full" runs commit as the server is set (fsync, synchronous_commit).
std::vector<Result> run_scenarios(const Backend& backend, const std::vector<int>& connections, int leases,
                                  double seconds, const SharedAddressAttack& attack, const std::string& tls_dir) {
  std::vector<Result> results;
  // synchronous=NORMAL in WAL survives a crash of quotad; FULL also survives power loss
  for (int connection_count : connections) {
    results.push_back(run("batched", false, false, connection_count, leases, seconds, backend));
  }
  const int cmp = connections.size() > 1 ? connections[1] : connections[0];
  results.push_back(run("batched_full", false, true, cmp, leases, seconds, backend));
  results.push_back(run("commit_each_full", true, true, cmp, leases, seconds, backend));
  // ttl 4 s, the run at least 10 s: a lease whose heartbeats stall expires within it
  results.push_back(run("hostile", false, false, cmp, leases, std::max(seconds, 10.0), backend, 200, 1000, "", attack));
  results.push_back(run("batched_tls", false, false, cmp, leases, seconds, backend, 0, 0, tls_dir));
  return results;
}

// Heartbeats answered 200 that no row of the store holds.
int64_t lost(const Result& result) {
  return std::max<int64_t>(0, result.heartbeats + result.setup_heartbeats - result.rows_stored);
}

json run_json(const Result& result) {
  return json{{"backend", result.backend},         {"mode", result.name},
              {"connections", result.connections}, {"seconds", result.seconds},
              {"heartbeats", result.heartbeats},   {"setup_heartbeats", result.setup_heartbeats},
              {"heartbeats_per_s", result.per_s},  {"p50_ms", result.p50_ms},
              {"p99_ms", result.p99_ms},           {"p999_ms", result.p999_ms},
              {"max_ms", result.max_ms},           {"errors", result.errors},
              {"rows_stored", result.rows_stored}, {"lost_heartbeats", lost(result)}};
}

// Prints one backend's verdicts; its summary for the JSON.
json summarize(const std::string& backend, const std::vector<Result>& results, const SharedAddressAttack& attack,
               int leases) {
  const auto batched_end = results.end() - 4;
  const Result& best = *std::max_element(
      results.begin(), batched_end, [](const Result& left, const Result& right) { return left.per_s < right.per_s; });
  const Result& batched_full = results[results.size() - 4];
  const Result& each = results[results.size() - 3];
  const Result& hostile = results[results.size() - 2];
  const Result& tls = results.back();
  const double ratio = each.per_s > 0 ? batched_full.per_s / each.per_s : 0;
  int64_t errors = 0, lost_total = 0;
  double slowest = results.front().per_s;
  for (const Result& result : results) {
    errors += result.errors;
    lost_total += lost(result);
    slowest = std::min(slowest, result.per_s);
  }
  const bool speed_met = best.per_s >= 10000 && best.p99_ms < 5;
  const bool department_met = errors == 0 && lost_total == 0 && slowest >= kDepartmentHeartbeatsPerS;
  std::printf(
      "[%s] target >= 10000 heartbeats/s with p99 < 5 ms: %s (best batched: %.0f/s at %d connections, p99 "
      "%.3f ms)\n",
      backend.c_str(), speed_met ? "met" : "NOT met", best.per_s, best.connections, best.p99_ms);
  std::printf(
      "[%s] goal: no error, no lost heartbeat, >= %d heartbeats/s in every run: %s (%lld errors, %lld lost, "
      "slowest run %.0f/s)\n",
      backend.c_str(), kDepartmentHeartbeatsPerS, department_met ? "met" : "NOT met", static_cast<long long>(errors),
      static_cast<long long>(lost_total), slowest);
  std::printf("[%s] batched / commit per heartbeat (synchronous=FULL on SQLite) at %d connections: %.2fx throughput\n",
              backend.c_str(), each.connections, ratio);
  const bool hostile_met = hostile.p99_ms < 50 && hostile.expired == 0 && hostile.errors == 0 && hostile.rss_mib < 300;
  std::printf(
      "[%s] hostile (%.1f s, lease ttl %d s): %d heartbeats/s, p99 %.3f ms, max %.2f ms, errors %lld, with %d "
      "slow-drip connections, %d queued requests and from the trainers' address %d wrong tokens/s, %d idle sockets, "
      "%d non-reading pipeliners; %d of %d leases expired; resident %lld MiB. Target p99 < 50 ms, none expired, < "
      "300 MiB: %s\n",
      backend.c_str(), hostile.seconds, attack.ttl_s, static_cast<int>(hostile.per_s), hostile.p99_ms, hostile.max_ms,
      static_cast<long long>(hostile.errors), hostile.slow_connections, hostile.queued, attack.wrong_per_s, attack.idle,
      attack.readers, hostile.expired, leases, static_cast<long long>(hostile.rss_mib),
      hostile_met ? "met" : "NOT met");
  std::printf("[%s] https: %d heartbeats/s, p50 %.3f ms, p99 %.3f ms, errors %lld at %d keep-alive connections\n",
              backend.c_str(), static_cast<int>(tls.per_s), tls.p50_ms, tls.p99_ms, static_cast<long long>(tls.errors),
              tls.connections);
  return json{{"full_sync_batched_over_commit_each", ratio},
              {"errors", errors},
              {"lost_heartbeats", lost_total},
              {"slowest_heartbeats_per_s", slowest},
              {"department_goal_met", department_met},
              {"hostile",
               {{"heartbeats_per_s", hostile.per_s},
                {"p50_ms", hostile.p50_ms},
                {"p99_ms", hostile.p99_ms},
                {"max_ms", hostile.max_ms},
                {"errors", hostile.errors},
                {"slow_connections", hostile.slow_connections},
                {"queued_requests", hostile.queued},
                {"leases_expired", hostile.expired},
                {"seconds", hostile.seconds},
                {"lease_ttl_s", attack.ttl_s},
                {"resident_mib", hostile.rss_mib},
                {"target_met", hostile_met}}},
              {"https",
               {{"heartbeats_per_s", tls.per_s},
                {"p50_ms", tls.p50_ms},
                {"p99_ms", tls.p99_ms},
                {"errors", tls.errors},
                {"connections", tls.connections}}},
              {"target_met", speed_met}};
}

// The first line of `path` that starts with `key`, after the key ("" when none).
std::string proc_field(const std::string& path, const std::string& key) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(key, 0) == 0) {
      const size_t value = line.find_first_not_of(" \t:", key.size());
      return value == std::string::npos ? "" : line.substr(value);
    }
  }
  return "";
}

json machine_json() {
  std::ifstream loadavg("/proc/loadavg");
  std::string load1, load5;
  loadavg >> load1 >> load5;
  return json{{"cpu", proc_field("/proc/cpuinfo", "model name")},
              {"cores", std::thread::hardware_concurrency()},
              {"memory", proc_field("/proc/meminfo", "MemTotal")},
              {"load_average_1_5_min_at_start", load1 + " " + load5}};
}

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return text;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"quota_load_bench: quotad heartbeat throughput and latency on loopback, on SQLite and PostgreSQL"};
  double seconds = 3;
  int leases = 64;
  std::vector<int> connections = {1, 2, 4};
  std::string out = "quota_load_bench.json";
  std::string dir = std::filesystem::temp_directory_path().string();
  std::string postgres;
  app.add_option("--seconds", seconds, "duration of each run (the hostile one: at least 10 s)")
      ->check(CLI::Range(0.2, 30.0));
  app.add_option("--leases", leases, "leases heartbeating")->check(CLI::Range(1, 64));
  app.add_option("--connections", connections, "keep-alive client connections per run");
  app.add_option("--out", out, "JSON result file");
  app.add_option("--dir", dir, "where the SQLite databases and the HTTPS certificates go");
  app.add_option("--postgres", postgres,
                 "an existing PostgreSQL database (libpq URL, no password in it) where each run gets a schema of its "
                 "own; absent: a throwaway cluster of the benchmark's own, fsync on");
  CLI11_PARSE(app, argc, argv);
  std::string command;
  for (int i = 0; i < argc; ++i) command += (i > 0 ? " " : "") + std::string(argv[i]);

  try {
    const json machine = machine_json();
    std::unique_ptr<PostgresCluster> own_cluster;
    if (postgres.empty()) {
      own_cluster = std::make_unique<PostgresCluster>(PostgresCluster::Durability::kOn);
      postgres = own_cluster->fresh_database("quota_bench");
    }
    parse_db_target(postgres);  // refuses a URL with a password before anything runs
    const json postgres_server = {
        {"server", own_cluster ? "the benchmark's own throwaway cluster (initdb, Unix socket)" : "--postgres"},
        {"version", PostgresCluster::query_text(postgres, "SHOW server_version")},
        {"fsync", PostgresCluster::query_text(postgres, "SHOW fsync")},
        {"synchronous_commit", PostgresCluster::query_text(postgres, "SHOW synchronous_commit")},
        {"full_page_writes", PostgresCluster::query_text(postgres, "SHOW full_page_writes")}};

    SharedAddressAttack attack;
    attack.wrong_per_s = 100;
    attack.idle = 40;
    attack.readers = 4;
    attack.ttl_s = 4;
    const std::string tls_dir = make_certificates(dir);
    const std::vector<Backend> backends = {{"sqlite", dir, ""}, {"postgresql", "", postgres}};
    std::vector<std::vector<Result>> by_backend;
    for (const Backend& backend : backends) {
      by_backend.push_back(run_scenarios(backend, connections, leases, seconds, attack, tls_dir));
    }

    std::printf("%-10s %-16s %5s %10s %10s %8s %8s %9s %8s %7s %10s %5s\n", "backend", "mode", "conns", "heartbeats",
                "per_s", "p50_ms", "p99_ms", "p99.9_ms", "max_ms", "errors", "rows_kept", "lost");
    json rows = json::array();
    for (const auto& results : by_backend) {
      for (const Result& result : results) {
        std::printf("%-10s %-16s %5d %10lld %10.0f %8.3f %8.3f %9.3f %8.2f %7lld %10lld %5lld\n",
                    result.backend.c_str(), result.name.c_str(), result.connections,
                    static_cast<long long>(result.heartbeats), result.per_s, result.p50_ms, result.p99_ms,
                    result.p999_ms, result.max_ms, static_cast<long long>(result.errors),
                    static_cast<long long>(result.rows_stored), static_cast<long long>(lost(result)));
        rows.push_back(run_json(result));
      }
    }
    // the same scenario on both backends in this run: ratios, not absolute times, compare across machines
    std::printf("\n%-16s %5s %22s %22s\n", "postgresql/sqlite", "conns", "heartbeats_per_s_ratio", "p99_ratio");
    json ratios = json::array();
    for (size_t i = 0; i < by_backend[0].size(); ++i) {
      const Result& sqlite = by_backend[0][i];
      const Result& pg = by_backend[1][i];
      const double throughput = sqlite.per_s > 0 ? pg.per_s / sqlite.per_s : 0;
      const double p99 = sqlite.p99_ms > 0 ? pg.p99_ms / sqlite.p99_ms : 0;
      std::printf("%-16s %5d %22.3f %22.2f\n", sqlite.name.c_str(), sqlite.connections, throughput, p99);
      ratios.push_back(json{{"mode", sqlite.name},
                            {"connections", sqlite.connections},
                            {"heartbeats_per_s", throughput},
                            {"p99_ms", p99}});
    }
    std::printf("\n");
    json summaries;
    for (size_t b = 0; b < backends.size(); ++b) {
      summaries[backends[b].name] = summarize(backends[b].name, by_backend[b], attack, leases);
    }
    std::ofstream(out) << json{{"benchmark", "quota_load_bench"},
                               {"date", utc_now()},
                               {"machine", machine},
                               {"command", command},
                               {"postgresql", postgres_server},
                               {"full_sync_note",
                                "synchronous=FULL is SQLite's; on PostgreSQL the _full runs commit as the server is "
                                "set (see postgresql)"},
                               {"department_goal_heartbeats_per_s", kDepartmentHeartbeatsPerS},
                               {"runs", rows},
                               {"postgresql_over_sqlite", ratios},
                               {"backends", summaries}}
                              .dump(2)
                       << "\n";
    std::printf("wrote %s\n", out.c_str());
  } catch (const std::exception& error) {
    std::fprintf(stderr, "quota_load_bench: %s\n", error.what());
    return 1;
  }
  return 0;
}
