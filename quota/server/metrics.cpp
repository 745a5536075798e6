#include "quota/server/metrics.h"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <sstream>

namespace yolo8::quota {

namespace {

bool running(const Lease& l) { return l.state == LeaseState::kGranted || l.state == LeaseState::kRevoking; }

// Shortest text that reads back the same double; integers without a decimal point.
std::string num(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  std::ostringstream os;
  os << std::setprecision(10) << v;
  return os.str();
}

}  // namespace

std::string prometheus_label(const std::string& value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

const std::vector<double>& MetricsState::wait_buckets_s() {
  static const std::vector<double> b = {1, 10, 60, 300, 900, 1800, 3600, 4 * 3600, 12 * 3600};
  return b;
}

const std::vector<double>& MetricsState::duration_buckets_s() {
  static const std::vector<double> b = {60, 600, 1800, 3600, 4 * 3600, 12 * 3600, 24 * 3600, 72 * 3600};
  return b;
}

namespace {

const std::vector<double>& util_buckets() {
  static const std::vector<double> b = {0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0};
  return b;
}

void observe(MetricsState::Histogram& h, const std::vector<double>& bounds, double v) {
  if (h.counts.size() != bounds.size()) h.counts.assign(bounds.size(), 0);
  for (size_t i = 0; i < bounds.size(); ++i) {
    if (v <= bounds[i]) {
      ++h.counts[i];
      break;
    }
  }
  ++h.count;
  h.sum += v;
}

}  // namespace

void MetricsState::observe_leases(const Engine& engine, const UtilTracker& tracker) {
  for (const auto& [id, l] : engine.leases()) {
    if (l.granted_ms > 0 && waited_.insert(id).second) {
      observe(queue_wait, wait_buckets_s(), double(std::max<int64_t>(0, l.granted_ms - l.created_ms)) / 1000.0);
    }
    if (is_terminal(l.state) && l.granted_ms > 0 && ended_.insert(id).second) {
      observe(job_duration, duration_buckets_s(), double(std::max<int64_t>(0, l.ended_ms - l.granted_ms)) / 1000.0);
      if (const LeaseUtil* u = tracker.find(id); u != nullptr && u->samples > 0) {
        observe(job_util, util_buckets(), u->avg_util());
      }
    }
  }
  // ids below the oldest lease still in memory can never come back
  if (!engine.leases().empty()) {
    const int64_t oldest = engine.leases().begin()->first;
    waited_.erase(waited_.begin(), waited_.lower_bound(oldest));
    ended_.erase(ended_.begin(), ended_.lower_bound(oldest));
  }
}

namespace {

class Writer {
 public:
  explicit Writer(std::ostringstream& os) : os_(os) {}
  void family(const std::string& name, const char* type, const std::string& help) {
    os_ << "# HELP " << name << " " << help << "\n# TYPE " << name << " " << type << "\n";
  }
  void sample(const std::string& name, const std::vector<std::pair<std::string, std::string>>& labels, double v) {
    os_ << name;
    if (!labels.empty()) {
      os_ << "{";
      for (size_t i = 0; i < labels.size(); ++i) {
        os_ << (i ? "," : "") << labels[i].first << "=\"" << prometheus_label(labels[i].second) << "\"";
      }
      os_ << "}";
    }
    os_ << " " << num(v) << "\n";
  }
  void histogram(const std::string& name, const std::string& help, const MetricsState::Histogram& h,
                 const std::vector<double>& bounds) {
    family(name, "histogram", help);
    uint64_t cum = 0;
    for (size_t i = 0; i < bounds.size(); ++i) {
      cum += i < h.counts.size() ? h.counts[i] : 0;
      sample(name + "_bucket", {{"le", num(bounds[i])}}, double(cum));
    }
    sample(name + "_bucket", {{"le", "+Inf"}}, double(h.count));
    sample(name + "_sum", {}, h.sum);
    sample(name + "_count", {}, double(h.count));
  }

 private:
  std::ostringstream& os_;
};

}  // namespace

std::string render_metrics(const Policy& policy, const Engine& engine, const UtilTracker& tracker,
                           MetricsState& state, int64_t now_ms) {
  state.observe_leases(engine, tracker);
  std::ostringstream os;
  Writer w(os);
  const std::string month = month_key(now_ms);

  w.family("quotad_gpus_total", "gauge", "GPUs in the inventory.");
  w.sample("quotad_gpus_total", {}, policy.total_gpus());
  w.family("quotad_emergency_pool_gpus", "gauge", "GPUs reserved for critical leases.");
  w.sample("quotad_emergency_pool_gpus", {}, policy.emergency_pool_gpus());

  const auto teams = team_views(policy, engine, now_ms);
  auto team_gauge = [&](const std::string& name, const std::string& help, auto value) {
    w.family(name, "gauge", help);
    for (const auto& t : teams) w.sample(name, {{"team", t.status.name}}, value(t));
  };
  team_gauge("quotad_team_gpus_in_use", "GPUs a team holds (a shared lease counts its memory share).",
             [](const TeamView& t) { return t.status.in_use; });
  team_gauge("quotad_team_base_gpus", "Guaranteed GPUs of a team.", [](const TeamView& t) { return t.status.base; });
  team_gauge("quotad_team_burst_gpus", "GPU limit of a team inside its burst windows.",
             [](const TeamView& t) { return t.status.burst; });
  team_gauge("quotad_team_quota_gpus", "GPU limit in force now (burst inside a window, base outside).",
             [](const TeamView& t) { return t.status.limit_now; });
  team_gauge("quotad_team_in_burst_window", "1 while a burst window of the team is open.",
             [](const TeamView& t) { return t.status.in_burst_window ? 1.0 : 0.0; });
  team_gauge("quotad_team_memory_allocated_gib", "GPU memory held by the team's running leases.",
             [](const TeamView& t) { return t.memory_allocated_gib; });
  team_gauge("quotad_team_memory_used_gib", "GPU memory the team's running leases report using (peak per GPU x GPUs).",
             [](const TeamView& t) { return t.memory_used_gib; });
  team_gauge("quotad_team_active_leases", "Running (granted or revoking) leases of a team.",
             [](const TeamView& t) { return double(t.status.leases_active); });
  team_gauge("quotad_team_queued", "Queued requests of a team.", [](const TeamView& t) { return double(t.status.queued); });
  w.family("quotad_team_gpu_utilization", "gauge",
           "GPU-weighted mean of the latest utilisation (0..1) reported by the team's running leases.");
  for (const auto& t : teams) {
    if (t.gpu_util >= 0) w.sample("quotad_team_gpu_utilization", {{"team", t.status.name}}, t.gpu_util);
  }
  w.family("quotad_team_gpu_hours", "gauge", "GPU-hours charged to the team's members this month (UTC), running leases included.");
  for (const auto& t : teams) w.sample("quotad_team_gpu_hours", {{"team", t.status.name}, {"month", month}}, t.gpu_hours_month);

  // queue
  int queued = 0;
  double oldest_wait_s = 0;
  for (const auto& [id, l] : engine.leases()) {
    if (l.state != LeaseState::kQueued) continue;
    ++queued;
    oldest_wait_s = std::max(oldest_wait_s, double(now_ms - l.created_ms) / 1000.0);
  }
  w.family("quotad_queue_length", "gauge", "Requests waiting in the queue.");
  w.sample("quotad_queue_length", {}, queued);
  w.family("quotad_queue_oldest_wait_seconds", "gauge", "How long the longest-waiting queued request has waited.");
  w.sample("quotad_queue_oldest_wait_seconds", {}, oldest_wait_s);
  w.family("quotad_queue_wait_seconds_current", "gauge", "Wait so far of each queued request.");
  for (const auto& [id, l] : engine.leases()) {
    if (l.state != LeaseState::kQueued) continue;
    w.sample("quotad_queue_wait_seconds_current", {{"lease", std::to_string(id)}, {"team", l.req.team}, {"user", l.req.user}},
             double(now_ms - l.created_ms) / 1000.0);
  }
  w.histogram("quotad_queue_wait_seconds", "Time from request to grant of granted leases.", state.queue_wait,
              MetricsState::wait_buckets_s());

  // leases
  std::map<std::string, int> by_state;
  for (auto s : {LeaseState::kPendingApproval, LeaseState::kQueued, LeaseState::kGranted, LeaseState::kRevoking,
                 LeaseState::kReleased, LeaseState::kExpired, LeaseState::kRejected}) {
    by_state[to_string(s)] = 0;
  }
  for (const auto& [id, l] : engine.leases()) ++by_state[to_string(l.state)];
  w.family("quotad_leases", "gauge", "Leases in memory by state (ended ones for a day).");
  for (const auto& [s, count] : by_state) w.sample("quotad_leases", {{"state", s}}, count);

  w.family("quotad_lease_gpus", "gauge", "GPUs (or memory share) held by each running lease.");
  for (const auto& [id, l] : engine.leases()) {
    if (!running(l)) continue;
    w.sample("quotad_lease_gpus",
             {{"lease", std::to_string(id)}, {"team", l.req.team}, {"user", l.req.user}, {"job", l.req.job}},
             l.units(policy));
  }
  w.family("quotad_lease_runtime_seconds", "gauge", "Time since grant of each running lease.");
  for (const auto& [id, l] : engine.leases()) {
    if (!running(l)) continue;
    w.sample("quotad_lease_runtime_seconds",
             {{"lease", std::to_string(id)}, {"team", l.req.team}, {"user", l.req.user}, {"job", l.req.job}},
             double(now_ms - l.granted_ms) / 1000.0);
  }
  w.family("quotad_lease_gpu_utilization", "gauge", "Latest GPU utilisation (0..1) reported by each running lease.");
  for (const auto& [id, l] : engine.leases()) {
    if (!running(l) || l.telemetry.gpu_util < 0) continue;
    w.sample("quotad_lease_gpu_utilization",
             {{"lease", std::to_string(id)}, {"team", l.req.team}, {"user", l.req.user}, {"job", l.req.job}},
             l.telemetry.gpu_util);
  }
  w.family("quotad_lease_avg_gpu_utilization", "gauge", "Time-weighted mean GPU utilisation of each running lease so far.");
  for (const auto& [id, l] : engine.leases()) {
    const LeaseUtil* u = tracker.find(id);
    if (!running(l) || u == nullptr || u->samples == 0) continue;
    w.sample("quotad_lease_avg_gpu_utilization",
             {{"lease", std::to_string(id)}, {"team", l.req.team}, {"user", l.req.user}, {"job", l.req.job}},
             u->avg_util());
  }
  w.histogram("quotad_job_duration_seconds", "Time from grant to end of ended leases.", state.job_duration,
              MetricsState::duration_buckets_s());
  w.histogram("quotad_job_gpu_utilization", "Mean GPU utilisation (0..1) of ended leases that reported it.",
              state.job_util, util_buckets());

  // credits
  std::set<std::string> members;
  for (const auto& [key, hours] : engine.usage()) {
    if (key.second == month) members.insert(key.first);
  }
  for (const auto& [id, l] : engine.leases()) {
    if (running(l)) members.insert(l.req.user);
  }
  auto team_of = [&](const std::string& user) {
    auto it = policy.users.find(user);
    return it == policy.users.end() ? std::string() : it->second.team;
  };
  w.family("quotad_member_gpu_hours", "gauge", "GPU-hours charged to a member this month (UTC), running leases included.");
  for (const auto& m : members) {
    w.sample("quotad_member_gpu_hours", {{"user", m}, {"team", team_of(m)}, {"month", month}},
             engine.used_gpu_hours(m, month, now_ms));
  }
  w.family("quotad_member_credit_gpu_hours", "gauge", "GPU-hours a member may use this month (loan included).");
  for (const auto& m : members) {
    w.sample("quotad_member_credit_gpu_hours", {{"user", m}, {"team", team_of(m)}, {"month", month}},
             engine.credit_allowance(m, month, now_ms));
  }

  // waste
  const auto waste = waste_list(policy, engine, tracker, now_ms);
  w.family("quotad_waste_threshold_gpu_utilization", "gauge", "Utilisation below which a running lease counts as idle.");
  w.sample("quotad_waste_threshold_gpu_utilization", {}, policy.waste_gpu_util_below);
  w.family("quotad_waste_threshold_seconds", "gauge", "How long a lease must stay below the threshold to be listed.");
  w.sample("quotad_waste_threshold_seconds", {}, policy.waste_after_s);
  w.family("quotad_waste_leases", "gauge", "Running leases on the waste list.");
  w.sample("quotad_waste_leases", {}, double(waste.size()));
  w.family("quotad_waste_low_utilization_seconds", "gauge",
           "Waste list: how long each listed lease has stayed below the utilisation threshold.");
  for (const auto& e : waste) {
    w.sample("quotad_waste_low_utilization_seconds",
             {{"lease", std::to_string(e.lease_id)}, {"team", e.team}, {"user", e.user}, {"job", e.job}},
             double(e.low_ms) / 1000.0);
  }
  w.family("quotad_waste_gpu_hours", "gauge", "Waste list: GPU-hours each listed lease has held below the threshold.");
  for (const auto& e : waste) {
    w.sample("quotad_waste_gpu_hours",
             {{"lease", std::to_string(e.lease_id)}, {"team", e.team}, {"user", e.user}, {"job", e.job}},
             e.wasted_gpu_hours);
  }

  // service counters
  w.family("quotad_heartbeats_total", "counter", "Heartbeats answered.");
  w.sample("quotad_heartbeats_total", {}, double(state.heartbeats));
  w.family("quotad_preemptions_total", "counter", "Leases revoked for a waiting request.");
  w.sample("quotad_preemptions_total", {}, double(state.preemptions));
  w.family("quotad_emergency_grants_total", "counter", "Critical leases granted.");
  w.sample("quotad_emergency_grants_total", {}, double(state.emergency_grants));
  w.family("quotad_responses_total", "counter", "API responses by HTTP status.");
  for (const auto& [code, count] : state.responses) {
    if (count > 0) w.sample("quotad_responses_total", {{"code", std::to_string(code)}}, double(count));
  }
  return os.str();
}

std::vector<std::string> exported_metric_names() {
  std::vector<std::string> names = {
      "quotad_gpus_total", "quotad_emergency_pool_gpus", "quotad_team_gpus_in_use", "quotad_team_base_gpus",
      "quotad_team_burst_gpus", "quotad_team_quota_gpus", "quotad_team_in_burst_window",
      "quotad_team_memory_allocated_gib", "quotad_team_memory_used_gib", "quotad_team_active_leases",
      "quotad_team_queued", "quotad_team_gpu_utilization", "quotad_team_gpu_hours", "quotad_queue_length",
      "quotad_queue_oldest_wait_seconds", "quotad_queue_wait_seconds_current", "quotad_leases", "quotad_lease_gpus",
      "quotad_lease_runtime_seconds", "quotad_lease_gpu_utilization", "quotad_lease_avg_gpu_utilization",
      "quotad_member_gpu_hours", "quotad_member_credit_gpu_hours", "quotad_waste_threshold_gpu_utilization",
      "quotad_waste_threshold_seconds", "quotad_waste_leases", "quotad_waste_low_utilization_seconds",
      "quotad_waste_gpu_hours", "quotad_heartbeats_total", "quotad_preemptions_total",
      "quotad_emergency_grants_total", "quotad_responses_total"};
  for (const char* h : {"quotad_queue_wait_seconds", "quotad_job_duration_seconds", "quotad_job_gpu_utilization"}) {
    for (const char* suffix : {"_bucket", "_sum", "_count"}) names.push_back(std::string(h) + suffix);
  }
  return names;
}

std::string MetricsExporter::text() {
  std::lock_guard<std::mutex> lock(mu_);
  std::string text;
  service_.observe([&](const ServiceView& view) {
    state_.heartbeats = view.counters.heartbeats;
    state_.preemptions = view.counters.preemptions;
    state_.emergency_grants = view.counters.emergency_grants;
    state_.responses = view.counters.responses;
    text = render_metrics(view.policy, view.engine, view.tracker, state_, view.now_ms);
  });
  return text;
}

}  // namespace yolo8::quota
