#include "quota/server/history.h"

#include <map>
#include <memory>

#include "quota/store/store.h"

namespace yolo8::quota {

UsageHistory load_history(const std::string& db, const Policy& policy, int64_t from_ms, int64_t to_ms) {
  const std::unique_ptr<ReportReader> reader = open_report_reader(parse_db_target(db));
  return load_history(*reader, policy, from_ms, to_ms);
}

UsageHistory load_history(ReportReader& reader, const Policy& policy, int64_t from_ms, int64_t to_ms) {
  UsageHistory history;
  history.from_ms = from_ms;
  history.to_ms = to_ms;
  std::map<int64_t, size_t> index;  // lease id -> position in history.leases
  for (const Lease& lease : reader.leases_since(from_ms)) {
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
  // utilisation samples, sample and hold: each one stands until the lease's next sample; from a whole hour, so
  // that heartbeats folded into hourly summaries read the same
  UtilTracker tracker(policy.waste_gpu_util_below, static_cast<int64_t>(policy.waste_after_s) * 1000);
  reader.fold_util(hour_of(from_ms), to_ms, tracker);
  for (const auto& [id, util] : tracker.leases()) {
    auto it = index.find(id);
    if (it == index.end()) continue;
    HistoryLease& lease = history.leases[it->second];
    lease.sampled_gpu_hours = lease.units * static_cast<double>(util.covered_ms) / 3.6e6;
    lease.idle_gpu_hours = lease.units * static_cast<double>(util.low_held_ms) / 3.6e6;
  }
  return history;
}

}  // namespace yolo8::quota
