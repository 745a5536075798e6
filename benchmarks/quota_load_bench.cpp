// Heartbeat load on loopback: heartbeats/s and latency percentiles of quotad's hot path, with the SQLite
// store on. Compares, in one run, batched heartbeat commits (quotad's default) against a commit per heartbeat.
#include <httplib.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>
#include <vector>

#include "quota/core/policy.h"
#include "quota/core/sha256.h"
#include "quota/server/http_server.h"
#include "quota/service/service.h"
#include "quota/store/store.h"

using namespace yolo8::quota;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

Policy bench_policy() {
  const std::string yaml = R"(
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
)";
  return load_policy_from_string(yaml, "bench-policy");
}

struct Result {
  std::string name;
  int connections = 0;
  double seconds = 0;
  int64_t heartbeats = 0;
  int64_t errors = 0;
  double per_s = 0, p50_ms = 0, p99_ms = 0, p999_ms = 0, max_ms = 0;
  int64_t rows_stored = 0;
};

Result run(const std::string& name, bool write_each, bool full_sync, int connections, int leases, double seconds,
           const std::string& dir) {
  const std::string db = dir + "/quota_bench_" + name + ".db";
  for (const char* suffix : {"", "-wal", "-shm"}) std::filesystem::remove(db + suffix);
  ServiceOptions so;
  so.db_path = db;
  so.write_each_heartbeat = write_each;
  so.full_sync = full_sync;
  QuotaService service(bench_policy(), so);
  ServerOptions opts;
  opts.threads = std::max(4, connections + 2);
  QuotaServer server(service, opts);
  const int port = server.start();
  const httplib::Headers auth = {{"Authorization", "Bearer bench-token"}};
  std::vector<int64_t> ids;
  {
    httplib::Client client("127.0.0.1", port);
    for (int i = 0; i < leases; ++i) {
      auto response =
          client.Post("/v1/leases", auth, R"({"model":"yolov8n","shared":true,"memory_gib":4})", "application/json");
      if (!response || response->status != 201) throw std::runtime_error("bench: acquire failed");
      ids.push_back(json::parse(response->body)["lease_id"].get<int64_t>());
    }
  }
  std::vector<std::vector<double>> latencies_by_thread(static_cast<size_t>(connections));
  std::atomic<int64_t> errors{0};
  std::atomic<bool> go{false};
  const auto deadline_ns = static_cast<int64_t>(seconds * 1e9);
  std::vector<std::thread> threads;
  for (int thread_index = 0; thread_index < connections; ++thread_index) {
    threads.emplace_back([&, thread_index] {
      httplib::Client client("127.0.0.1", port);
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
  server.stop();  // flushes the last batch
  std::vector<double> all;
  for (auto& latencies : latencies_by_thread) all.insert(all.end(), latencies.begin(), latencies.end());
  std::sort(all.begin(), all.end());
  auto percentile = [&](double fraction) {
    return all.empty() ? 0.0 : all[std::min(all.size() - 1, static_cast<size_t>(fraction * all.size()))];
  };
  Result res;
  res.name = name;
  res.connections = connections;
  res.seconds = elapsed;
  res.heartbeats = static_cast<int64_t>(all.size());
  res.errors = errors;
  res.per_s = static_cast<double>(all.size()) / elapsed;
  res.p50_ms = percentile(0.50);
  res.p99_ms = percentile(0.99);
  res.p999_ms = percentile(0.999);
  res.max_ms = all.empty() ? 0 : all.back();
  Store check(db);
  res.rows_stored = check.count_heartbeats();
  return res;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"quota_load_bench: quotad heartbeat throughput and latency on loopback"};
  double seconds = 3;
  int leases = 64;
  std::vector<int> connections = {1, 2, 4};
  std::string out = "quota_load_bench.json";
  std::string dir = std::filesystem::temp_directory_path().string();
  app.add_option("--seconds", seconds, "duration of each run")->check(CLI::Range(0.2, 30.0));
  app.add_option("--leases", leases, "leases heartbeating")->check(CLI::Range(1, 64));
  app.add_option("--connections", connections, "keep-alive client connections per run");
  app.add_option("--out", out, "JSON result file");
  app.add_option("--dir", dir, "where the benchmark databases go");
  CLI11_PARSE(app, argc, argv);

  std::vector<Result> results;
  // synchronous=NORMAL in WAL survives a crash of quotad; FULL also survives power loss
  for (int connection_count : connections) {
    results.push_back(run("batched", false, false, connection_count, leases, seconds, dir));
  }
  const int cmp = connections.size() > 1 ? connections[1] : connections[0];
  results.push_back(run("batched_full", false, true, cmp, leases, seconds, dir));
  results.push_back(run("commit_each_full", true, true, cmp, leases, seconds, dir));

  std::printf("%-16s %5s %10s %12s %8s %8s %9s %8s %7s %10s\n", "mode", "conns", "heartbeats", "per_s", "p50_ms",
              "p99_ms", "p99.9_ms", "max_ms", "errors", "rows_kept");
  json rows = json::array();
  for (const auto& result : results) {
    std::printf("%-16s %5d %10lld %12.0f %8.3f %8.3f %9.3f %8.2f %7lld %10lld\n", result.name.c_str(),
                result.connections, static_cast<long long>(result.heartbeats), result.per_s, result.p50_ms,
                result.p99_ms, result.p999_ms, result.max_ms, static_cast<long long>(result.errors),
                static_cast<long long>(result.rows_stored));
    rows.push_back(json{{"mode", result.name},
                        {"connections", result.connections},
                        {"seconds", result.seconds},
                        {"heartbeats", result.heartbeats},
                        {"heartbeats_per_s", result.per_s},
                        {"p50_ms", result.p50_ms},
                        {"p99_ms", result.p99_ms},
                        {"p999_ms", result.p999_ms},
                        {"max_ms", result.max_ms},
                        {"errors", result.errors},
                        {"rows_stored", result.rows_stored}});
  }
  const Result& best =
      *std::max_element(results.begin(), results.end() - 2,
                        [](const Result& left, const Result& right) { return left.per_s < right.per_s; });
  const Result& batched_full = results[results.size() - 2];
  const Result& each = results.back();
  const double ratio = each.per_s > 0 ? batched_full.per_s / each.per_s : 0;
  std::printf(
      "target >= 10000 heartbeats/s with p99 < 5 ms: %s (best batched: %.0f/s at %d connections, p99 %.3f ms)\n",
      best.per_s >= 10000 && best.p99_ms < 5 ? "met" : "NOT met", best.per_s, best.connections, best.p99_ms);
  std::printf("synchronous=FULL, batched / commit per heartbeat at %d connections: %.2fx throughput\n",
              each.connections, ratio);
  std::ofstream(out) << json{{"benchmark", "quota_load_bench"},
                             {"runs", rows},
                             {"full_sync_batched_over_commit_each", ratio},
                             {"target_met", best.per_s >= 10000 && best.p99_ms < 5}}
                            .dump(2)
                     << "\n";
  std::printf("wrote %s\n", out.c_str());
  return 0;
}
