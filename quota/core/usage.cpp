#include "quota/core/usage.h"

#include <algorithm>
#include <set>

namespace yolo8::quota {

namespace {

bool running(const Lease& lease) { return lease.state == LeaseState::kGranted || lease.state == LeaseState::kRevoking; }

}  // namespace

void UtilTracker::close_run(LeaseUtil& util, int64_t end_ms) {
  if (util.low_since_ms < 0) return;
  const int64_t run = std::max<int64_t>(0, end_ms - util.low_since_ms);
  util.longest_low_ms = std::max(util.longest_low_ms, run);
  if (run >= waste_after_ms_) util.wasted_ms += run;
  util.low_since_ms = -1;
}

void UtilTracker::observe(int64_t lease_id, int64_t ts_ms, double gpu_util) {
  if (!(gpu_util >= 0)) return;
  LeaseUtil& util = leases_[lease_id];
  if (util.last_ts_ms >= 0 && ts_ms < util.last_ts_ms) return;  // out of order: keep the fold monotonic
  if (util.last_ts_ms >= 0) {
    const int64_t elapsed_ms = ts_ms - util.last_ts_ms;
    util.util_micro_ms += util_micro(util.last_util) * elapsed_ms;
    util.covered_ms += elapsed_ms;
    if (util.last_util < threshold_) util.low_held_ms += elapsed_ms;
  } else {
    util.first_ts_ms = ts_ms;
  }
  const bool low = gpu_util < threshold_;
  if (low && util.low_since_ms < 0) util.low_since_ms = ts_ms;
  // a run ends when a sample at or above the threshold arrives
  if (!low) close_run(util, ts_ms);
  util.last_ts_ms = ts_ms;
  util.last_util = gpu_util;
  ++util.samples;
}

void UtilTracker::observe_summary(int64_t lease_id, const UtilSummary& summary) {
  if (summary.empty()) return;
  LeaseUtil& util = leases_[lease_id];
  if (util.last_ts_ms >= 0 && summary.first_ts_ms < util.last_ts_ms) return;  // as observe() keeps the fold monotonic
  if (util.last_ts_ms >= 0) {
    const int64_t gap_ms = summary.first_ts_ms - util.last_ts_ms;
    util.util_micro_ms += util_micro(util.last_util) * gap_ms;
    util.covered_ms += gap_ms;
    if (util.last_util < threshold_) util.low_held_ms += gap_ms;
  } else {
    util.first_ts_ms = summary.first_ts_ms;
  }
  // the run that crosses into the span, or the one the span's first sample begins
  if (util.low_since_ms >= 0) {
    if (!summary.first_low()) {
      close_run(util, summary.first_ts_ms);
    } else if (summary.head_low_end_ms >= 0) {
      close_run(util, summary.head_low_end_ms);
    }
  } else if (summary.first_low() && summary.head_low_end_ms >= 0) {
    util.low_since_ms = summary.first_ts_ms;
    close_run(util, summary.head_low_end_ms);
  }
  util.wasted_ms += summary.wasted_ms;
  util.longest_low_ms = std::max(util.longest_low_ms, summary.longest_low_ms);
  if (summary.tail_low_since_ms < 0) {
    util.low_since_ms = -1;
  } else if (!(summary.all_low() && util.low_since_ms >= 0)) {
    util.low_since_ms = summary.tail_low_since_ms;
  }
  util.util_micro_ms += summary.util_micro_ms;
  util.covered_ms += summary.covered_ms;
  util.low_held_ms += summary.low_held_ms;
  util.samples += summary.samples;
  util.last_ts_ms = summary.last_ts_ms;
  util.last_util = summary.last_util;
}

void UtilSummary::add(int64_t ts_ms, double gpu_util) {
  if (!(gpu_util >= 0)) return;
  UtilSummary one;
  one.threshold = threshold;
  one.waste_after_ms = waste_after_ms;
  one.samples = 1;
  one.first_ts_ms = one.last_ts_ms = ts_ms;
  one.first_util = one.last_util = gpu_util;
  if (gpu_util < threshold) one.tail_low_since_ms = ts_ms;
  append(one);
}

void UtilSummary::append(const UtilSummary& next) {
  if (next.empty()) return;
  if (empty()) {
    *this = next;
    return;
  }
  if (next.first_ts_ms < last_ts_ms) return;
  const auto close_run = [&](int64_t run_ms) {
    longest_low_ms = std::max(longest_low_ms, run_ms);
    if (run_ms >= waste_after_ms) wasted_ms += run_ms;
    ++closed_runs;
  };
  const int64_t gap_ms = next.first_ts_ms - last_ts_ms;
  const bool tail_low = tail_low_since_ms >= 0;
  const bool was_all_low = all_low();
  util_micro_ms += util_micro(last_util) * gap_ms + next.util_micro_ms;
  covered_ms += gap_ms + next.covered_ms;
  low_held_ms += (tail_low ? gap_ms : 0) + next.low_held_ms;
  // the seam: this span's last run goes on into the next one, or ends at its first sample at or above
  const int64_t seam_end_ms = !next.first_low() ? next.first_ts_ms : next.head_low_end_ms;
  if (tail_low) {
    if (seam_end_ms >= 0) {
      if (was_all_low) {
        head_low_end_ms = seam_end_ms;  // still the leading run: its start depends on what came before
      } else {
        close_run(seam_end_ms - tail_low_since_ms);
      }
    }
  } else if (next.first_low() && next.head_low_end_ms >= 0) {
    close_run(next.head_low_end_ms - next.first_ts_ms);
  }
  wasted_ms += next.wasted_ms;
  longest_low_ms = std::max(longest_low_ms, next.longest_low_ms);
  closed_runs += next.closed_runs;
  tail_low_since_ms = tail_low && next.all_low() ? tail_low_since_ms : next.tail_low_since_ms;
  samples += next.samples;
  last_ts_ms = next.last_ts_ms;
  last_util = next.last_util;
}

std::map<std::pair<int64_t, int64_t>, UtilSummary> summarise_by_hour(const std::vector<UtilSample>& samples,
                                                                     double threshold, int64_t waste_after_ms) {
  std::map<std::pair<int64_t, int64_t>, UtilSummary> hours;
  for (const UtilSample& sample : samples) {
    auto [it, fresh] = hours.try_emplace({sample.lease_id, hour_of(sample.ts_ms)});
    if (fresh) {
      it->second.threshold = threshold;
      it->second.waste_after_ms = waste_after_ms;
    }
    it->second.add(sample.ts_ms, sample.util);
  }
  return hours;
}

void UtilTracker::close(int64_t lease_id, int64_t end_ms) {
  auto it = leases_.find(lease_id);
  if (it == leases_.end()) return;
  LeaseUtil& util = it->second;
  if (end_ms > util.last_ts_ms && util.last_ts_ms >= 0) {
    util.util_micro_ms += util_micro(util.last_util) * (end_ms - util.last_ts_ms);
    util.covered_ms += end_ms - util.last_ts_ms;
    if (util.last_util < threshold_) util.low_held_ms += end_ms - util.last_ts_ms;
    util.last_ts_ms = end_ms;
  }
  close_run(util, end_ms);
}

void UtilTracker::clock_stepped(int64_t step_ms, int64_t now_ms) {
  auto moved = [&](int64_t& t) {
    if (t >= 0) t = std::min(now_ms, t + step_ms);
  };
  for (auto& [id, util] : leases_) {
    moved(util.first_ts_ms);
    moved(util.last_ts_ms);
    moved(util.low_since_ms);
  }
}

const LeaseUtil* UtilTracker::find(int64_t lease_id) const {
  auto it = leases_.find(lease_id);
  return it == leases_.end() ? nullptr : &it->second;
}

void sync_tracker(const Engine& engine, UtilTracker& tracker) {
  std::vector<int64_t> gone;
  for (const auto& [id, util] : tracker.leases()) {
    const Lease* lease = engine.find(id);
    if (lease == nullptr) {
      gone.push_back(id);
    } else if (is_terminal(lease->state) && util.low_since_ms >= 0) {
      tracker.close(id, lease->ended_ms);
    }
  }
  for (int64_t id : gone) tracker.forget(id);
}

std::vector<WasteEntry> waste_list(const Policy& policy, const Engine& engine, const UtilTracker& tracker,
                                   int64_t now_ms) {
  std::vector<WasteEntry> out;
  for (const auto& [id, lease] : engine.leases()) {
    if (!running(lease)) continue;
    const LeaseUtil* util = tracker.find(id);
    if (util == nullptr || util->low_since_ms < 0) continue;
    const int64_t low = util->low_ms(now_ms);
    if (low < tracker.waste_after_ms()) continue;
    WasteEntry entry;
    entry.lease_id = id;
    entry.team = lease.req.team;
    entry.user = lease.req.user;
    entry.job = lease.req.job;
    entry.model = lease.req.model;
    entry.units = lease.units(policy);
    entry.low_ms = low;
    entry.last_util = util->last_util;
    entry.wasted_gpu_hours = entry.units * static_cast<double>(low) / 3.6e6;
    out.push_back(entry);
  }
  std::stable_sort(out.begin(), out.end(), [](const WasteEntry& left, const WasteEntry& right) {
    return left.wasted_gpu_hours > right.wasted_gpu_hours;
  });
  return out;
}

std::vector<TeamView> team_views(const Policy& policy, const Engine& engine, int64_t now_ms) {
  std::vector<TeamView> out;
  const std::string month = month_key(now_ms);
  for (const TeamStatus& status : engine.teams(now_ms)) {
    TeamView view;
    view.status = status;
    double util_weight = 0, util_sum = 0;
    for (const auto& [id, lease] : engine.leases()) {
      if (lease.req.team != status.name || !running(lease)) continue;
      if (lease.shared) {
        // what the lease takes of its card, as placement counts it: the share and the process's overhead
        view.memory_allocated_gib += lease.memory_gib + policy.shared_overhead_gib();
      } else {
        for (int device : lease.devices) {
          if (device >= 0 && static_cast<size_t>(device) < policy.gpus.size()) {
            view.memory_allocated_gib += policy.gpus[static_cast<size_t>(device)].memory_gib;
          }
        }
      }
      if (lease.telemetry.memory_used_gib >= 0) {
        view.memory_used_gib += lease.telemetry.memory_used_gib * (lease.shared ? 1 : lease.gpus);
      }
      if (lease.telemetry.gpu_util >= 0) {
        const double weight = lease.units(policy);
        util_weight += weight;
        util_sum += weight * lease.telemetry.gpu_util;
      }
    }
    if (util_weight > 0) view.gpu_util = util_sum / util_weight;
    std::set<std::string> users;
    for (const auto& [name, user] : policy.users) {
      if (user.team == status.name) users.insert(name);
    }
    for (const auto& [id, lease] : engine.leases()) {
      if (lease.req.team == status.name) users.insert(lease.req.user);
    }
    for (const auto& user : users) view.gpu_hours_month += engine.used_gpu_hours(user, month, now_ms);
    out.push_back(view);
  }
  return out;
}

}  // namespace yolo8::quota
