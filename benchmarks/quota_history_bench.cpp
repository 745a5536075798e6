// Start-up time of quotad on a long heartbeat history: a SQLite database holding a year of 200 trainers' leases
// and heartbeats (every 10 s), shaped as bounded history leaves it (the last --retention-days raw, every hour
// before the last summed up per lease in heartbeat_hours), generated in bulk. Measures what `quotad serve` does
// before it serves: the store's open (quick_check, schema), the state's load and the waste tracker's replay
// (QuotaService's construction), then the same on the same database with the running leases' hours unsummed, as
// quotad replayed before bounded history (every raw sample of a running lease). The same history goes to a
// throwaway PostgreSQL cluster (fsync on; bulk COPY, the indexes rebuilt after it, then VACUUM ANALYZE as
// autovacuum would have left a year-old database) and the same start is measured there (--backend).
#include <libpq-fe.h>
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
#include "quota/store/postgres_store.h"
#include "quota/store/store.h"
#include "tests/quota/postgres_cluster_core.h"

using namespace yolo8::quota;
using nlohmann::json;
using Clock = std::chrono::steady_clock;
using yolo8::quota::testing::PostgresCluster;

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

using Spans = std::vector<std::vector<LeaseSpan>>;

struct Shape {
  int trainers, days, retention_days, interval_s, lease_hours;
  int64_t now;
};

// The leases, through the engine and the store (their rows and audit entries as quotad writes them).
Spans write_leases(StateStore& store, const Policy& policy, const Shape& shape, Generated& out) {
  const int64_t start = shape.now - int64_t{shape.days} * 24 * kHourMs;
  const int64_t lease_ms = int64_t{shape.lease_hours} * kHourMs;
  Spans spans(static_cast<size_t>(shape.trainers));
  Engine engine(policy);
  std::vector<int64_t> running(static_cast<size_t>(shape.trainers), 0);
  for (int64_t round = start; round < shape.now; round += lease_ms) {
    store.begin_immediate();
    for (int i = 0; i < shape.trainers; ++i) {
      const int64_t t = round + static_cast<int64_t>(i) * lease_ms / shape.trainers;
      if (t >= shape.now) break;
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
      spans[index].push_back({result.lease_id, t, shape.now + 1});
      ++out.leases;
    }
    store.write(engine, engine.take_changes());
    store.commit();
    engine.prune(round, 24 * kHourMs);
  }
  return spans;
}

// every hour before the last whole one summed up, as fold_heartbeats leaves it
int64_t summarised_mark(const Shape& shape) { return hour_of(shape.now - 10 * 60000); }

struct RawSample {
  int64_t lease_id, ts_ms, step, epoch, last_checkpoint_ms;
  double gpu_util;
};
constexpr double kMemoryUsedGib = 31.5, kDeviceMemoryUsedGib = 40.25, kProcessMemoryUsedGib = 38.5;

// The history's rows, the same for both backends: each hour's summary per lease (on_hour(lease, hour, summary)),
// then the raw samples of the retention period as trainers send them (on_raw(sample)).
template <class OnHour, class OnRaw>
void history_rows(const Spans& spans, const Policy& policy, const Shape& shape, OnHour on_hour, OnRaw on_raw) {
  const int64_t start = shape.now - int64_t{shape.days} * 24 * kHourMs;
  const auto lease_at = [&](int trainer, int64_t ts) -> const LeaseSpan* {
    const std::vector<LeaseSpan>& list = spans[static_cast<size_t>(trainer)];
    auto it = std::upper_bound(list.begin(), list.end(), ts,
                               [](int64_t value, const LeaseSpan& span) { return value < span.start_ms; });
    if (it == list.begin()) return nullptr;
    --it;
    return ts < it->end_ms ? &*it : nullptr;
  };
  const int64_t interval = int64_t{shape.interval_s} * 1000;
  // a trainer's samples: every interval from its first lease, each trainer a little apart
  const auto sample_ts = [&](int trainer, int64_t tick) { return tick + trainer * 37; };
  const int64_t mark = summarised_mark(shape);
  for (int64_t hour = hour_of(start); hour < mark; hour += kHourMs) {
    for (int i = 0; i < shape.trainers; ++i) {
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
      for (const auto& [id, summary] : by_lease) on_hour(id, hour, summary);
    }
  }
  const int64_t raw_from = hour_of(shape.now - int64_t{shape.retention_days} * 24 * kHourMs);
  for (int64_t tick = raw_from; tick < shape.now; tick += interval) {
    for (int i = 0; i < shape.trainers; ++i) {
      const int64_t ts = sample_ts(i, tick);
      const LeaseSpan* span = lease_at(i, ts);
      if (span == nullptr || ts >= shape.now) continue;
      const int64_t step = (ts - span->start_ms) / 500;
      on_raw(RawSample{span->id, ts, step, step / 2000, ts - ts % (30 * 60000), util_at(i, ts)});
    }
  }
}

