#pragma once
// How the GPUs are used: per-lease utilisation folded from heartbeats, the waste list and per-team figures that
// /metrics, the status page and the report share. No I/O.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "quota/core/engine.h"

namespace yolo8::quota {

// Utilisation history of one lease, folded sample by sample (no sample list kept).
struct LeaseUtil {
  int64_t first_ts_ms = -1;
  int64_t last_ts_ms = -1;
  double last_util = -1;
  int64_t low_since_ms = -1;   // start of the current run of samples below the threshold; -1 when not low
  double util_ms = 0;          // integral of utilisation over time (sample-and-hold), for the average
  int64_t covered_ms = 0;      // time the integral covers
  int64_t wasted_ms = 0;       // closed low runs that lasted at least the waste duration
  int64_t longest_low_ms = 0;  // longest low run, closed ones only
  int samples = 0;
  double avg_util() const { return covered_ms > 0 ? util_ms / static_cast<double>(covered_ms) : last_util; }
  int64_t low_ms(int64_t now_ms) const { return low_since_ms < 0 ? 0 : now_ms - low_since_ms; }
};

// Folds heartbeat samples into LeaseUtil per lease; samples without a utilisation (< 0) are ignored.
class UtilTracker {
 public:
  UtilTracker(double threshold, int64_t waste_after_ms) : threshold_(threshold), waste_after_ms_(waste_after_ms) {}
  void observe(int64_t lease_id, int64_t ts_ms, double gpu_util);
  // Closes the lease's current low run at `end_ms` (the lease ended).
  void close(int64_t lease_id, int64_t end_ms);
  // The wall clock stepped by `step_ms` (Engine::clock_stepped): the samples' times move with it, so averages and
  // low runs go by the time that passed; a time the step would put after `now_ms` is capped at it.
  void clock_stepped(int64_t step_ms, int64_t now_ms);
  const LeaseUtil* find(int64_t lease_id) const;
  void forget(int64_t lease_id) { leases_.erase(lease_id); }
  const std::map<int64_t, LeaseUtil>& leases() const { return leases_; }
  double threshold() const { return threshold_; }
  int64_t waste_after_ms() const { return waste_after_ms_; }

 private:
  void close_run(LeaseUtil& util, int64_t end_ms);
  double threshold_;
  int64_t waste_after_ms_;
  std::map<int64_t, LeaseUtil> leases_;
};

// Closes the runs of leases that ended and forgets leases the engine no longer holds.
void sync_tracker(const Engine& engine, UtilTracker& tracker);

struct WasteEntry {
  int64_t lease_id = 0;
  std::string team, user, job, model;
  double units = 0;    // GPUs (or memory share) held
  int64_t low_ms = 0;  // time below the threshold so far
  double last_util = 0;
  double wasted_gpu_hours = 0;  // units * low time
};

// Running leases below the policy's utilisation threshold for at least its duration, most wasted first.
std::vector<WasteEntry> waste_list(const Policy& policy, const Engine& engine, const UtilTracker& tracker,
                                   int64_t now_ms);

// Per-team live figures shared by /metrics and the status page.
struct TeamView {
  TeamStatus status;
  double memory_allocated_gib = 0;  // what its running leases hold: whole GPUs, shares plus the process overhead
  double memory_used_gib = 0;       // reported peak per GPU times GPUs, leases that report it
  double gpu_util = -1;             // units-weighted mean of the latest reports; -1 when none
  double gpu_hours_month = 0;       // charged this month (UTC), running leases included
};
std::vector<TeamView> team_views(const Policy& policy, const Engine& engine, int64_t now_ms);

}  // namespace yolo8::quota
