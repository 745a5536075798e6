#pragma once
// How the GPUs are used: per-lease utilisation folded from heartbeats, the waste list and per-team figures that
// /metrics, the status page and the report share. No I/O.
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "quota/core/engine.h"

namespace yolo8::quota {

// A utilisation in millionths: the integrals below are integers, so that they sum to the same value in any order
// (an hour folded into its summary, then the summaries added, gives what the samples one by one give).
inline int64_t util_micro(double util) { return std::llround(util * 1e6); }

// Utilisation history of one lease, folded sample by sample (no sample list kept).
struct LeaseUtil {
  int64_t first_ts_ms = -1;
  int64_t last_ts_ms = -1;
  double last_util = -1;
  int64_t low_since_ms = -1;   // start of the current run of samples below the threshold; -1 when not low
  int64_t util_micro_ms = 0;   // integral of utilisation (millionths) over time (sample-and-hold), for the average
  int64_t covered_ms = 0;      // time the integral covers
  int64_t low_held_ms = 0;     // the part of it a sample below the threshold held
  int64_t wasted_ms = 0;       // closed low runs that lasted at least the waste duration
  int64_t longest_low_ms = 0;  // longest low run, closed ones only
  int samples = 0;
  double util_ms() const { return static_cast<double>(util_micro_ms) / 1e6; }
  double avg_util() const { return covered_ms > 0 ? util_ms() / static_cast<double>(covered_ms) : last_util; }
  int64_t low_ms(int64_t now_ms) const { return low_since_ms < 0 ? 0 : now_ms - low_since_ms; }
};

// What one lease's samples over a span of time (an hour of its history) fold to, such that spans compose: the
// summaries of consecutive spans appended one after the other, or fed to UtilTracker::observe_summary, give
// exactly what the samples one by one give. Low runs go by the threshold and waste duration it was made with.
struct UtilSummary {
  double threshold = 0;
  int64_t waste_after_ms = 0;
  int samples = 0;
  int64_t first_ts_ms = -1;
  double first_util = -1;
  int64_t last_ts_ms = -1;
  double last_util = -1;
  int64_t util_micro_ms = 0;  // between the first and the last sample, as LeaseUtil's
  int64_t covered_ms = 0;
  int64_t low_held_ms = 0;
  // The first sample below the threshold: when the run it begins ends (the first sample at or above), -1 when
  // it lasts to the last sample. Its length depends on what came before, so it is not in wasted/longest.
  int64_t head_low_end_ms = -1;
  int64_t tail_low_since_ms = -1;  // the last sample below the threshold: where its run began; -1 otherwise
  int64_t wasted_ms = 0;           // runs that began after the first sample and ended before the last one's time
  int64_t longest_low_ms = 0;
  int64_t closed_runs = 0;  // how many such runs (for tests and stats)

  bool empty() const { return samples == 0; }
  bool first_low() const { return samples > 0 && first_util < threshold; }
  // Low from its first sample to its last.
  bool all_low() const { return first_low() && head_low_end_ms < 0; }
  // Adds one sample after the others (one earlier than the last is ignored, as UtilTracker ignores it; so is one
  // without a utilisation, < 0).
  void add(int64_t ts_ms, double gpu_util);
  // Appends the summary of the span that follows (made with the same threshold and duration).
  void append(const UtilSummary& next);
};

// The hour (UTC, ms) a sample time falls in.
inline int64_t hour_of(int64_t ts_ms) { return ts_ms - ((ts_ms % 3600000) + 3600000) % 3600000; }

// One stored heartbeat's utilisation sample (-1: the heartbeat had none).
struct UtilSample {
  int64_t lease_id = 0;
  int64_t ts_ms = 0;
  double util = -1;
};
// The samples (oldest first) summed up per (lease id, hour), low runs going by `threshold` and `waste_after_ms`.
std::map<std::pair<int64_t, int64_t>, UtilSummary> summarise_by_hour(const std::vector<UtilSample>& samples,
                                                                     double threshold, int64_t waste_after_ms);

// Folds heartbeat samples into LeaseUtil per lease; samples without a utilisation (< 0) are ignored.
class UtilTracker {
 public:
  UtilTracker(double threshold, int64_t waste_after_ms) : threshold_(threshold), waste_after_ms_(waste_after_ms) {}
  void observe(int64_t lease_id, int64_t ts_ms, double gpu_util);
  // Observes every sample a summary folds (a span after the lease's samples so far): low runs go by the summary's
  // threshold and duration, not this tracker's, where they differ. A span that begins before the last sample
  // observed is ignored.
  void observe_summary(int64_t lease_id, const UtilSummary& summary);
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
