#include "quota/server/metrics.h"

#include <algorithm>
#include <cmath>
#include <iomanip>
#include <sstream>

namespace yolo8::quota {

namespace {

bool running(const Lease& lease) { return lease.state == LeaseState::kGranted || lease.state == LeaseState::kRevoking; }

// Shortest text that reads back the same double; integers without a decimal point.
std::string num(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  std::ostringstream stream;
  stream << std::setprecision(10) << value;
  return stream.str();
}

}  // namespace

std::string prometheus_label(const std::string& value) {
  std::string out;
  out.reserve(value.size());
  for (char character : value) {
    if (character == '\\') {
      out += "\\\\";
    } else if (character == '"') {
      out += "\\\"";
    } else if (character == '\n') {
      out += "\\n";
    } else {
      out += character;
    }
  }
  return out;
}

const std::vector<double>& MetricsState::wait_buckets_s() {
  static const std::vector<double> buckets = {1, 10, 60, 300, 900, 1800, 3600, 4 * 3600, 12 * 3600};
  return buckets;
}

const std::vector<double>& MetricsState::duration_buckets_s() {
  static const std::vector<double> buckets = {60, 600, 1800, 3600, 4 * 3600, 12 * 3600, 24 * 3600, 72 * 3600};
  return buckets;
}

namespace {

const std::vector<double>& util_buckets() {
  static const std::vector<double> buckets = {0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0};
  return buckets;
}

void observe(MetricsState::Histogram& distribution, const std::vector<double>& bounds, double value) {
  if (distribution.counts.size() != bounds.size()) distribution.counts.assign(bounds.size(), 0);
  for (size_t i = 0; i < bounds.size(); ++i) {
    if (value <= bounds[i]) {
      ++distribution.counts[i];
      break;
    }
  }
  ++distribution.count;
  distribution.sum += value;
}

}  // namespace

void MetricsState::observe_leases(const Engine& engine, const UtilTracker& tracker) {
  for (const auto& [id, lease] : engine.leases()) {
    if (lease.granted_ms > 0 && waited_.insert(id).second) {
      observe(queue_wait, wait_buckets_s(),
              static_cast<double>(std::max<int64_t>(0, lease.granted_ms - lease.created_ms)) / 1000.0);
    }
    if (is_terminal(lease.state) && lease.granted_ms > 0 && ended_.insert(id).second) {
      observe(job_duration, duration_buckets_s(),
              static_cast<double>(std::max<int64_t>(0, lease.ended_ms - lease.granted_ms)) / 1000.0);
      if (const LeaseUtil* util = tracker.find(id); util != nullptr && util->samples > 0) {
        observe(job_util, util_buckets(), util->avg_util());
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
  explicit Writer(std::ostringstream& stream) : stream_(stream) {}
  void family(const std::string& name, const char* type, const std::string& help) {
    stream_ << "# HELP " << name << " " << help << "\n# TYPE " << name << " " << type << "\n";
  }
  void sample(const std::string& name, const std::vector<std::pair<std::string, std::string>>& labels, double value) {
    stream_ << name;
    if (!labels.empty()) {
      stream_ << "{";
      for (size_t i = 0; i < labels.size(); ++i) {
        stream_ << (i ? "," : "") << labels[i].first << "=\"" << prometheus_label(labels[i].second) << "\"";
      }
      stream_ << "}";
    }
    stream_ << " " << num(value) << "\n";
  }
  void histogram(const std::string& name, const std::string& help, const MetricsState::Histogram& distribution,
                 const std::vector<double>& bounds) {
    family(name, "histogram", help);
    uint64_t cum = 0;
    for (size_t i = 0; i < bounds.size(); ++i) {
      cum += i < distribution.counts.size() ? distribution.counts[i] : 0;
      sample(name + "_bucket", {{"le", num(bounds[i])}}, static_cast<double>(cum));
    }
    sample(name + "_bucket", {{"le", "+Inf"}}, static_cast<double>(distribution.count));
    sample(name + "_sum", {}, distribution.sum);
    sample(name + "_count", {}, static_cast<double>(distribution.count));
  }

 private:
  std::ostringstream& stream_;
};

}  // namespace

std::string render_metrics(const Policy& policy, const Engine& engine, const UtilTracker& tracker, MetricsState& state,
                           int64_t now_ms) {
  state.observe_leases(engine, tracker);
  std::ostringstream stream;
  Writer writer(stream);
  const std::string month = month_key(now_ms);

  writer.family("quotad_gpus_total", "gauge", "GPUs in the inventory.");
  writer.sample("quotad_gpus_total", {}, policy.total_gpus());
  writer.family("quotad_emergency_pool_gpus", "gauge", "GPUs reserved for critical leases.");
  writer.sample("quotad_emergency_pool_gpus", {}, policy.emergency_pool_gpus());

  const auto teams = team_views(policy, engine, now_ms);
  auto team_gauge = [&](const std::string& name, const std::string& help, auto value) {
    writer.family(name, "gauge", help);
    for (const auto& team : teams) writer.sample(name, {{"team", team.status.name}}, value(team));
  };
  team_gauge("quotad_team_gpus_in_use", "GPUs a team holds (a shared lease counts its memory share).",
             [](const TeamView& team) { return team.status.in_use; });
  team_gauge("quotad_team_base_gpus", "Guaranteed GPUs of a team.",
             [](const TeamView& team) { return team.status.base; });
  team_gauge("quotad_team_burst_gpus", "GPU limit of a team inside its burst windows.",
             [](const TeamView& team) { return team.status.burst; });
  team_gauge("quotad_team_quota_gpus", "GPU limit in force now (burst inside a window, base outside).",
             [](const TeamView& team) { return team.status.limit_now; });
  team_gauge("quotad_team_in_burst_window", "1 while a burst window of the team is open.",
             [](const TeamView& team) { return team.status.in_burst_window ? 1.0 : 0.0; });
  team_gauge("quotad_team_memory_allocated_gib", "GPU memory held by the team's running leases.",
             [](const TeamView& team) { return team.memory_allocated_gib; });
  team_gauge("quotad_team_memory_used_gib", "GPU memory the team's running leases report using (peak per GPU x GPUs).",
             [](const TeamView& team) { return team.memory_used_gib; });
  team_gauge("quotad_team_active_leases", "Running (granted or revoking) leases of a team.",
             [](const TeamView& team) { return static_cast<double>(team.status.leases_active); });
  team_gauge("quotad_team_queued", "Queued requests of a team.",
             [](const TeamView& team) { return static_cast<double>(team.status.queued); });
  writer.family("quotad_team_gpu_utilization", "gauge",
                "GPU-weighted mean of the latest utilisation (0..1) reported by the team's running leases.");
  for (const auto& team : teams) {
    if (team.gpu_util >= 0) writer.sample("quotad_team_gpu_utilization", {{"team", team.status.name}}, team.gpu_util);
  }
  writer.family("quotad_team_gpu_hours", "gauge",
                "GPU-hours charged to the team's members this month (UTC), running leases included.");
  for (const auto& team : teams) {
    writer.sample("quotad_team_gpu_hours", {{"team", team.status.name}, {"month", month}}, team.gpu_hours_month);
  }

  // queue
  int queued = 0;
  double oldest_wait_s = 0;
  for (const auto& [id, lease] : engine.leases()) {
    if (lease.state != LeaseState::kQueued) continue;
    ++queued;
    oldest_wait_s = std::max(oldest_wait_s, static_cast<double>(now_ms - lease.created_ms) / 1000.0);
  }
  writer.family("quotad_queue_length", "gauge", "Requests waiting in the queue.");
  writer.sample("quotad_queue_length", {}, queued);
  writer.family("quotad_queue_oldest_wait_seconds", "gauge", "How long the longest-waiting queued request has waited.");
  writer.sample("quotad_queue_oldest_wait_seconds", {}, oldest_wait_s);
  writer.family("quotad_queue_wait_seconds_current", "gauge", "Wait so far of each queued request.");
  for (const auto& [id, lease] : engine.leases()) {
    if (lease.state != LeaseState::kQueued) continue;
    writer.sample("quotad_queue_wait_seconds_current",
                  {{"lease", std::to_string(id)}, {"team", lease.req.team}, {"user", lease.req.user}},
                  static_cast<double>(now_ms - lease.created_ms) / 1000.0);
  }
  writer.histogram("quotad_queue_wait_seconds", "Time from request to grant of granted leases.", state.queue_wait,
                   MetricsState::wait_buckets_s());

  // leases
  std::map<std::string, int> by_state;
  for (auto lease_state : {LeaseState::kPendingApproval, LeaseState::kQueued, LeaseState::kGranted,
                           LeaseState::kRevoking, LeaseState::kReleased, LeaseState::kExpired, LeaseState::kRejected}) {
    by_state[to_string(lease_state)] = 0;
  }
  for (const auto& [id, lease] : engine.leases()) ++by_state[to_string(lease.state)];
  writer.family("quotad_leases", "gauge", "Leases in memory by state (ended ones for a day).");
  for (const auto& [state_text, count] : by_state) writer.sample("quotad_leases", {{"state", state_text}}, count);

  writer.family("quotad_lease_gpus", "gauge", "GPUs (or memory share) held by each running lease.");
  for (const auto& [id, lease] : engine.leases()) {
    if (!running(lease)) continue;
    writer.sample(
        "quotad_lease_gpus",
        {{"lease", std::to_string(id)}, {"team", lease.req.team}, {"user", lease.req.user}, {"job", lease.req.job}},
        lease.units(policy));
  }
  writer.family("quotad_lease_runtime_seconds", "gauge", "Time since grant of each running lease.");
  for (const auto& [id, lease] : engine.leases()) {
    if (!running(lease)) continue;
    writer.sample(
        "quotad_lease_runtime_seconds",
        {{"lease", std::to_string(id)}, {"team", lease.req.team}, {"user", lease.req.user}, {"job", lease.req.job}},
        static_cast<double>(now_ms - lease.granted_ms) / 1000.0);
  }
  writer.family("quotad_lease_gpu_utilization", "gauge",
                "Latest GPU utilisation (0..1) reported by each running lease.");
  for (const auto& [id, lease] : engine.leases()) {
    if (!running(lease) || lease.telemetry.gpu_util < 0) continue;
    writer.sample(
        "quotad_lease_gpu_utilization",
        {{"lease", std::to_string(id)}, {"team", lease.req.team}, {"user", lease.req.user}, {"job", lease.req.job}},
        lease.telemetry.gpu_util);
  }
  writer.family("quotad_lease_avg_gpu_utilization", "gauge",
                "Time-weighted mean GPU utilisation of each running lease so far.");
  for (const auto& [id, lease] : engine.leases()) {
    const LeaseUtil* util = tracker.find(id);
    if (!running(lease) || util == nullptr || util->samples == 0) continue;
    writer.sample(
        "quotad_lease_avg_gpu_utilization",
        {{"lease", std::to_string(id)}, {"team", lease.req.team}, {"user", lease.req.user}, {"job", lease.req.job}},
        util->avg_util());
  }
  writer.histogram("quotad_job_duration_seconds", "Time from grant to end of ended leases.", state.job_duration,
                   MetricsState::duration_buckets_s());
  writer.histogram("quotad_job_gpu_utilization", "Mean GPU utilisation (0..1) of ended leases that reported it.",
                   state.job_util, util_buckets());

  // credits
  std::set<std::string> members;
  for (const auto& [key, hours] : engine.usage()) {
    if (key.second == month) members.insert(key.first);
  }
  for (const auto& [id, lease] : engine.leases()) {
    if (running(lease)) members.insert(lease.req.user);
  }
  auto team_of = [&](const std::string& user) {
    auto it = policy.users.find(user);
    return it == policy.users.end() ? std::string() : it->second.team;
  };
  writer.family("quotad_member_gpu_hours", "gauge",
                "GPU-hours charged to a member this month (UTC), running leases included.");
  for (const auto& member : members) {
    writer.sample("quotad_member_gpu_hours", {{"user", member}, {"team", team_of(member)}, {"month", month}},
                  engine.used_gpu_hours(member, month, now_ms));
  }
  writer.family("quotad_member_credit_gpu_hours", "gauge", "GPU-hours a member may use this month (loan included).");
  for (const auto& member : members) {
    writer.sample("quotad_member_credit_gpu_hours", {{"user", member}, {"team", team_of(member)}, {"month", month}},
                  engine.credit_allowance(member, month, now_ms));
  }

  // waste
  const auto waste = waste_list(policy, engine, tracker, now_ms);
  writer.family("quotad_waste_threshold_gpu_utilization", "gauge",
                "Utilisation below which a running lease counts as idle.");
  writer.sample("quotad_waste_threshold_gpu_utilization", {}, policy.waste_gpu_util_below);
  writer.family("quotad_waste_threshold_seconds", "gauge",
                "How long a lease must stay below the threshold to be listed.");
  writer.sample("quotad_waste_threshold_seconds", {}, policy.waste_after_s);
  writer.family("quotad_waste_leases", "gauge", "Running leases on the waste list.");
  writer.sample("quotad_waste_leases", {}, static_cast<double>(waste.size()));
  writer.family("quotad_waste_low_utilization_seconds", "gauge",
                "Waste list: how long each listed lease has stayed below the utilisation threshold.");
  for (const auto& entry : waste) {
    writer.sample(
        "quotad_waste_low_utilization_seconds",
        {{"lease", std::to_string(entry.lease_id)}, {"team", entry.team}, {"user", entry.user}, {"job", entry.job}},
        static_cast<double>(entry.low_ms) / 1000.0);
  }
  writer.family("quotad_waste_gpu_hours", "gauge",
                "Waste list: GPU-hours each listed lease has held below the threshold.");
  for (const auto& entry : waste) {
    writer.sample(
        "quotad_waste_gpu_hours",
        {{"lease", std::to_string(entry.lease_id)}, {"team", entry.team}, {"user", entry.user}, {"job", entry.job}},
        entry.wasted_gpu_hours);
  }

  // service counters
  writer.family("quotad_heartbeats_total", "counter", "Heartbeats answered.");
  writer.sample("quotad_heartbeats_total", {}, static_cast<double>(state.heartbeats));
  writer.family("quotad_preemptions_total", "counter", "Leases revoked for a waiting request.");
  writer.sample("quotad_preemptions_total", {}, static_cast<double>(state.preemptions));
  writer.family("quotad_emergency_grants_total", "counter", "Critical leases granted.");
  writer.sample("quotad_emergency_grants_total", {}, static_cast<double>(state.emergency_grants));
  writer.family("quotad_responses_total", "counter", "API responses by HTTP status.");
  for (const auto& [code, count] : state.responses) {
    if (count > 0) {
      writer.sample("quotad_responses_total", {{"code", std::to_string(code)}}, static_cast<double>(count));
    }
  }
  return stream.str();
}

std::vector<std::string> exported_metric_names() {
  std::vector<std::string> names = {"quotad_gpus_total",
                                    "quotad_emergency_pool_gpus",
                                    "quotad_team_gpus_in_use",
                                    "quotad_team_base_gpus",
                                    "quotad_team_burst_gpus",
                                    "quotad_team_quota_gpus",
                                    "quotad_team_in_burst_window",
                                    "quotad_team_memory_allocated_gib",
                                    "quotad_team_memory_used_gib",
                                    "quotad_team_active_leases",
                                    "quotad_team_queued",
                                    "quotad_team_gpu_utilization",
                                    "quotad_team_gpu_hours",
                                    "quotad_queue_length",
                                    "quotad_queue_oldest_wait_seconds",
                                    "quotad_queue_wait_seconds_current",
                                    "quotad_leases",
                                    "quotad_lease_gpus",
                                    "quotad_lease_runtime_seconds",
                                    "quotad_lease_gpu_utilization",
                                    "quotad_lease_avg_gpu_utilization",
                                    "quotad_member_gpu_hours",
                                    "quotad_member_credit_gpu_hours",
                                    "quotad_waste_threshold_gpu_utilization",
                                    "quotad_waste_threshold_seconds",
                                    "quotad_waste_leases",
                                    "quotad_waste_low_utilization_seconds",
                                    "quotad_waste_gpu_hours",
                                    "quotad_heartbeats_total",
                                    "quotad_preemptions_total",
                                    "quotad_emergency_grants_total",
                                    "quotad_responses_total"};
  for (const char* distribution :
       {"quotad_queue_wait_seconds", "quotad_job_duration_seconds", "quotad_job_gpu_utilization"}) {
    for (const char* suffix : {"_bucket", "_sum", "_count"}) names.push_back(std::string(distribution) + suffix);
  }
  return names;
}

std::string MetricsExporter::text() {
  std::lock_guard<std::mutex> lock(mutex_);
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
