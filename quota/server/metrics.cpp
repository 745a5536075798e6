#include "quota/server/metrics.h"

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <algorithm>
#include <limits>
#include <map>
#include <set>
#include <utility>

namespace yolo8::quota {

namespace {

bool running(const Lease& lease) { return lease.state == LeaseState::kGranted || lease.state == LeaseState::kRevoking; }

const std::vector<double>& util_buckets() {
  static const std::vector<double> buckets = {0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0};
  return buckets;
}

double seconds(int64_t ms) { return static_cast<double>(ms) / 1000.0; }

constexpr double kSecondsPerHour = 3600.0;

// The labels of one lease's series. `job_name`, not `job`: Prometheus owns `job` and `instance` (the scrape
// target) and would rename ours to `exported_job`.
prometheus::Labels lease_labels(int64_t id, const std::string& team, const std::string& user, const std::string& job) {
  return {{"lease", std::to_string(id)}, {"team", team}, {"user", user}, {"job_name", job}};
}

// One scrape: a fresh registry for the gauges and counters of this moment (no stale series of ended leases),
// and the families in the order they were declared, empty ones with their HELP and TYPE.
class Exposition {
 public:
  prometheus::Family<prometheus::Gauge>& gauge(const std::string& name, const std::string& help) {
    order_.push_back({name, help, prometheus::MetricType::Gauge, {}});
    return prometheus::BuildGauge().Name(name).Help(help).Register(registry_);
  }
  void gauge(const std::string& name, const std::string& help, double value) { gauge(name, help).Add({}).Set(value); }
  prometheus::Family<prometheus::Counter>& counter(const std::string& name, const std::string& help) {
    order_.push_back({name, help, prometheus::MetricType::Counter, {}});
    return prometheus::BuildCounter().Name(name).Help(help).Register(registry_);
  }
  // A family kept elsewhere (the histograms), placed here in the order.
  void declare(const std::string& name) { order_.push_back({name, "", prometheus::MetricType::Histogram, {}}); }

  std::string text(const prometheus::Registry& histograms) {
    std::map<std::string, prometheus::MetricFamily> collected;
    for (auto& family : registry_.Collect()) collected[family.name] = std::move(family);
    for (auto& family : histograms.Collect()) collected[family.name] = std::move(family);
    std::vector<prometheus::MetricFamily> families;
    for (auto& declared : order_) {
      auto it = collected.find(declared.name);
      // prometheus-cpp leaves out a family without series; its HELP and TYPE still say what would be there
      families.push_back(it == collected.end() ? std::move(declared) : std::move(it->second));
      auto& series = families.back().metric;
      std::sort(series.begin(), series.end(),
                [](const prometheus::ClientMetric& left, const prometheus::ClientMetric& right) {
                  return left.label < right.label;
                });
    }
    return prometheus::TextSerializer().Serialize(families);
  }

