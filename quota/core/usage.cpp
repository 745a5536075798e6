#include "quota/core/usage.h"

#include <algorithm>
#include <set>

namespace yolo8::quota {

namespace {

bool running(const Lease& l) { return l.state == LeaseState::kGranted || l.state == LeaseState::kRevoking; }

}  // namespace

void UtilTracker::close_run(LeaseUtil& u, int64_t end_ms) {
  if (u.low_since_ms < 0) return;
  const int64_t run = std::max<int64_t>(0, end_ms - u.low_since_ms);
  u.longest_low_ms = std::max(u.longest_low_ms, run);
  if (run >= waste_after_ms_) u.wasted_ms += run;
  u.low_since_ms = -1;
}

void UtilTracker::observe(int64_t lease_id, int64_t ts_ms, double gpu_util) {
  if (!(gpu_util >= 0)) return;
  LeaseUtil& u = leases_[lease_id];
  if (u.last_ts_ms >= 0 && ts_ms < u.last_ts_ms) return;  // out of order: keep the fold monotonic
  if (u.last_ts_ms >= 0) {
    const int64_t dt = ts_ms - u.last_ts_ms;
    u.util_ms += u.last_util * double(dt);
    u.covered_ms += dt;
  } else {
    u.first_ts_ms = ts_ms;
  }
  const bool low = gpu_util < threshold_;
  if (low && u.low_since_ms < 0) u.low_since_ms = ts_ms;
  // a run ends when a sample at or above the threshold arrives
  if (!low) close_run(u, ts_ms);
  u.last_ts_ms = ts_ms;
  u.last_util = gpu_util;
  ++u.samples;
}

void UtilTracker::close(int64_t lease_id, int64_t end_ms) {
  auto it = leases_.find(lease_id);
  if (it == leases_.end()) return;
  LeaseUtil& u = it->second;
  if (end_ms > u.last_ts_ms && u.last_ts_ms >= 0) {
    u.util_ms += u.last_util * double(end_ms - u.last_ts_ms);
    u.covered_ms += end_ms - u.last_ts_ms;
    u.last_ts_ms = end_ms;
  }
  close_run(u, end_ms);
}

const LeaseUtil* UtilTracker::find(int64_t lease_id) const {
  auto it = leases_.find(lease_id);
  return it == leases_.end() ? nullptr : &it->second;
}

void sync_tracker(const Engine& engine, UtilTracker& tracker) {
  std::vector<int64_t> gone;
  for (const auto& [id, u] : tracker.leases()) {
    const Lease* l = engine.find(id);
    if (l == nullptr) gone.push_back(id);
    else if (is_terminal(l->state) && u.low_since_ms >= 0) tracker.close(id, l->ended_ms);
  }
  for (int64_t id : gone) tracker.forget(id);
}

std::vector<WasteEntry> waste_list(const Policy& policy, const Engine& engine, const UtilTracker& tracker,
                                   int64_t now_ms) {
  std::vector<WasteEntry> out;
  for (const auto& [id, l] : engine.leases()) {
    if (!running(l)) continue;
    const LeaseUtil* u = tracker.find(id);
    if (u == nullptr || u->low_since_ms < 0) continue;
    const int64_t low = u->low_ms(now_ms);
    if (low < tracker.waste_after_ms()) continue;
    WasteEntry w;
    w.lease_id = id;
    w.team = l.req.team;
    w.user = l.req.user;
    w.job = l.req.job;
    w.model = l.req.model;
    w.units = l.units(policy);
    w.low_ms = low;
    w.last_util = u->last_util;
    w.wasted_gpu_hours = w.units * double(low) / 3.6e6;
    out.push_back(w);
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const WasteEntry& a, const WasteEntry& b) { return a.wasted_gpu_hours > b.wasted_gpu_hours; });
  return out;
}

std::vector<TeamView> team_views(const Policy& policy, const Engine& engine, int64_t now_ms) {
  std::vector<TeamView> out;
  const std::string month = month_key(now_ms);
  for (const TeamStatus& s : engine.teams(now_ms)) {
    TeamView v;
    v.status = s;
    double util_w = 0, util_sum = 0;
    for (const auto& [id, l] : engine.leases()) {
      if (l.req.team != s.name || !running(l)) continue;
      if (l.shared) {
        v.memory_allocated_gib += l.memory_gib;
      } else {
        for (int d : l.devices) {
          if (d >= 0 && size_t(d) < policy.gpus.size()) v.memory_allocated_gib += policy.gpus[size_t(d)].memory_gib;
        }
      }
      if (l.telemetry.memory_used_gib >= 0) v.memory_used_gib += l.telemetry.memory_used_gib * (l.shared ? 1 : l.gpus);
      if (l.telemetry.gpu_util >= 0) {
        const double w = l.units(policy);
        util_w += w;
        util_sum += w * l.telemetry.gpu_util;
      }
    }
    if (util_w > 0) v.gpu_util = util_sum / util_w;
    std::set<std::string> users;
    for (const auto& [name, u] : policy.users) {
      if (u.team == s.name) users.insert(name);
    }
    for (const auto& [id, l] : engine.leases()) {
      if (l.req.team == s.name) users.insert(l.req.user);
    }
    for (const auto& u : users) v.gpu_hours_month += engine.used_gpu_hours(u, month, now_ms);
    out.push_back(v);
  }
  return out;
}

}  // namespace yolo8::quota
