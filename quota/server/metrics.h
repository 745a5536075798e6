#pragma once
// The Prometheus exposition of quotad, built with prometheus-cpp's core (registry, metric families and its text
// serializer); quotad's own HTTP server serves the text at /metrics.
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "quota/core/engine.h"
#include "quota/core/usage.h"
#include "quota/service/service.h"

namespace prometheus {
class Registry;
class Histogram;
}  // namespace prometheus

namespace yolo8::quota {

// How quotad itself is kept, beyond the engine: its online backups, the files it reloads and its TLS
// certificate. Read by the server at each scrape (quotad_main.cpp fills it); the defaults export nothing.
struct OperationsFigures {
  int64_t backup_interval_ms = 0;  // --backup-every; 0: backups off, no backup series
  int64_t newest_backup_ms = -1;   // when the newest backup beside the database was taken; -1: none
  // Reloads (SIGHUP or a changed file) by file kind ("policy", "tokens", "tls"): applied, and refused with the
  // running version kept. Every kind quotad watches is listed, at 0 until it happens.
  std::map<std::string, uint64_t> reloads;
  std::map<std::string, uint64_t> reload_failures;
  int64_t certificate_not_after_ms = -1;  // the served certificate's notAfter; -1: plain HTTP
};

// What lives between scrapes: the histograms (each lease observed once: its queue wait when granted, its
// duration and mean utilisation when it ended) and the service's monotonic counters of the latest scrape.
class MetricsState {
 public:
  MetricsState();
  ~MetricsState();
  MetricsState(const MetricsState&) = delete;
  MetricsState& operator=(const MetricsState&) = delete;

  static const std::vector<double>& wait_buckets_s();
  static const std::vector<double>& duration_buckets_s();
  void observe_leases(const Engine& engine, const UtilTracker& tracker);
  const prometheus::Registry& histograms() const { return *histograms_; }

  ServiceCounters counters;
  OperationsFigures operations;

 private:
  std::unique_ptr<prometheus::Registry> histograms_;
  prometheus::Histogram* queue_wait_ = nullptr;    // seconds from request to grant
  prometheus::Histogram* job_duration_ = nullptr;  // seconds from grant to end
  prometheus::Histogram* job_util_ = nullptr;      // mean utilisation of ended jobs (0..1)
  std::set<int64_t> waited_;
  std::set<int64_t> ended_;
};

// GPUs held right now, emergency leases and expired leases whose GPUs have not returned yet included; a shared
// lease counts its memory share. allocated + free == total.
struct GpuAllocation {
  double total = 0;
  double allocated = 0;
  double emergency = 0;  // the part of `allocated` held by emergency (critical) leases
  double free() const { return total - allocated; }
};
GpuAllocation gpu_allocation(const Policy& policy, const Engine& engine, int64_t now_ms);

// Prometheus text exposition (version 0.0.4): every family with HELP and TYPE, names prefixed `quotad_`, series
// of a family sorted by their labels (the same state always gives the same bytes).
std::string render_metrics(const Policy& policy, const Engine& engine, const UtilTracker& tracker, MetricsState& state,
                           int64_t now_ms);

// /metrics of a running service: keeps the histograms between scrapes (each lease is counted once).
class MetricsExporter {
 public:
  // `operations`: read at each scrape (backups, reloads, the certificate); empty: none exported.
  explicit MetricsExporter(QuotaService& service, std::function<OperationsFigures()> operations = {})
      : service_(service), operations_(std::move(operations)) {}
  std::string text();

 private:
  QuotaService& service_;
  std::function<OperationsFigures()> operations_;
  std::mutex mutex_;
  MetricsState state_;
};

// The series names render_metrics can export (histograms as their _bucket, _sum and _count series).
std::vector<std::string> exported_metric_names();

}  // namespace yolo8::quota