Generated generate_sqlite(const std::string& path, const Policy& policy, const Shape& shape) {
  const Clock::time_point began = Clock::now();
  Generated out;
  Spans spans;
  {
    Store store(path);
    spans = write_leases(store, policy, shape, out);
  }
  Db db(path);
  db.exec("PRAGMA synchronous = OFF; PRAGMA cache_size = -500000; BEGIN");
  sqlite3_stmt* insert_hour = db.prepare(
      "INSERT INTO heartbeat_hours(lease_id, hour_ms, samples, first_ts_ms, first_util, last_ts_ms, last_util, "
      "util_micro_ms, covered_ms, low_held_ms, head_low_end_ms, tail_low_since_ms, wasted_ms, longest_low_ms, "
      "closed_runs, threshold, waste_after_ms) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)");
  // the raw rows of the retention period, as trainers send them (step, epoch, memory, where the figure came from)
  sqlite3_stmt* insert_raw = db.prepare(
      "INSERT INTO heartbeats(lease_id, ts_ms, step, epoch, gpu_util, memory_used_gib, last_checkpoint_ms, "
      "gpu_util_source, device_memory_used_gib, process_memory_used_gib) VALUES (?,?,?,?,?,?,?,'nvml',?,?)");
  history_rows(
      spans, policy, shape,
      [&](int64_t id, int64_t hour, const UtilSummary& s) {
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
        for (int c = 0; c < 17; ++c) sqlite3_bind_int64(insert_hour, c + 1, values[c]);
        sqlite3_bind_double(insert_hour, 5, s.first_util);
        sqlite3_bind_double(insert_hour, 7, s.last_util);
        sqlite3_bind_double(insert_hour, 16, s.threshold);
        db.step(insert_hour);
        ++out.hour_rows;
      },
      [&](const RawSample& r) {
        sqlite3_bind_int64(insert_raw, 1, r.lease_id);
        sqlite3_bind_int64(insert_raw, 2, r.ts_ms);
        sqlite3_bind_int64(insert_raw, 3, r.step);
        sqlite3_bind_int64(insert_raw, 4, r.epoch);
        sqlite3_bind_double(insert_raw, 5, r.gpu_util);
        sqlite3_bind_double(insert_raw, 6, kMemoryUsedGib);
        sqlite3_bind_int64(insert_raw, 7, r.last_checkpoint_ms);
        sqlite3_bind_double(insert_raw, 8, kDeviceMemoryUsedGib);
        sqlite3_bind_double(insert_raw, 9, kProcessMemoryUsedGib);
        db.step(insert_raw);
        ++out.raw_rows;
      });
  sqlite3_finalize(insert_hour);
  sqlite3_finalize(insert_raw);
  db.exec("INSERT OR REPLACE INTO meta(key, value) VALUES ('" + std::string(kHeartbeatsSummarisedKey) + "', '" +
          std::to_string(summarised_mark(shape)) + "'); COMMIT; PRAGMA wal_checkpoint(TRUNCATE)");
  out.seconds = seconds_since(began);
  return out;
}

// One libpq connection of the generator's own (bulk COPY, behind the store's back).
class Pg {
 public:
  explicit Pg(const std::string& url) : conn_(PQconnectdb(url.c_str())) {
    if (PQstatus(conn_) != CONNECTION_OK) throw std::runtime_error(url + ": " + PQerrorMessage(conn_));
  }
  ~Pg() { PQfinish(conn_); }
  Pg(const Pg&) = delete;
  Pg& operator=(const Pg&) = delete;
  std::string exec(const std::string& sql) {
    std::unique_ptr<PGresult, void (*)(PGresult*)> result(PQexec(conn_, sql.c_str()), PQclear);
    const ExecStatusType status = PQresultStatus(result.get());
    if (status != PGRES_COMMAND_OK && status != PGRES_TUPLES_OK && status != PGRES_COPY_IN) {
      throw std::runtime_error(sql.substr(0, 80) + ": " + PQerrorMessage(conn_));
    }
    return status == PGRES_TUPLES_OK && PQntuples(result.get()) > 0 ? PQgetvalue(result.get(), 0, 0) : "";
  }
  // COPY ... FROM STDIN in text format: begin, put lines (sent in large pieces), end.
  void copy_begin(const std::string& sql) { exec(sql); }
  void put(const std::string& line) {
    buffer_ += line;
    if (buffer_.size() > (4u << 20)) flush();
  }
  void copy_end() {
    flush();
    if (PQputCopyEnd(conn_, nullptr) != 1) throw std::runtime_error(std::string("COPY: ") + PQerrorMessage(conn_));
    for (PGresult* result; (result = PQgetResult(conn_)) != nullptr;) {
      const bool ok = PQresultStatus(result) == PGRES_COMMAND_OK;
      PQclear(result);
      if (!ok) throw std::runtime_error(std::string("COPY: ") + PQerrorMessage(conn_));
    }
  }