 private:
  prometheus::Registry registry_;
  std::vector<prometheus::MetricFamily> order_;
};

}  // namespace

const std::vector<double>& MetricsState::wait_buckets_s() {
  static const std::vector<double> buckets = {1, 10, 60, 300, 900, 1800, 3600, 4 * 3600, 12 * 3600};
  return buckets;
}

const std::vector<double>& MetricsState::duration_buckets_s() {
  static const std::vector<double> buckets = {60, 600, 1800, 3600, 4 * 3600, 12 * 3600, 24 * 3600, 72 * 3600};
  return buckets;
}

MetricsState::MetricsState() : histograms_(std::make_unique<prometheus::Registry>()) {
  queue_wait_ = &prometheus::BuildHistogram()
                     .Name("quotad_queue_wait_seconds")
                     .Help("Time from request to grant of granted leases.")
                     .Register(*histograms_)
                     .Add({}, wait_buckets_s());
  job_duration_ = &prometheus::BuildHistogram()
                       .Name("quotad_job_duration_seconds")
                       .Help("Time from grant to end of ended leases.")
                       .Register(*histograms_)
                       .Add({}, duration_buckets_s());
  job_util_ = &prometheus::BuildHistogram()
                   .Name("quotad_job_gpu_utilization")
                   .Help("Mean GPU utilisation (0..1) of ended leases that reported it.")
                   .Register(*histograms_)
                   .Add({}, util_buckets());
}

MetricsState::~MetricsState() = default;

void MetricsState::observe_leases(const Engine& engine, const UtilTracker& tracker) {
  for (const auto& [id, lease] : engine.leases()) {
    if (lease.granted_ms > 0 && waited_.insert(id).second) {
      queue_wait_->Observe(seconds(std::max<int64_t>(0, lease.granted_ms - lease.created_ms)));
    }
    if (is_terminal(lease.state) && lease.granted_ms > 0 && ended_.insert(id).second) {
      job_duration_->Observe(seconds(std::max<int64_t>(0, lease.ended_ms - lease.granted_ms)));
      if (const LeaseUtil* util = tracker.find(id); util != nullptr && util->samples > 0) {
        job_util_->Observe(util->avg_util());
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

GpuAllocation gpu_allocation(const Policy& policy, const Engine& engine, int64_t now_ms) {
  GpuAllocation allocation;
  allocation.total = policy.total_gpus();
  // a GPU carrying any lease is held whole (a shared GPU serves no whole lease), counted once; the engine keeps
  // each GPU to one team or the emergency pool, so the teams' GPUs and the emergency ones add up to this
  std::set<int> held, emergency;
  for (const auto& [id, lease] : engine.leases()) {
    if (!lease.holds_gpus(now_ms)) continue;
    held.insert(lease.devices.begin(), lease.devices.end());
    if (lease.emergency) emergency.insert(lease.devices.begin(), lease.devices.end());
  }
  allocation.allocated = static_cast<double>(held.size());
  allocation.emergency = static_cast<double>(emergency.size());
  return allocation;
}

std::string render_metrics(const Policy& policy, const Engine& engine, const UtilTracker& tracker, MetricsState& state,
                           int64_t now_ms) {
  state.observe_leases(engine, tracker);
  Exposition out;
  const std::string month = month_key(now_ms);

  out.gauge("quotad_build_info", "The version of quotad serving these metrics (always 1).")
      .Add({{"version", YOLO8_VERSION}})
      .Set(1);

  // the cluster: allocated + free == total, emergency leases included
  const GpuAllocation allocation = gpu_allocation(policy, engine, now_ms);
  out.gauge("quotad_gpus", "GPUs in the inventory.", allocation.total);
  out.gauge("quotad_gpus_allocated",
            "GPUs held by leases (a GPU carrying shared leases counts whole), emergency leases and expired leases "
            "whose GPUs have not returned yet included.",
            allocation.allocated);
  out.gauge("quotad_gpus_free", "GPUs not held by any lease: quotad_gpus - quotad_gpus_allocated.", allocation.free());
  out.gauge("quotad_emergency_gpus_allocated",
            "GPUs held by emergency (critical) leases, which count against no team; part of quotad_gpus_allocated.",
            allocation.emergency);
  out.gauge("quotad_emergency_pool_gpus", "GPUs reserved for critical leases.", policy.emergency_pool_gpus());
  out.gauge("quotad_heartbeat_interval_seconds", "Heartbeat interval the policy asks of every lease.",
            policy.heartbeat_interval_s);
  out.gauge("quotad_lease_ttl_seconds", "A lease without a heartbeat for this long expires.", policy.ttl_s);

  const auto teams = team_views(policy, engine, now_ms);
  auto team_gauge = [&](const std::string& name, const std::string& help, auto value) {
    auto& family = out.gauge(name, help);
    for (const auto& team : teams) family.Add({{"team", team.status.name}}).Set(value(team));
  };
  team_gauge("quotad_team_gpus_in_use",
             "GPUs a team holds (a GPU carrying its shared leases counts whole), emergency leases not included.",
             [](const TeamView& team) { return team.status.in_use; });
  team_gauge("quotad_team_base_gpus", "Guaranteed GPUs of a team.",
             [](const TeamView& team) { return team.status.base; });
  team_gauge("quotad_team_burst_gpus", "GPU limit of a team inside its burst windows.",
             [](const TeamView& team) { return team.status.burst; });
  team_gauge("quotad_team_quota_gpus", "GPU limit in force now (burst inside a window, base outside).",
             [](const TeamView& team) { return team.status.limit_now; });
  team_gauge("quotad_team_in_burst_window", "1 while a burst window of the team is open.",
             [](const TeamView& team) { return team.status.in_burst_window ? 1.0 : 0.0; });
  team_gauge("quotad_team_memory_allocated_gib",
             "GPU memory held by the team's running leases (whole GPUs their size, shared leases their share plus "
             "the per-process overhead), in GiB.",
             [](const TeamView& team) { return team.memory_allocated_gib; });
  team_gauge("quotad_team_memory_used_gib",
             "GPU memory the team's running leases report using (peak per GPU x GPUs), in GiB.",
             [](const TeamView& team) { return team.memory_used_gib; });
  team_gauge("quotad_team_active_leases", "Running (granted or revoking) leases of a team.",
             [](const TeamView& team) { return static_cast<double>(team.status.leases_active); });
  team_gauge("quotad_team_queued", "Queued requests of a team.",
             [](const TeamView& team) { return static_cast<double>(team.status.queued); });
  {
    auto& family =
        out.gauge("quotad_team_gpu_utilization",
                  "GPU-weighted mean of the latest utilisation (0..1) reported by the team's running leases.");
    for (const auto& team : teams) {
      if (team.gpu_util >= 0) family.Add({{"team", team.status.name}}).Set(team.gpu_util);
    }
  }
  {
    auto& family = out.gauge("quotad_team_gpu_seconds",
                             "GPU-seconds charged to the team's members this month (UTC), running leases included.");
    for (const auto& team : teams) {
      family.Add({{"team", team.status.name}, {"month", month}}).Set(team.gpu_hours_month * kSecondsPerHour);
    }
  }

  // queue
  {
    int queued = 0;
    double oldest_wait_s = 0;
    auto& current = out.gauge("quotad_queue_wait_seconds_current", "Wait so far of each queued request.");
    for (const auto& [id, lease] : engine.leases()) {
      if (lease.state != LeaseState::kQueued) continue;
      ++queued;
      const double wait_s = seconds(now_ms - lease.created_ms);
      oldest_wait_s = std::max(oldest_wait_s, wait_s);
      current.Add({{"lease", std::to_string(id)}, {"team", lease.req.team}, {"user", lease.req.user}}).Set(wait_s);
    }
    out.gauge("quotad_queue_length", "Requests waiting in the queue.", queued);
    out.gauge("quotad_queue_oldest_wait_seconds", "How long the longest-waiting queued request has waited.",
              oldest_wait_s);
  }
  out.declare("quotad_queue_wait_seconds");

  // leases
  {
    auto& family = out.gauge("quotad_leases", "Leases in memory by state (ended ones for a day).");
    for (auto lease_state :
         {LeaseState::kPendingApproval, LeaseState::kQueued, LeaseState::kGranted, LeaseState::kRevoking,
          LeaseState::kReleased, LeaseState::kExpired, LeaseState::kRejected}) {
      family.Add({{"state", to_string(lease_state)}});
    }
    for (const auto& [id, lease] : engine.leases()) family.Add({{"state", to_string(lease.state)}}).Increment();
  }
  auto& lease_gpus = out.gauge("quotad_lease_gpus", "GPUs (or memory share) held by each running lease.");
  auto& lease_runtime = out.gauge("quotad_lease_runtime_seconds", "Time since grant of each running lease.");
  auto& lease_util = out.gauge("quotad_lease_gpu_utilization",
                               "Latest GPU utilisation (0..1) reported by each running lease; source: nvml (the "
                               "devices' own figure), busy_time (share of time in training steps) or unknown.");
  auto& lease_avg_util =
      out.gauge("quotad_lease_avg_gpu_utilization", "Time-weighted mean GPU utilisation of each running lease so far.");
  auto& heartbeat_age = out.gauge("quotad_lease_heartbeat_age_seconds",
                                  "Time since the last heartbeat (or the grant) of each running lease.");
  auto& review_pending =
      out.gauge("quotad_emergency_review_pending_seconds",
                "Time since grant of each emergency lease whose after-the-fact review is still open (kept in "
                "memory until reviewed, however long ago they ended).");
  for (const auto& [id, lease] : engine.leases()) {
    const auto labels = lease_labels(id, lease.req.team, lease.req.user, lease.req.job);
    if (lease.emergency && lease.review_pending && lease.granted_ms > 0) {
      review_pending.Add(labels).Set(seconds(now_ms - lease.granted_ms));
    }
    if (!running(lease)) continue;
    lease_gpus.Add(labels).Set(lease.units(policy));
    lease_runtime.Add(labels).Set(seconds(now_ms - lease.granted_ms));
    heartbeat_age.Add(labels).Set(seconds(now_ms - std::max(lease.last_seen_ms, lease.granted_ms)));
    if (lease.telemetry.gpu_util >= 0) {
      prometheus::Labels with_source = labels;
      with_source["source"] = lease.telemetry.gpu_util_source.empty() ? "unknown" : lease.telemetry.gpu_util_source;
      lease_util.Add(with_source).Set(lease.telemetry.gpu_util);
    }
    if (const LeaseUtil* util = tracker.find(id); util != nullptr && util->samples > 0) {
      lease_avg_util.Add(labels).Set(util->avg_util());
    }
  }
  out.declare("quotad_job_duration_seconds");
  out.declare("quotad_job_gpu_utilization");

  // credits
  {
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
    auto& used = out.gauge("quotad_member_gpu_seconds",
                           "GPU-seconds charged to a member this month (UTC), running leases included.");
    auto& allowance =
        out.gauge("quotad_member_credit_gpu_seconds", "GPU-seconds a member may use this month (loan included).");
    for (const auto& member : members) {
      const prometheus::Labels labels = {{"user", member}, {"team", team_of(member)}, {"month", month}};
      used.Add(labels).Set(engine.used_gpu_hours(member, month, now_ms) * kSecondsPerHour);
      allowance.Add(labels).Set(engine.credit_allowance(member, month, now_ms) * kSecondsPerHour);
    }
  }

  // waste
  {
    const auto waste = waste_list(policy, engine, tracker, now_ms);
    out.gauge("quotad_waste_threshold_gpu_utilization", "Utilisation below which a running lease counts as idle.",
              policy.waste_gpu_util_below);
    out.gauge("quotad_waste_threshold_seconds", "How long a lease must stay below the threshold to be listed.",
              policy.waste_after_s);
    out.gauge("quotad_waste_leases", "Running leases on the waste list.", static_cast<double>(waste.size()));
    auto& low = out.gauge("quotad_waste_low_utilization_seconds",
                          "Waste list: how long each listed lease has stayed below the utilisation threshold.");
    auto& wasted = out.gauge("quotad_waste_gpu_seconds",
                             "Waste list: GPU-seconds each listed lease has held below the threshold.");
    for (const auto& entry : waste) {
      const auto labels = lease_labels(entry.lease_id, entry.team, entry.user, entry.job);
      low.Add(labels).Set(seconds(entry.low_ms));
      wasted.Add(labels).Set(entry.wasted_gpu_hours * kSecondsPerHour);
    }
  }

  // service counters (monotonic since quotad started)
  const ServiceCounters& counters = state.counters;
  out.counter("quotad_heartbeats_total", "Heartbeats answered.")
      .Add({})
      .Increment(static_cast<double>(counters.heartbeats));
  out.counter("quotad_preemptions_total", "Leases revoked for a waiting request.")
      .Add({})
      .Increment(static_cast<double>(counters.preemptions));
  out.counter("quotad_emergency_grants_total", "Critical leases granted.")
      .Add({})
      .Increment(static_cast<double>(counters.emergency_grants));
  out.counter("quotad_storage_write_errors_total", "SQLite writes that failed (state changes or heartbeat batches).")
      .Add({})
      .Increment(static_cast<double>(counters.storage_write_errors));
  // the audit log's hash chain: a copy of these series outside quotad (Prometheus) shows a rewritten log's history
  if (const size_t space = counters.audit_chain_head.find(' '); space != std::string::npos) {
    out.gauge("quotad_audit_chain_head_seq", "Sequence number of the last audit entry in the hash chain.",
              std::stod(counters.audit_chain_head.substr(0, space)));
    out.gauge("quotad_audit_chain_info",
              "The audit chain's head (SHA-256 link of the last entry) as a label; always 1.")
        .Add({{"head", counters.audit_chain_head.substr(space + 1)}})
        .Set(1);
  }
  {
    auto& family = out.counter("quotad_responses_total", "API responses by HTTP status.");
    for (const auto& [code, count] : counters.responses) {
      if (count > 0) family.Add({{"code", std::to_string(code)}}).Increment(static_cast<double>(count));
    }
  }

  // operations: backups, reloads, the certificate
  const OperationsFigures& ops = state.operations;
  {
    auto& interval = out.gauge("quotad_backup_interval_seconds",
                               "Seconds between online backups of the database (--backup-every); absent when off.");
    auto& age = out.gauge("quotad_backup_age_seconds",
                          "Age of the newest online backup beside the database (from its name); +Inf when there is "
                          "none; absent when backups are off.");
    if (ops.backup_interval_ms > 0) {
      interval.Add({}).Set(seconds(ops.backup_interval_ms));
      age.Add({}).Set(ops.newest_backup_ms < 0 ? std::numeric_limits<double>::infinity()
                                               : std::max(0.0, seconds(now_ms - ops.newest_backup_ms)));
    }
  }
  {
    auto& applied = out.counter("quotad_reloads_total", "Reloads of a watched file (SIGHUP or a change) applied.");
    for (const auto& [file, count] : ops.reloads) {
      applied.Add({{"file", file}}).Increment(static_cast<double>(count));
    }
    auto& failed = out.counter("quotad_reload_failures_total",
                               "Reloads of a watched file refused (invalid), the running version kept.");
    for (const auto& [file, count] : ops.reload_failures) {
      failed.Add({{"file", file}}).Increment(static_cast<double>(count));
    }
  }
  {
    auto& expiry = out.gauge("quotad_tls_certificate_expiry_timestamp_seconds",
                             "notAfter of the TLS certificate quotad serves (Unix seconds); absent over plain HTTP.");
    if (ops.certificate_not_after_ms >= 0) expiry.Add({}).Set(seconds(ops.certificate_not_after_ms));
  }
  return out.text(state.histograms());
}

std::vector<std::string> exported_metric_names() {
  std::vector<std::string> names = {"quotad_build_info",
                                    "quotad_gpus",
                                    "quotad_gpus_allocated",
                                    "quotad_gpus_free",
                                    "quotad_emergency_gpus_allocated",
                                    "quotad_emergency_pool_gpus",
                                    "quotad_heartbeat_interval_seconds",
                                    "quotad_lease_ttl_seconds",
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
                                    "quotad_team_gpu_seconds",
                                    "quotad_queue_wait_seconds_current",
                                    "quotad_queue_length",
                                    "quotad_queue_oldest_wait_seconds",
                                    "quotad_leases",
                                    "quotad_lease_gpus",
                                    "quotad_lease_runtime_seconds",
                                    "quotad_lease_gpu_utilization",
                                    "quotad_lease_avg_gpu_utilization",
                                    "quotad_lease_heartbeat_age_seconds",
                                    "quotad_emergency_review_pending_seconds",
                                    "quotad_member_gpu_seconds",
                                    "quotad_member_credit_gpu_seconds",
                                    "quotad_waste_threshold_gpu_utilization",
                                    "quotad_waste_threshold_seconds",
                                    "quotad_waste_leases",
                                    "quotad_waste_low_utilization_seconds",
                                    "quotad_waste_gpu_seconds",
                                    "quotad_heartbeats_total",
                                    "quotad_preemptions_total",
                                    "quotad_emergency_grants_total",
                                    "quotad_storage_write_errors_total",
                                    "quotad_responses_total",
                                    "quotad_audit_chain_head_seq",
                                    "quotad_audit_chain_info",
                                    "quotad_backup_interval_seconds",
                                    "quotad_backup_age_seconds",
                                    "quotad_reloads_total",
                                    "quotad_reload_failures_total",
                                    "quotad_tls_certificate_expiry_timestamp_seconds"};
  for (const char* distribution :
       {"quotad_queue_wait_seconds", "quotad_job_duration_seconds", "quotad_job_gpu_utilization"}) {
    for (const char* suffix : {"_bucket", "_sum", "_count"}) names.push_back(std::string(distribution) + suffix);
  }
  return names;
}

std::string MetricsExporter::text() {
  std::lock_guard<std::mutex> lock(mutex_);
  std::string text;
  if (operations_) state_.operations = operations_();
  service_.observe([&](const ServiceView& view) {
    state_.counters = view.counters;
    text = render_metrics(view.policy, view.engine, view.tracker, state_, view.now_ms);
  });
  return text;
}

}  // namespace yolo8::quota
