// Start-up time of quotad on a long heartbeat history: a SQLite database holding a year of 200 trainers' leases
// and heartbeats (every 10 s), shaped as bounded history leaves it (the last --retention-days raw, every hour
// before the last summed up per lease in heartbeat_hours), generated in bulk. Measures what `quotad serve` does
// before it serves: the store's open (quick_check, schema), the state's load and the waste tracker's replay
// (QuotaService's construction), then the same on the same database with the running leases' hours unsummed, as
// quotad replayed before bounded history (every raw sample of a running lease).
#include <sqlite3.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "quota/core/policy.h"
#include "quota/core/sha256.h"
#include "quota/core/usage.h"
#include "quota/service/service.h"
#include "quota/store/store.h"

using namespace yolo8::quota;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int64_t kHourMs = 3600000;

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

Policy bench_policy(int trainers) {
  std::string users, members;
  for (int i = 0; i < trainers; ++i) {
    users += "  u" + std::to_string(i) + ": {token_sha256: " + sha256_hex("token-" + std::to_string(i)) + "}\n";
    members += (i == 0 ? "u" : ", u") + std::to_string(i);
  }
  std::string nodes;
  for (int node = 0; node * 8 < trainers; ++node) {
    nodes += "    - {name: n" + std::to_string(node) + ", gpus: 8, memory_gib: 80}\n";
  }
  const std::string gpus = std::to_string((trainers + 7) / 8 * 8);
  const std::string yaml = "inventory:\n  nodes:\n" + nodes + "emergency_pool: 0\nusers:\n" + users +
                           "teams:\n  t: {base: " + gpus + ", burst: " + gpus + ", members: [" + members +
                           "]}\ncredits: {monthly_gpu_hours: 0}\n";
  return load_policy_from_string(yaml, "history-bench-policy");
}

// A trainer's utilisation: busy, with a low stretch every few hours.
double util_at(int trainer, int64_t ts_ms) {
  return (ts_ms / (90 * 60000) + trainer) % 7 == 0 ? 0.03 : 0.6 + 0.1 * (trainer % 4);
}

struct LeaseSpan {
  int64_t id, start_ms, end_ms;  // end: the release, or past now while it runs
};

class Db {
 public:
  explicit Db(const std::string& path) {
    if (sqlite3_open(path.c_str(), &db_) != SQLITE_OK) throw std::runtime_error(path + ": cannot open");
  }
  ~Db() { sqlite3_close(db_); }
  void exec(const std::string& sql) {
    char* error = nullptr;
    if (sqlite3_exec(db_, sql.c_str(), nullptr, nullptr, &error) != SQLITE_OK) {
      const std::string message = error != nullptr ? error : "?";
      sqlite3_free(error);
      throw std::runtime_error(sql.substr(0, 80) + ": " + message);
    }
  }
  sqlite3_stmt* prepare(const std::string& sql) {
    sqlite3_stmt* statement = nullptr;
    if (sqlite3_prepare_v2(db_, sql.c_str(), -1, &statement, nullptr) != SQLITE_OK) {
      throw std::runtime_error(sql.substr(0, 80) + ": " + sqlite3_errmsg(db_));
    }
    return statement;
  }
  void step(sqlite3_stmt* statement) {
    if (sqlite3_step(statement) != SQLITE_DONE) throw std::runtime_error(std::string("insert: ") + sqlite3_errmsg(db_));
    sqlite3_reset(statement);
  }

 private:
  sqlite3* db_ = nullptr;
};

struct Generated {
  int64_t leases = 0, raw_rows = 0, hour_rows = 0;
  double seconds = 0;
};

