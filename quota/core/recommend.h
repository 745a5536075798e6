#pragma once
// Quotas recommended from history: per team, base and burst from the GPUs it held and waited for,
// its queue waits and its idle time, with the figures behind each number, and the change as a unified diff of
// the policy file. Pure: the history comes in (quotad recommend reads it from the store), no I/O.
#include <cstdint>
#include <string>
#include <vector>

#include "quota/core/policy.h"

namespace yolo8::quota {

// One lease of the history, clipped by nobody: the recommender clips to the window.
struct HistoryLease {
  int64_t id = 0;
  std::string team;
  double units = 0;        // GPUs (or memory share)
  int64_t created_ms = 0;  // the request
  int64_t granted_ms = 0;  // 0: never granted (cancelled, rejected, expired while queued)
  int64_t end_ms = 0;      // release / expiry / cancellation; the window's end while it runs
  bool emergency = false;  // critical leases count against no team
  // GPU-hours with utilisation samples, and those below the policy's waste threshold (sample and hold)
  double sampled_gpu_hours = 0;
  double idle_gpu_hours = 0;
};

struct UsageHistory {
  int64_t from_ms = 0, to_ms = 0;
  std::vector<HistoryLease> leases;
};

struct TeamRecommendation {
  std::string team;
  double current_base = 0, current_burst = 0;
  bool has_history = false;
  double active_share = 0;                 // share of the window with GPUs held or requested
  double p50_in_use = 0, p95_in_use = 0;   // time-weighted over the active time
  double peak_in_use = 0;                  // largest held at once
  double p95_demand = 0, peak_demand = 0;  // held + requested and waiting
  double gpu_hours = 0;                    // held within the window
  double sampled_gpu_hours = 0, idle_gpu_hours = 0;
  double idle_share = 0;  // idle / sampled; 0 without samples
  int granted_leases = 0;
  double p50_wait_s = 0, p95_wait_s = 0;  // request to grant
  double base = 0, burst = 0;             // proposed
  std::vector<std::string> why;           // one line per decision, with its figures
};

struct Recommendation {
  int64_t from_ms = 0, to_ms = 0;
  int capacity = 0;  // GPUs outside the emergency pool: the bases must fit in it
  std::vector<TeamRecommendation> teams;
  std::vector<std::string> notes;
};

// base = ceil(p50 of GPUs in use while active x (1 - idle share)); burst = max(base, ceil(p95 of GPUs in use +
// waiting)), both at most the capacity; bases scaled down (largest remainder) when their sum exceeds it. A team
// without history keeps its numbers.
Recommendation recommend(const Policy& policy, const UsageHistory& history);

// The figures and the reasoning, team by team.
std::string recommendation_text(const Recommendation& recommendation);

// The proposed change of `policy_text` (the file `policy_path`, whose parse is `policy`) as a unified diff
// ("--- path" / "+++ path", 3 lines of context) that `patch -p0` applies; "" when nothing changes. Values are
// replaced on the lines the policy's key_lines name; a missing `burst` is added next to `base`.
std::string policy_diff(const std::string& policy_text, const std::string& policy_path, const Policy& policy,
                        const Recommendation& recommendation);

}  // namespace yolo8::quota