 private:
  void flush() {
    if (!buffer_.empty() && PQputCopyData(conn_, buffer_.data(), static_cast<int>(buffer_.size())) != 1) {
      throw std::runtime_error(std::string("COPY: ") + PQerrorMessage(conn_));
    }
    buffer_.clear();
  }
  PGconn* conn_;
  std::string buffer_;
};

std::string pg_number(int64_t value) { return std::to_string(value); }
std::string pg_number(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%.17g", value);
  return text;
}

Generated generate_postgres(const std::string& url, const Policy& policy, const Shape& shape) {
  const Clock::time_point began = Clock::now();
  Generated out;
  Spans spans;
  {
    PostgresStore store(url, "");
    spans = write_leases(store, policy, shape, out);
  }
  Pg pg(url);
  // bulk: the history's indexes dropped and rebuilt after the COPY (the migration's own definitions)
  pg.exec("SET synchronous_commit = off; SET maintenance_work_mem = '512MB'; BEGIN");
  pg.exec(
      "DROP INDEX heartbeats_lease; DROP INDEX heartbeats_ts; DROP INDEX heartbeat_hours_hour; "
      "ALTER TABLE heartbeat_hours DROP CONSTRAINT heartbeat_hours_pkey");
  pg.copy_begin(
      "COPY heartbeat_hours(lease_id, hour_ms, samples, first_ts_ms, first_util, last_ts_ms, last_util, "
      "util_micro_ms, covered_ms, low_held_ms, head_low_end_ms, tail_low_since_ms, wasted_ms, longest_low_ms, "
      "closed_runs, threshold, waste_after_ms) FROM STDIN");
  bool hours_done = false;
  history_rows(
      spans, policy, shape,
      [&](int64_t id, int64_t hour, const UtilSummary& s) {
        std::string line = pg_number(id);
        for (const std::string& field :
             {pg_number(hour), pg_number(int64_t{s.samples}), pg_number(s.first_ts_ms), pg_number(s.first_util),
              pg_number(s.last_ts_ms), pg_number(s.last_util), pg_number(s.util_micro_ms), pg_number(s.covered_ms),
              pg_number(s.low_held_ms), pg_number(s.head_low_end_ms), pg_number(s.tail_low_since_ms),
              pg_number(s.wasted_ms), pg_number(s.longest_low_ms), pg_number(s.closed_runs), pg_number(s.threshold),
              pg_number(s.waste_after_ms)}) {
          line += '\t';
          line += field;
        }
        line += '\n';
        pg.put(line);
        ++out.hour_rows;
      },
      [&](const RawSample& r) {
        if (!hours_done) {
          // the hours come first, all of them: the raw rows go to the next COPY
          pg.copy_end();
          pg.copy_begin(
              "COPY heartbeats(lease_id, ts_ms, step, epoch, gpu_util, memory_used_gib, last_checkpoint_ms, "
              "gpu_util_source, device_memory_used_gib, process_memory_used_gib) FROM STDIN");
          hours_done = true;
        }
        pg.put(pg_number(r.lease_id) + '\t' + pg_number(r.ts_ms) + '\t' + pg_number(r.step) + '\t' +
               pg_number(r.epoch) + '\t' + pg_number(r.gpu_util) + '\t' + pg_number(kMemoryUsedGib) + '\t' +
               pg_number(r.last_checkpoint_ms) + "\tnvml\t" + pg_number(kDeviceMemoryUsedGib) + '\t' +
               pg_number(kProcessMemoryUsedGib) + '\n');
        ++out.raw_rows;
      });
  pg.copy_end();
  pg.exec(
      "ALTER TABLE heartbeat_hours ADD PRIMARY KEY (lease_id, hour_ms); "
      "CREATE INDEX heartbeat_hours_hour ON heartbeat_hours(hour_ms); "
      "CREATE INDEX heartbeats_lease ON heartbeats(lease_id, ts_ms); "
      "CREATE INDEX heartbeats_ts ON heartbeats(ts_ms)");
  pg.exec("INSERT INTO meta(key, value) VALUES ('" + std::string(kHeartbeatsSummarisedKey) + "', '" +
          std::to_string(summarised_mark(shape)) + "') ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value");
  pg.exec("COMMIT");
  pg.exec("VACUUM ANALYZE");
  out.seconds = seconds_since(began);
  return out;
}