Generated generate(const std::string& path, const Policy& policy, int trainers, int days, int retention_days,
                   int interval_s, int lease_hours, int64_t now) {
  const Clock::time_point began = Clock::now();
  Generated out;
  const int64_t start = now - int64_t{days} * 24 * kHourMs;
  const int64_t lease_ms = int64_t{lease_hours} * kHourMs;
  std::vector<std::vector<LeaseSpan>> spans(static_cast<size_t>(trainers));
  {
    // the leases, through the engine and the store (their rows and audit entries as quotad writes them)
    Store store(path);
    Engine engine(policy);
    std::vector<int64_t> running(static_cast<size_t>(trainers), 0);
    for (int64_t round = start; round < now; round += lease_ms) {
      store.begin_immediate();
      for (int i = 0; i < trainers; ++i) {
        const int64_t t = round + static_cast<int64_t>(i) * lease_ms / trainers;
        if (t >= now) break;
        const auto index = static_cast<size_t>(i);
        if (running[index] != 0) engine.release(running[index], Outcome::kCompleted, t);
        LeaseRequest request;
        request.team = "t";
        request.user = "u" + std::to_string(i);
        request.gpus = 1;
        request.job = "train-" + std::to_string(i);
        request.model = "yolov8s";
        const AcquireResult result = engine.acquire(request, t);
        if (result.kind != AcquireResult::Kind::kGranted) {
          throw std::runtime_error("lease of u" + std::to_string(i) + " not granted: " + result.reason);
        }
        running[index] = result.lease_id;
        if (!spans[index].empty()) spans[index].back().end_ms = t;
        spans[index].push_back({result.lease_id, t, now + 1});
        ++out.leases;
      }
      store.write(engine, engine.take_changes());
      store.commit();
      engine.prune(round, 24 * kHourMs);
    }
  }
  Db db(path);
  db.exec("PRAGMA synchronous = OFF; PRAGMA cache_size = -500000; BEGIN");
  const auto lease_at = [&](int trainer, int64_t ts) -> const LeaseSpan* {
    const std::vector<LeaseSpan>& list = spans[static_cast<size_t>(trainer)];
    auto it = std::upper_bound(list.begin(), list.end(), ts,
                               [](int64_t value, const LeaseSpan& span) { return value < span.start_ms; });
    if (it == list.begin()) return nullptr;
    --it;
    return ts < it->end_ms ? &*it : nullptr;
  };
  const int64_t interval = int64_t{interval_s} * 1000;
  // a trainer's samples: every interval from its first lease, each trainer a little apart
  const auto sample_ts = [&](int trainer, int64_t tick) { return tick + trainer * 37; };
  // every hour before the last whole one summed up, as fold_heartbeats leaves it
  const int64_t mark = hour_of(now - 10 * 60000);
  {
    sqlite3_stmt* insert = db.prepare(
        "INSERT INTO heartbeat_hours(lease_id, hour_ms, samples, first_ts_ms, first_util, last_ts_ms, last_util, "
        "util_micro_ms, covered_ms, low_held_ms, head_low_end_ms, tail_low_since_ms, wasted_ms, longest_low_ms, "
        "closed_runs, threshold, waste_after_ms) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)");
    for (int64_t hour = hour_of(start); hour < mark; hour += kHourMs) {
      for (int i = 0; i < trainers; ++i) {
        std::map<int64_t, UtilSummary> by_lease;
        for (int64_t tick = hour - hour % interval; tick < hour + kHourMs; tick += interval) {
          const int64_t ts = sample_ts(i, tick);
          if (ts < hour || ts >= hour + kHourMs) continue;
          const LeaseSpan* span = lease_at(i, ts);
          if (span == nullptr) continue;
          UtilSummary& summary = by_lease[span->id];
          summary.threshold = policy.waste_gpu_util_below;
          summary.waste_after_ms = int64_t{policy.waste_after_s} * 1000;
          summary.add(ts, util_at(i, ts));
        }
        for (const auto& [id, s] : by_lease) {
          const int64_t values[] = {id,
                                    hour,
                                    s.samples,
                                    s.first_ts_ms,
                                    0,
                                    s.last_ts_ms,
                                    0,
                                    s.util_micro_ms,
                                    s.covered_ms,
                                    s.low_held_ms,
                                    s.head_low_end_ms,
                                    s.tail_low_since_ms,
                                    s.wasted_ms,
                                    s.longest_low_ms,
                                    s.closed_runs,
                                    0,
                                    s.waste_after_ms};
          for (int c = 0; c < 17; ++c) sqlite3_bind_int64(insert, c + 1, values[c]);
          sqlite3_bind_double(insert, 5, s.first_util);
          sqlite3_bind_double(insert, 7, s.last_util);
          sqlite3_bind_double(insert, 16, s.threshold);
          db.step(insert);
          ++out.hour_rows;
        }
      }
    }
    sqlite3_finalize(insert);
  }
  {
    // the raw rows of the retention period, as trainers send them (step, epoch, memory, where the figure came from)
    sqlite3_stmt* insert = db.prepare(
        "INSERT INTO heartbeats(lease_id, ts_ms, step, epoch, gpu_util, memory_used_gib, last_checkpoint_ms, "
        "gpu_util_source, device_memory_used_gib, process_memory_used_gib) VALUES (?,?,?,?,?,?,?,'nvml',?,?)");
    const int64_t raw_from = hour_of(now - int64_t{retention_days} * 24 * kHourMs);
    for (int64_t tick = raw_from; tick < now; tick += interval) {
      for (int i = 0; i < trainers; ++i) {
        const int64_t ts = sample_ts(i, tick);
        const LeaseSpan* span = lease_at(i, ts);
        if (span == nullptr || ts >= now) continue;
        const int64_t step = (ts - span->start_ms) / 500;
        sqlite3_bind_int64(insert, 1, span->id);
        sqlite3_bind_int64(insert, 2, ts);
        sqlite3_bind_int64(insert, 3, step);
        sqlite3_bind_int64(insert, 4, step / 2000);
        sqlite3_bind_double(insert, 5, util_at(i, ts));
        sqlite3_bind_double(insert, 6, 31.5);
        sqlite3_bind_int64(insert, 7, ts - ts % (30 * 60000));
        sqlite3_bind_double(insert, 8, 40.25);
        sqlite3_bind_double(insert, 9, 38.5);
        db.step(insert);
        ++out.raw_rows;
      }
    }
    sqlite3_finalize(insert);
  }
  db.exec("INSERT OR REPLACE INTO meta(key, value) VALUES ('" + std::string(kHeartbeatsSummarisedKey) + "', '" +
          std::to_string(mark) + "'); COMMIT; PRAGMA wal_checkpoint(TRUNCATE)");
  out.seconds = seconds_since(began);
  return out;
}

