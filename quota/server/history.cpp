#include "quota/server/history.h"

#include <sqlite3.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <map>
#include <memory>
#include <stdexcept>

#include "quota/core/codec.h"
#include "quota/server/read_db.h"

namespace yolo8::quota {

namespace {

using read_db::prepare;
using read_db::Query;

}  // namespace

UsageHistory load_history(const std::string& db_path, const Policy& policy, int64_t from_ms, int64_t to_ms) {
  UsageHistory history;
  history.from_ms = from_ms;
  history.to_ms = to_ms;
  const read_db::Db db = read_db::open(db_path);
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
