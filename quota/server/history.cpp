#include "quota/server/history.h"

#include <sqlite3.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <map>
#include <memory>
#include <stdexcept>

#include "quota/core/codec.h"

namespace yolo8::quota {

namespace {

struct DbCloser {
  void operator()(sqlite3* db) const { sqlite3_close(db); }
};
struct StatementCloser {
  void operator()(sqlite3_stmt* statement) const { sqlite3_finalize(statement); }
};
using Query = std::unique_ptr<sqlite3_stmt, StatementCloser>;

Query prepare(sqlite3* db, const std::string& path, const char* sql) {
  sqlite3_stmt* statement = nullptr;
  if (sqlite3_prepare_v2(db, sql, -1, &statement, nullptr) != SQLITE_OK) {
    throw std::runtime_error(path + ": not a quotad database (" + sqlite3_errmsg(db) + ")");
  }
  return Query(statement);
}

}  // namespace

UsageHistory load_history(const std::string& db_path, const Policy& policy, int64_t from_ms, int64_t to_ms) {
  UsageHistory history;
  history.from_ms = from_ms;
  history.to_ms = to_ms;
  sqlite3* raw = nullptr;
  if (sqlite3_open_v2(db_path.c_str(), &raw, SQLITE_OPEN_READONLY, nullptr) != SQLITE_OK) {
    const std::string msg = raw ? sqlite3_errmsg(raw) : "out of memory";
    sqlite3_close(raw);
    throw std::runtime_error(db_path + ": cannot open the quota database: " + msg);
  }
  std::unique_ptr<sqlite3, DbCloser> db(raw);
  sqlite3_busy_timeout(db.get(), 10000);
  std::map<int64_t, size_t> index;  // lease id -> position in history.leases
  {
    Query query = prepare(db.get(), db_path,
                          "SELECT id, body FROM leases WHERE state NOT IN ('released','expired','rejected') OR "
                          "ended_ms >= ?");
    sqlite3_bind_int64(query.get(), 1, from_ms);
    while (sqlite3_step(query.get()) == SQLITE_ROW) {
      Lease lease;
      try {
        const unsigned char* body = sqlite3_column_text(query.get(), 1);
        lease = lease_from_json(nlohmann::json::parse(body == nullptr ? "" : reinterpret_cast<const char*>(body)));
      } catch (const std::exception& error) {
        throw std::runtime_error(db_path + ": table leases, row id " +
                                 std::to_string(sqlite3_column_int64(query.get(), 0)) + ": " + error.what());
      }
      if (lease.created_ms >= to_ms) continue;
      HistoryLease entry;
      entry.id = lease.id;
      entry.team = lease.req.team;
      entry.units = lease.units(policy);
      entry.created_ms = lease.created_ms;
      entry.granted_ms = lease.granted_ms;
      entry.end_ms = is_terminal(lease.state) ? lease.ended_ms : to_ms;
      entry.emergency = lease.emergency;
      index[lease.id] = history.leases.size();
      history.leases.push_back(entry);
    }
  }
  // utilisation samples, sample and hold: each one stands until the lease's next sample
  Query query = prepare(db.get(), db_path,
                        "SELECT lease_id, ts_ms, gpu_util FROM heartbeats WHERE ts_ms >= ? AND ts_ms < ? AND "
                        "gpu_util >= 0 ORDER BY lease_id, ts_ms");
  sqlite3_bind_int64(query.get(), 1, from_ms);
  sqlite3_bind_int64(query.get(), 2, to_ms);
  int64_t last_lease = -1, last_ts = 0;
  double last_util = 0;
  while (sqlite3_step(query.get()) == SQLITE_ROW) {
    const int64_t lease_id = sqlite3_column_int64(query.get(), 0);
    const int64_t ts = sqlite3_column_int64(query.get(), 1);
    const double util = sqlite3_column_double(query.get(), 2);
    auto it = index.find(lease_id);
    if (lease_id == last_lease && it != index.end()) {
      HistoryLease& lease = history.leases[it->second];
      const double gpu_hours = lease.units * static_cast<double>(ts - last_ts) / 3.6e6;
      lease.sampled_gpu_hours += gpu_hours;
      if (last_util < policy.waste_gpu_util_below) lease.idle_gpu_hours += gpu_hours;
    }
    last_lease = lease_id;
    last_ts = ts;
    last_util = util;
  }
  return history;
}

}  // namespace yolo8::quota