struct Start {
  double open_s = 0;     // Store: quick_check and the schema
  double service_s = 0;  // QuotaService: open, load, replay (what serve does before it listens)
  size_t running = 0;
};

Start measure_start(const std::string& path, const Policy& policy, int64_t now) {
  Start out;
  {
    const Clock::time_point began = Clock::now();
    Store store(path);
    out.open_s = seconds_since(began);
  }
  ServiceOptions options;
  options.db_path = path;
  options.clock = [now] { return now; };
  const Clock::time_point began = Clock::now();
  QuotaService service(policy, options);
  out.service_s = seconds_since(began);
  return out;
}

// What the open checked before bounded history: the whole file (now the history tables are left out).
double full_quick_check_s(const std::string& path) {
  const Clock::time_point began = Clock::now();
  sqlite3* db = nullptr;
  sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READONLY, nullptr);
  sqlite3_stmt* statement = nullptr;
  if (sqlite3_prepare_v2(db, "PRAGMA quick_check", -1, &statement, nullptr) == SQLITE_OK) {
    while (sqlite3_step(statement) == SQLITE_ROW) {
    }
  }
  sqlite3_finalize(statement);
  sqlite3_close(db);
  return seconds_since(began);
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
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
  CLI::App app{"quota_history_bench: quotad's start on a year of heartbeats, with bounded history"};
  int trainers = 200, days = 365, retention_days = 14, interval_s = 10, lease_hours = 72, repeats = 3;
  std::string dir = std::filesystem::temp_directory_path().string(), out = "quota_history_bench.json";
  bool keep = false;
  app.add_option("--trainers", trainers, "trainers, each with one running lease of one GPU")
      ->check(CLI::Range(1, 4000));
  app.add_option("--days", days, "history length")->check(CLI::Range(1, 3650));
  app.add_option("--retention-days", retention_days, "raw heartbeats kept")->check(CLI::Range(1, 3650));
  app.add_option("--interval-s", interval_s, "heartbeat interval")->check(CLI::Range(1, 3600));
  app.add_option("--lease-hours", lease_hours, "each trainer's leases follow each other, this long")
      ->check(CLI::Range(1, 24 * 365));
  app.add_option("--repeats", repeats, "starts measured (the median is reported)")->check(CLI::Range(1, 20));
  app.add_option("--dir", dir, "where the database goes");
  app.add_option("--out", out, "JSON results");
  app.add_flag("--keep", keep, "keep the database");
  CLI11_PARSE(app, argc, argv);

  const Policy policy = bench_policy(trainers);
  const int64_t now = 1795996800000 + 7 * kHourMs + 23 * 60000;  // a Monday morning, UTC
  const std::string path = dir + "/quota_history_bench_" + std::to_string(::getpid()) + ".db";
  for (const char* suffix : {"", "-wal", "-shm"}) std::filesystem::remove(path + suffix);
  std::printf("generating %d days of %d trainers (heartbeat every %d s, %d days raw) in %s\n", days, trainers,
              interval_s, retention_days, path.c_str());
  std::fflush(stdout);
  const Generated generated = generate(path, policy, trainers, days, retention_days, interval_s, lease_hours, now);
  const double file_gib = static_cast<double>(std::filesystem::file_size(path)) / (1024.0 * 1024 * 1024);
  std::printf("generated in %.1f s: %lld leases, %lld raw heartbeats, %lld hourly summaries, %.2f GiB\n",
              generated.seconds, static_cast<long long>(generated.leases), static_cast<long long>(generated.raw_rows),
              static_cast<long long>(generated.hour_rows), file_gib);
  std::fflush(stdout);

  const auto run = [&](const char* name) {
    std::vector<double> open, service;
    for (int i = 0; i < repeats; ++i) {
      const Start start = measure_start(path, policy, now);
      open.push_back(start.open_s);
      service.push_back(start.service_s);
    }
    return json{{"layout", name}, {"store_open_s", median(open)}, {"serve_start_s", median(service)}};
  };
  json rows = json::array();
  rows.push_back(run("bounded: hours summed up, last days raw"));
  {
    // as before bounded history: no mark, the running leases' samples all raw (their hours unsummed)
    Db db(path);
    db.exec("DELETE FROM meta WHERE key = '" + std::string(kHeartbeatsSummarisedKey) +
            "'; DELETE FROM heartbeat_hours WHERE lease_id IN (SELECT id FROM leases WHERE state = 'granted')");
  }
  rows.push_back(run("unsummed: every raw sample of a running lease replayed"));
  const double full_check_s = full_quick_check_s(path);

  std::printf("\n%-56s %14s %16s\n", "layout", "store open (s)", "serve start (s)");
  for (const json& row : rows) {
    std::printf("%-56s %14.3f %16.3f\n", row["layout"].get<std::string>().c_str(), row["store_open_s"].get<double>(),
                row["serve_start_s"].get<double>());
  }
  std::printf("%-56s %14.3f\n", "quick_check of the whole file (the open's, before)", full_check_s);
  std::printf(
      "before bounded history, a start on this file took about %.1f s (the whole-file check, then the "
      "unsummed replay)\n",
      full_check_s + rows[1]["serve_start_s"].get<double>() - rows[1]["store_open_s"].get<double>());
  const bool goal = rows[0]["serve_start_s"].get<double>() <= 2.0;
  std::printf("goal (serve start <= 2 s with bounded history): %s\n", goal ? "met" : "NOT met");
  std::ofstream(out) << json{{"benchmark", "quota_history_bench"},
                             {"date", utc_now()},
                             {"cores", std::thread::hardware_concurrency()},
                             {"trainers", trainers},
                             {"days", days},
                             {"retention_days", retention_days},
                             {"heartbeat_interval_s", interval_s},
                             {"lease_hours", lease_hours},
                             {"leases", generated.leases},
                             {"raw_heartbeats", generated.raw_rows},
                             {"hourly_summaries", generated.hour_rows},
                             {"database_gib", file_gib},
                             {"generation_s", generated.seconds},
                             {"repeats", repeats},
                             {"starts", rows},
                             {"whole_file_quick_check_s", full_check_s},
                             {"goal_serve_start_s", 2.0},
                             {"goal_met", goal}}
                            .dump(2)
                     << "\n";
  if (!keep) {
    for (const char* suffix : {"", "-wal", "-shm"}) std::filesystem::remove(path + suffix);
  }
  return 0;
}