struct Start {
  double open_s = 0;     // Store: quick_check and the schema
  double service_s = 0;  // QuotaService: open, load, replay (what serve does before it listens)
  size_t running = 0;
};

// `path`: a SQLite file or a postgresql:// URL (QuotaService picks the backend from it the way quotad does).
Start measure_start(const std::string& path, bool postgres, const Policy& policy, int64_t now) {
  Start out;
  {
    const Clock::time_point began = Clock::now();
    std::unique_ptr<StateStore> store;
    if (postgres) {
      store = std::make_unique<PostgresStore>(path, "");
    } else {
      store = std::make_unique<Store>(path);
    }
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

json start_row(const char* name, const std::vector<Start>& starts) {
  std::vector<double> open, service;
  for (const Start& start : starts) {
    open.push_back(start.open_s);
    service.push_back(start.service_s);
  }
  return json{{"layout", name}, {"store_open_s", median(open)}, {"serve_start_s", median(service)}};
}

constexpr const char* kBounded = "bounded: hours summed up, last days raw";
constexpr const char* kUnsummed = "unsummed: every raw sample of a running lease replayed";
// as before bounded history: no mark, the running leases' samples all raw (their hours unsummed)
const std::string kUnsum = "DELETE FROM meta WHERE key = '" + std::string(kHeartbeatsSummarisedKey) +
                           "'; DELETE FROM heartbeat_hours WHERE lease_id IN (SELECT id FROM leases WHERE state = "
                           "'granted')";

void print_rows(const json& rows) {
  std::printf("\n%-56s %14s %16s\n", "layout", "store open (s)", "serve start (s)");
  for (const json& row : rows) {
    std::printf("%-56s %14.3f %16.3f\n", row["layout"].get<std::string>().c_str(), row["store_open_s"].get<double>(),
                row["serve_start_s"].get<double>());
  }
}

void print_generated(const Generated& generated, double gib) {
  std::printf("generated in %.1f s: %lld leases, %lld raw heartbeats, %lld hourly summaries, %.2f GiB\n",
              generated.seconds, static_cast<long long>(generated.leases), static_cast<long long>(generated.raw_rows),
              static_cast<long long>(generated.hour_rows), gib);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"quota_history_bench: quotad's start on a year of heartbeats, with bounded history"};
  int trainers = 200, days = 365, retention_days = 14, interval_s = 10, lease_hours = 72, repeats = 3;
  std::string dir = std::filesystem::temp_directory_path().string(), out = "quota_history_bench.json";
  std::string backend = "both";
  bool keep = false;
  app.add_option("--trainers", trainers, "trainers, each with one running lease of one GPU")
      ->check(CLI::Range(1, 4000));
  app.add_option("--days", days, "history length")->check(CLI::Range(1, 3650));
  app.add_option("--retention-days", retention_days, "raw heartbeats kept")->check(CLI::Range(1, 3650));
  app.add_option("--interval-s", interval_s, "heartbeat interval")->check(CLI::Range(1, 3600));
  app.add_option("--lease-hours", lease_hours, "each trainer's leases follow each other, this long")
      ->check(CLI::Range(1, 24 * 365));
  app.add_option("--repeats", repeats, "starts measured (the median is reported)")->check(CLI::Range(1, 20));
  app.add_option("--backend", backend, "the stores measured")->check(CLI::IsMember({"sqlite", "postgresql", "both"}));
  app.add_option("--dir", dir, "where the SQLite database goes");
  app.add_option("--out", out, "JSON results");
  app.add_flag("--keep", keep, "keep the SQLite database");
  CLI11_PARSE(app, argc, argv);

  const Policy policy = bench_policy(trainers);
  const int64_t now = 1795996800000 + 7 * kHourMs + 23 * 60000;  // a Monday morning, UTC
  const Shape shape{trainers, days, retention_days, interval_s, lease_hours, now};
  const bool sqlite = backend != "postgresql", postgresql = backend != "sqlite";
  std::printf("history: %d days of %d trainers (heartbeat every %d s, %d days raw)\n", days, trainers, interval_s,
              retention_days);
  json result{{"benchmark", "quota_history_bench"},
              {"date", utc_now()},
              {"cores", std::thread::hardware_concurrency()},
              {"trainers", trainers},
              {"days", days},
              {"retention_days", retention_days},
              {"heartbeat_interval_s", interval_s},
              {"lease_hours", lease_hours},
              {"repeats", repeats},
              {"goal_serve_start_s", 2.0}};
  bool goal = true;

  if (sqlite) {
    const std::string path = dir + "/quota_history_bench_" + std::to_string(::getpid()) + ".db";
    for (const char* suffix : {"", "-wal", "-shm"}) std::filesystem::remove(path + suffix);
    std::printf("\nSQLite: generating in %s\n", path.c_str());
    std::fflush(stdout);
    const Generated generated = generate_sqlite(path, policy, shape);
    const double file_gib = static_cast<double>(std::filesystem::file_size(path)) / (1024.0 * 1024 * 1024);
    print_generated(generated, file_gib);

    const auto run = [&](const char* name) {
      std::vector<Start> starts;
      for (int i = 0; i < repeats; ++i) starts.push_back(measure_start(path, false, policy, now));
      return start_row(name, starts);
    };
    json rows = json::array();
    rows.push_back(run(kBounded));
    Db(path).exec(kUnsum);
    rows.push_back(run(kUnsummed));
    const double full_check_s = full_quick_check_s(path);

    print_rows(rows);
    std::printf("%-56s %14.3f\n", "quick_check of the whole file (the open's, before)", full_check_s);
    std::printf(
        "before bounded history, a start on this file took about %.1f s (the whole-file check, then the "
        "unsummed replay)\n",
        full_check_s + rows[1]["serve_start_s"].get<double>() - rows[1]["store_open_s"].get<double>());
    const bool met = rows[0]["serve_start_s"].get<double>() <= 2.0;
    std::printf("SQLite goal (serve start <= 2 s with bounded history): %s\n", met ? "met" : "NOT met");
    goal = goal && met;
    result["leases"] = generated.leases;
    result["raw_heartbeats"] = generated.raw_rows;
    result["hourly_summaries"] = generated.hour_rows;
    result["database_gib"] = file_gib;
    result["generation_s"] = generated.seconds;
    result["starts"] = rows;
    result["whole_file_quick_check_s"] = full_check_s;
    if (!keep) {
      for (const char* suffix : {"", "-wal", "-shm"}) std::filesystem::remove(path + suffix);
    }
  }

  if (postgresql) {
    std::printf("\nPostgreSQL: starting a throwaway cluster (fsync on)\n");
    std::fflush(stdout);
    PostgresCluster cluster(PostgresCluster::Durability::kOn);
    const std::string url = cluster.fresh_database("quota_history");
    std::printf("PostgreSQL: generating (leases through the store, the history by COPY)\n");
    std::fflush(stdout);
    const Generated generated = generate_postgres(url, policy, shape);
    const double gib = std::stod(PostgresCluster::query_text(url, "SELECT pg_database_size(current_database())")) /
                       (1024.0 * 1024 * 1024);
    print_generated(generated, gib);

    const auto run = [&](const char* name) {
      std::vector<Start> starts;
      for (int i = 0; i < repeats; ++i) starts.push_back(measure_start(url, true, policy, now));
      return start_row(name, starts);
    };
    json rows = json::array();
    rows.push_back(run(kBounded));
    PostgresCluster::execute(url, kUnsum);
    rows.push_back(run(kUnsummed));
    print_rows(rows);
    const bool met = rows[0]["serve_start_s"].get<double>() <= 2.0;
    std::printf("PostgreSQL goal (serve start <= 2 s with bounded history): %s\n", met ? "met" : "NOT met");
    goal = goal && met;
    result["postgresql_starts"] = rows;
    result["postgresql"] =
        json{{"server", "the benchmark's own throwaway cluster (initdb, Unix socket)"},
             {"version", PostgresCluster::query_text(url, "SHOW server_version")},
             {"fsync", PostgresCluster::query_text(url, "SHOW fsync")},
             {"synchronous_commit", PostgresCluster::query_text(url, "SHOW synchronous_commit")},
             {"leases", generated.leases},
             {"raw_heartbeats", generated.raw_rows},
             {"hourly_summaries", generated.hour_rows},
             {"database_gib", gib},
             {"generation_s", generated.seconds},
             {"generation", "leases through PostgresStore; history by COPY, indexes rebuilt after it, VACUUM ANALYZE"}};
  }

  result["goal_met"] = goal;
  std::ofstream(out) << result.dump(2) << "\n";
  return 0;
}
