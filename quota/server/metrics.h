#pragma once
// The Prometheus exposition of quotad: counters and histograms kept between scrapes, and the text format.
#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "quota/core/engine.h"
#include "quota/core/usage.h"
#include "quota/service/service.h"

namespace yolo8::quota {

// Monotonic counters and histograms owned by the service; `observe_leases` feeds histograms from lease
// records once each (queue waits when granted, durations when ended).
class MetricsState {
 public:
  static const std::vector<double>& wait_buckets_s();
  static const std::vector<double>& duration_buckets_s();
  void observe_leases(const Engine& engine, const UtilTracker& tracker);

  uint64_t heartbeats = 0;
  uint64_t preemptions = 0;
  uint64_t emergency_grants = 0;
  std::map<int, uint64_t> responses;  // by HTTP status

  struct Histogram {
    std::vector<uint64_t> counts;  // per bucket (cumulative when written)
    uint64_t count = 0;
    double sum = 0;
  };
  Histogram queue_wait;    // seconds from request to grant
  Histogram job_duration;  // seconds from grant to end
  Histogram job_util;      // average utilisation of ended jobs (buckets 0.1 .. 1)

 private:
  std::set<int64_t> waited_;
  std::set<int64_t> ended_;
};

// Prometheus text exposition (version 0.0.4), every family with HELP and TYPE, names prefixed `quotad_`.
std::string render_metrics(const Policy& policy, const Engine& engine, const UtilTracker& tracker, MetricsState& state,
                           int64_t now_ms);
// /metrics of a running service: keeps the histograms between scrapes (each lease is counted once).
class MetricsExporter {
 public:
  explicit MetricsExporter(QuotaService& service) : service_(service) {}
  std::string text();

 private:
  QuotaService& service_;
  std::mutex mutex_;
  MetricsState state_;
};

// The metric family names render_metrics exports (dashboard tests check queries against them).
std::vector<std::string> exported_metric_names();

// "a\"b" style escaping for label values.
std::string prometheus_label(const std::string& value);

}  // namespace yolo8::quota
